//! The RDMA path for tensors between hosts.
//!
//! Planned (transport issue): a narrow verbs trait with the real
//! implementation (probed at run time; a host without a verbs device logs one
//! line and does not advertise the path) and a software emulation with the
//! same semantics, so the protocol — queue-pair setup over the gRPC control
//! path, inputs pulled with one-sided RDMA READ, outputs pushed with RDMA
//! WRITE, memory-registration cache — is tested on machines without a NIC.
//! With `gpu`, this is the crate where `unsafe` and native loading live.
