//! Wire types for infermesh.
//!
//! - [`inference`]: the Open Inference Protocol (KServe v2) gRPC service as
//!   served by NVIDIA Triton — `inference.GRPCInferenceService` — generated
//!   from the project's own `.proto` files, wire-compatible with Triton's
//!   published `grpc_service.proto` (same package, RPCs, messages and field
//!   numbers). Workers and agents speak it; any OIP client can call an agent.
//! - [`admin`]: the project's `infermesh.v1` package: the administration
//!   service and the RDMA control-path service, which [`rdma`] re-exports
//!   with the `ModelInfer` parameters of the RDMA rung.
//! - [`tensor`]: datatypes and request validation shared by everything that
//!   accepts `ModelInfer` (the agent front and the test worker).
//! - [`load`]: the load report an agent attaches to every response's trailers.
//! - [`registry`]: the `NodeRecord` agents advertise in ZooKeeper and the
//!   registry URL (`zk://...`, `static://...`).
//! - [`channel`]: the one way infermesh opens an OIP client (TLS from
//!   `infermesh-tls`).
//! - [`quic`]: the QUIC rung's frames (one stream per `ModelInfer`).
//!
//! Protos are compiled by the pure-Rust `protox` (no `protoc` anywhere);
//! tensor payloads (`raw_input_contents`, `raw_output_contents`) are
//! `bytes::Bytes`, so forwarding them does not copy.
#![forbid(unsafe_code)]

pub mod causes;
pub mod channel;
pub mod load;
pub mod quic;
pub mod rdma;
pub mod registry;
pub mod tensor;

/// The Open Inference Protocol (`inference` package).
#[allow(clippy::all, missing_docs)]
pub mod inference {
    tonic::include_proto!("inference");
}

/// The project's `infermesh.v1` package: the administration service and
/// the RDMA control path (see [`rdma`]).
#[allow(clippy::all, missing_docs)]
pub mod admin {
    tonic::include_proto!("infermesh.v1");
}

pub use channel::oip_client;
pub use inference::grpc_inference_service_client::GrpcInferenceServiceClient;
pub use inference::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};

/// The HTTP/2 path of `ModelInfer`, the call the agent passes through.
pub const MODEL_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelInfer";

/// Largest gRPC message infermesh accepts or sends by default: 64 MiB, so
/// 16 MiB tensors fit with room (tonic's own default is 4 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Name of the request parameter that triggers a fault in a test worker.
pub const FAULT_PARAMETER: &str = "infermesh_fault";
