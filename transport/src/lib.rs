//! The tensor transport ladder between the client library and an agent.
//!
//! Planned (transport issue): a `Transport` trait moving a request's input
//! tensors to an agent and its outputs back, and the ladder that picks per
//! peer the best path both ends advertise — same-host shared memory (Triton's
//! `shared_memory_region` convention, or a sealed memfd for our own client),
//! RDMA, QUIC — with plain gRPC inline (`raw_input_contents`) as the path that
//! always works. A failing path is marked broken for that peer and the same
//! request is re-sent on the next path down.
#![forbid(unsafe_code)]
