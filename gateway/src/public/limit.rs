//! The largest message the public gRPC face takes, checked from each message's length prefix
//! as the request body streams in, before any of it is buffered: a larger one is refused with
//! `RESOURCE_EXHAUSTED` and an `ErrorInfo` naming the limit, where the gRPC library would
//! answer `OUT_OF_RANGE` (Plinth's code for a file past its limit) with only a message.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes};
use http_body::{Body, Frame, SizeHint};

/// The largest message, in bytes (its length prefix's value).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// A gRPC request body that fails with [`plinth_kit::error::message_too_large`] at the first
/// message whose length prefix is past [`MAX_MESSAGE_BYTES`].
pub struct Limited<B> {
    inner: B,
    /// The prefix being read: a flag byte and four length bytes.
    prefix: [u8; 5],
    prefix_read: usize,
    /// What is left of the current message after its prefix.
    message_left: u64,
    refused: bool,
}

impl<B> Limited<B> {
    pub fn new(inner: B) -> Self {
        Limited {
            inner,
            prefix: [0; 5],
            prefix_read: 0,
            message_left: 0,
            refused: false,
        }
    }

    /// Follows the framing through `data`; answers the size of a message past the limit.
    fn check(&mut self, mut data: &[u8]) -> Option<u64> {
        while !data.is_empty() {
            if self.message_left > 0 {
                let take = usize::try_from(self.message_left)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.message_left -= take as u64;
                data.advance(take);
                continue;
            }
            let take = (5 - self.prefix_read).min(data.len());
            self.prefix[self.prefix_read..self.prefix_read + take].copy_from_slice(&data[..take]);
            self.prefix_read += take;
            data.advance(take);
            if self.prefix_read == 5 {
                self.prefix_read = 0;
                let length = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]);
                if length as usize > MAX_MESSAGE_BYTES {
                    return Some(u64::from(length));
                }
                self.message_left = u64::from(length);
            }
        }
        None
    }
}

impl<B> Body for Limited<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.refused {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Some(size) = this.check(data)
                {
                    this.refused = true;
                    let status = plinth_kit::error::message_too_large(size, MAX_MESSAGE_BYTES);
                    return Poll::Ready(Some(Err(Box::new(status))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.refused || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(length: u32, body: &[u8]) -> Vec<u8> {
        let mut framed = vec![0];
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(body);
        framed
    }

    #[test]
    fn messages_up_to_the_limit_pass_and_a_larger_prefix_is_caught_across_pieces() {
        let mut limited = Limited::new(http_body_util::Empty::<Bytes>::new());
        let small = framed(3, b"abc");
        assert_eq!(limited.check(&small), None);
        let at_limit = framed(MAX_MESSAGE_BYTES as u32, &[]);
        assert_eq!(limited.check(&at_limit), None);
        // The message's bytes, then a prefix past the limit split over two reads.
        assert_eq!(limited.check(&vec![7u8; MAX_MESSAGE_BYTES]), None);
        let over = framed(MAX_MESSAGE_BYTES as u32 + 1, &[]);
        assert_eq!(limited.check(&over[..2]), None);
        assert_eq!(
            limited.check(&over[2..]),
            Some(MAX_MESSAGE_BYTES as u64 + 1)
        );
    }
}
