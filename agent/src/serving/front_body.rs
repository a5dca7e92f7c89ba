//! [`FrontBody`]: the one response body type of the OIP port — nothing, one
//! message, a worker's answer passed through, or a tonic service's body —
//! each ending with the load report ([`crate::serving::load_report`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::dispatch::pool::Pool;
use crate::serving::forward::body::ForwardBody;
use crate::serving::load_report::add_report;

/// A response body of the OIP port.
#[derive(Default)]
pub enum FrontBody {
    /// No body (trailers-only responses).
    #[default]
    Empty,
    /// One encoded message, then trailers.
    Message {
        /// The gRPC frame, taken when sent.
        data: Option<Bytes>,
        /// Trailers, taken when sent.
        trailers: Option<HeaderMap>,
    },
    /// A worker's response passed through ([`crate::serving::forward`]).
    Forward(ForwardBody),
    /// A response of a tonic service, with the load report added to its
    /// trailers.
    Tonic {
        /// The service's body.
        inner: tonic::body::Body,
        /// Whose load to report.
        pool: Arc<Pool>,
    },
}

impl Body for FrontBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            FrontBody::Empty => Poll::Ready(None),
            FrontBody::Message { data, trailers } => Poll::Ready(match data.take() {
                Some(d) => Some(Ok(Frame::data(d))),
                None => trailers.take().map(|t| Ok(Frame::trailers(t))),
            }),
            FrontBody::Forward(f) => Pin::new(f).poll_frame(cx),
            FrontBody::Tonic { inner, pool } => {
                let frame = ready!(Pin::new(inner).poll_frame(cx));
                Poll::Ready(frame.map(|f| {
                    f.map(|frame| match frame.into_trailers() {
                        Ok(mut trailers) => {
                            add_report(pool, &mut trailers);
                            Frame::trailers(trailers)
                        }
                        Err(frame) => frame,
                    })
                }))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            FrontBody::Empty => true,
            FrontBody::Message { data, trailers } => data.is_none() && trailers.is_none(),
            FrontBody::Forward(f) => f.is_end_stream(),
            FrontBody::Tonic { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            FrontBody::Empty => SizeHint::with_exact(0),
            FrontBody::Message { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            FrontBody::Forward(_) => SizeHint::default(),
            FrontBody::Tonic { inner, .. } => inner.size_hint(),
        }
    }
}
