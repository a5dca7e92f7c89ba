//! The client ports: the accept loop ([`accept`]), the OIP port's own
//! HTTP/2 server ([`server`]), the pass-through of plain `ModelInfer`
//! ([`forward`], [`request_view`]), the tonic service for every other call
//! ([`front`], with `ModelStreamInfer`), the one response body and the load
//! report it ends with ([`front_body`], [`load_report`]), what a worker's
//! error means ([`worker_status`]), gRPC framing ([`grpc`]), deadlines
//! ([`deadline`]), `grpc.health.v1` ([`grpc_health`]), KServe HTTP
//! ([`http`]) and the QUIC rung ([`quic`]).

pub mod accept;
pub mod deadline;
pub mod forward;
pub mod front;
pub mod front_body;
pub mod grpc;
pub mod grpc_health;
pub mod http;
pub mod load_report;
pub mod quic;
mod request_view;
pub mod server;
pub mod worker_status;
