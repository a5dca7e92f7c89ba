//! A request staged in shared memory, and the region the peer must know
//! first.
//!
//! Moving bytes is a copy into memory the peer can reach; the gRPC call
//! itself stays with the caller. So staging is small and synchronous:
//!
//! 1. [`ShmTransport::stage`](crate::ShmTransport::stage) moves the inline
//!    inputs into a region and rewrites the request to reference them. The
//!    returned [`Staged`] holds what the request borrowed (the lease) and may
//!    ask for a one-time registration with the peer first
//!    ([`Staged::needs_register`]); the caller performs that RPC and calls
//!    [`Staged::mark_registered`].
//! 2. The caller sends the request.
//! 3. [`ShmTransport::complete`](crate::ShmTransport::complete) brings the
//!    outputs the peer placed in the region back, so callers always see a
//!    plain response.
//!
//! If the path fails, [`Staged::unstage`] restores the request as it was, to
//! be re-sent on the next path down (see [`Ladder`](crate::Ladder)). The
//! rungs that send requests — the one `Transport` trait — are the client's
//! (`infermesh_client::paths`).

use std::any::Any;
use std::fmt;

use infermesh_proto::inference::{ModelInferRequest, SystemSharedMemoryRegisterRequest};

/// A region the peer must know before the staged request is sent.
pub struct Registration {
    /// Region name, as requests will reference it.
    pub name: String,
    /// Shared-memory key.
    pub key: String,
    /// Start of the registered window in the object.
    pub offset: u64,
    /// Bytes in the window.
    pub byte_size: u64,
    on_registered: Box<dyn FnOnce() + Send>,
}

impl Registration {
    /// A registration; `on_registered` runs when the caller reports the
    /// peer accepted it.
    pub fn new(
        name: String,
        key: String,
        offset: u64,
        byte_size: u64,
        on_registered: impl FnOnce() + Send + 'static,
    ) -> Self {
        Self {
            name,
            key,
            offset,
            byte_size,
            on_registered: Box::new(on_registered),
        }
    }

    /// The `SystemSharedMemoryRegister` request to send.
    pub fn to_request(&self) -> SystemSharedMemoryRegisterRequest {
        SystemSharedMemoryRegisterRequest {
            name: self.name.clone(),
            key: self.key.clone(),
            offset: self.offset,
            byte_size: self.byte_size,
        }
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("offset", &self.offset)
            .field("byte_size", &self.byte_size)
            .finish_non_exhaustive()
    }
}

/// A request staged on a path: what it borrowed, what must happen before it
/// is sent, and how to undo it.
pub struct Staged {
    registration: Option<Registration>,
    /// The request before staging; `None` when staging left it untouched.
    original: Option<Box<ModelInferRequest>>,
    /// The transport's own state (leases, output windows).
    state: Option<Box<dyn Any + Send>>,
}

impl Staged {
    /// Nothing was moved: the request goes as it is.
    pub fn untouched() -> Self {
        Self {
            registration: None,
            original: None,
            state: None,
        }
    }

    /// The request was rewritten from `original`; `state` is the
    /// transport's, for [`complete`](crate::ShmTransport::complete).
    pub fn rewritten(original: ModelInferRequest, state: Box<dyn Any + Send>) -> Self {
        Self {
            registration: None,
            original: Some(Box::new(original)),
            state: Some(state),
        }
    }

    /// Asks the caller to register `registration` with the peer first.
    pub fn with_registration(mut self, registration: Registration) -> Self {
        self.registration = Some(registration);
        self
    }

    /// Whether staging rewrote the request (else it goes inline as it was).
    pub fn is_rewritten(&self) -> bool {
        self.original.is_some()
    }

    /// A registration the caller must perform before sending, if any.
    pub fn needs_register(&self) -> Option<&Registration> {
        self.registration.as_ref()
    }

    /// Reports that the peer accepted [`needs_register`](Staged::needs_register)
    /// (an `ALREADY_EXISTS` reply counts as accepted), so later requests
    /// reuse the registration.
    pub fn mark_registered(&mut self) {
        if let Some(r) = self.registration.take() {
            (r.on_registered)();
        }
    }

    /// Restores `req` to what it was before staging and releases the
    /// resources, to re-send it on another path.
    pub fn unstage(self, req: &mut ModelInferRequest) {
        if let Some(original) = self.original {
            *req = *original;
        }
    }

    /// The transport's state, if it is a `T`.
    pub fn into_state<T: Any>(self) -> Option<Box<T>> {
        self.state?.downcast().ok()
    }
}

impl fmt::Debug for Staged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staged")
            .field("registration", &self.registration)
            .field("rewritten", &self.original.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn registration_callback_runs_once_and_unstage_restores() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let original = ModelInferRequest {
            id: "before".into(),
            ..Default::default()
        };
        let mut staged = Staged::rewritten(original.clone(), Box::new(5u32)).with_registration(
            Registration::new("n".into(), "/n".into(), 0, 64, move || {
                flag.store(true, Ordering::SeqCst)
            }),
        );
        let r = staged.needs_register().unwrap().to_request();
        assert_eq!(
            (r.name.as_str(), r.key.as_str(), r.byte_size),
            ("n", "/n", 64)
        );
        staged.mark_registered();
        assert!(done.load(Ordering::SeqCst));
        assert!(staged.needs_register().is_none());
        let mut req = ModelInferRequest {
            id: "after".into(),
            ..Default::default()
        };
        staged.unstage(&mut req);
        assert_eq!(req, original);
    }
}
