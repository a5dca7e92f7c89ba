//! A request whose body goes to the worker as it arrives (cut-through
//! forwarding, docs/DECISIONS.md): the stream is opened with the body's
//! first chunks and left open, later chunks are appended to its send
//! queue, and a stream the worker refuses unprocessed is opened again with
//! every chunk so far.

use bytes::Bytes;

use super::{Exchange, Failure, MAX_REFUSED, Metadata, ResponseHead, Upstream, UpstreamError};

/// A request whose body is sent as it arrives ([`Upstream::upload`]).
/// Dropping it before [`Upload::answer`] resets the stream.
#[derive(Debug)]
pub struct Upload<'a> {
    pub(super) upstream: &'a Upstream,
    pub(super) meta: Metadata<'a>,
    pub(super) exchange: Exchange,
    /// Streams opened for this request.
    pub(super) tries: u32,
    /// The last chunk was pushed.
    pub(super) ended: bool,
}

impl Upload<'_> {
    /// Sends `kept`'s last chunk (`kept`: every chunk of the body so far, the
    /// first ones given to [`Upstream::upload`] included); `last` ends the
    /// body. A stream the worker refused is opened again with all of `kept`.
    pub async fn push(&mut self, kept: &[Bytes], last: bool) -> Result<(), UpstreamError> {
        let chunk = kept.last().cloned().unwrap_or_default();
        self.ended = last;
        match self.exchange.push_body(chunk, last) {
            Ok(()) => Ok(()),
            Err(Failure::Refused) if self.tries < MAX_REFUSED => self.reopen(kept).await,
            Err(e) => Err(e.into()),
        }
    }

    /// Ends the body without more bytes.
    pub async fn end(&mut self, kept: &[Bytes]) -> Result<(), UpstreamError> {
        self.ended = true;
        match self.exchange.push_body(Bytes::new(), true) {
            Ok(()) => Ok(()),
            Err(Failure::Refused) if self.tries < MAX_REFUSED => self.reopen(kept).await,
            Err(e) => Err(e.into()),
        }
    }

    /// Waits for the response head, once the body has ended; `kept` is the
    /// whole body, sent again if the worker refuses the stream.
    pub async fn answer(
        mut self,
        kept: &[Bytes],
    ) -> Result<(Exchange, ResponseHead), UpstreamError> {
        debug_assert!(self.ended, "the body ends before the answer is awaited");
        loop {
            match self.exchange.head().await {
                Ok(head) => return Ok((self.exchange, head)),
                Err(UpstreamError::Failed(Failure::Refused)) if self.tries < MAX_REFUSED => {
                    self.reopen(kept).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn reopen(&mut self, kept: &[Bytes]) -> Result<(), UpstreamError> {
        tracing::debug!(address = %self.upstream.inner.address, "worker refused a stream; sending it again");
        self.tries += 1;
        self.exchange = self.upstream.open(self.meta, kept, !self.ended).await?;
        Ok(())
    }
}
