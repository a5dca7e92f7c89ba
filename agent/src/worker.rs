//! One worker as the rest of the agent sees it, and how the agent talks
//! to it: the snapshot its supervisor publishes ([`state`]), the messages
//! that reach the supervisor ([`inbox`]), what the supervisor remembers
//! ([`worker_log`]), the HTTP/2 client to the worker's process
//! ([`upstream`]), the concurrency the worker is learned to take
//! ([`concurrency`], sans-IO), and which worker a pid belongs to
//! ([`procfs`]).

pub mod concurrency;
pub mod inbox;
pub mod procfs;
pub mod state;
pub mod upstream;
pub mod worker_log;
