//! A tower layer that appends the node's load report to every gRPC response
//! of the OIP port: into the trailers of a normal response, or into the
//! headers of a "trailers-only" error response. The report is taken when the
//! response ends, so it reflects the load after this request.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

use crate::pool::Pool;

/// Adds [`LoadReport`](infermesh_proto::load::LoadReport) metadata to responses.
#[derive(Clone)]
pub struct LoadReportLayer {
    pool: Arc<Pool>,
}

impl LoadReportLayer {
    /// Reports the load of `pool`.
    pub fn new(pool: Arc<Pool>) -> Self {
        Self { pool }
    }
}

impl<S> Layer<S> for LoadReportLayer {
    type Service = LoadReportService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LoadReportService {
            inner,
            pool: Arc::clone(&self.pool),
        }
    }
}

/// See [`LoadReportLayer`].
#[derive(Clone)]
pub struct LoadReportService<S> {
    inner: S,
    pool: Arc<Pool>,
}

fn add_report(pool: &Pool, map: &mut HeaderMap) {
    for (key, value) in pool.load().entries() {
        if let Ok(v) = HeaderValue::from_str(&value) {
            map.insert(HeaderName::from_static(key), v);
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for LoadReportService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body,
{
    type Response = Response<ReportBody<ResBody>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let fut = self.inner.call(req);
        let pool = Arc::clone(&self.pool);
        Box::pin(async move {
            let mut resp = fut.await?;
            // Trailers-only response: the status is in the headers.
            if resp.headers().contains_key("grpc-status") {
                add_report(&pool, resp.headers_mut());
                return Ok(resp.map(|body| ReportBody {
                    inner: body,
                    pool: None,
                }));
            }
            Ok(resp.map(|body| ReportBody {
                inner: body,
                pool: Some(pool),
            }))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that adds the load report to its trailers.
    pub struct ReportBody<B> {
        #[pin]
        inner: B,
        pool: Option<Arc<Pool>>,
    }
}

impl<B: Body> Body for ReportBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        Poll::Ready(frame.map(|f| {
            f.map(|frame| match frame.into_trailers() {
                Ok(mut trailers) => {
                    if let Some(pool) = this.pool.as_ref() {
                        add_report(pool, &mut trailers);
                    }
                    Frame::trailers(trailers)
                }
                Err(frame) => frame,
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
