//! Tensors that do not travel inline: Triton's system shared memory
//! ([`shm`]) and the RDMA rung ([`rdma`]), both owned by the client
//! connection that registered them ([`conn`]).

pub mod conn;
pub mod rdma;
pub mod shm;
