//! The RDMA path of the tensor transport ladder: bulk tensor bytes move by
//! one-sided RDMA READ and WRITE between registered memory of a client and
//! an agent, while requests and completion travel on the gRPC control path.
//!
//! # Protocol (one inference request)
//!
//! 1. Once per agent, the client calls [`RdmaEngine::connect`]: it creates a
//!    queue pair and sends its [`EndpointInfo`] ([`EndpointInfo::encode`])
//!    to the agent over gRPC; the agent answers with the info of a queue
//!    pair from [`RdmaEngine::accept`]; both sides move their QP to RTS.
//! 2. The client takes registered buffers from its [`RdmaEngine::register`]
//!    cache: inputs with [`Access::RemoteRead`] (filled by the client),
//!    outputs with [`Access::RemoteWrite`]. It puts their descriptors
//!    ([`RemoteBuffer::to_param_string`], `addr:len:rkey` in hex) and the
//!    agent's QPN in the OIP request parameters and sends the request.
//! 3. The agent finds the connection ([`RdmaEngine::connection`] by QPN),
//!    pulls each input with [`Connection::read`], runs the model, pushes
//!    each output with [`Connection::write`] and, once the WRITEs have
//!    completed, answers the gRPC request. That response is the client's
//!    signal that the outputs are in place; until then the client does not
//!    touch its buffers.
//!
//! Any [`RdmaError`] means the request goes down the ladder (gRPC inline).
//! Zero-length transfers complete locally without posting a work request:
//! the InfiniBand spec lets an HCA skip the rkey check for zero-length
//! operations, so posting them would prove nothing.
//!
//! # Trust model
//!
//! An rkey is a capability: a peer that holds a descriptor and a connection
//! can access that range within the access it was registered with — inputs
//! are readable, outputs writable, nothing else. The agent only touches
//! buffers whose descriptors the client sent in the request; the peer's HCA
//! (or the emulated responder) enforces the rkey, bounds and access. Pooled
//! buffers stay registered after use, so a peer that saw a descriptor keeps
//! access until eviction; [`Registered::deregister`] revokes at once.
//!
//! # Backends
//!
//! The engine is written against the narrow traits in [`verbs`]:
//!
//! - **verbs** ([`RdmaEngine::probe`]): a real device through `sideway`,
//!   which `dlopen`s `libibverbs` at run time. Always compiled; a host
//!   without rdma-core or without a device logs one line and gets `None`.
//! - **emulated** ([`RdmaEngine::emulated`]): the same semantics over
//!   loopback TCP, with [`EmulatedFaults`] to break or stall the link.
//!
//! `unsafe` is confined to one small module (`hw::raw`: registering memory
//! and pointing a work request at it); the rest of the crate denies it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod connection;
mod emulated;
mod endpoint;
mod engine;
mod error;
mod hw;
mod memory;
mod mr_cache;
mod remote;
pub mod verbs;

pub use connection::Connection;
pub use emulated::{EmulatedDevice, EmulatedFaults};
pub use endpoint::{EmulatedQpInfo, EndpointInfo, QpInfo};
pub use engine::{RdmaConfig, RdmaEngine};
pub use error::RdmaError;
pub use hw::SidewayDevice;
pub use memory::{Access, RegionMemory, RegionMut, RegionRef};
pub use mr_cache::{MIN_CLASS, MrCache, MrStats, Registered};
pub use remote::RemoteBuffer;
