//! Response bodies that report when they end. A request is not over when its handler returns
//! headers: a streamed exec, a download or a followed build log goes on for as long as its body
//! does, and a gRPC status may come in the trailers after the last message. [`Metered`] wraps a
//! body and tells its [`Watcher`] about every frame and, once, how the body ended, so latency,
//! status and the request's span all close with the body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// How a body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Its last frame was sent.
    Complete,
    /// It failed while streaming.
    Failed,
    /// It was dropped unfinished: the peer went away or the call was cancelled.
    Dropped,
}

/// Sees a body's frames and its end.
pub trait Watcher: Send + 'static {
    /// A frame about to be sent (data or trailers).
    fn frame(&mut self, _frame: &Frame<Bytes>) {}
    /// The body ended; called exactly once.
    fn end(self, end: End);
    /// The span the body is polled in: the calls a streamed body makes as it goes (a
    /// followed log's polls, a command's closing record) belong to the request that answers
    /// with it, not to traces of their own.
    fn span(&self) -> Option<&tracing::Span> {
        None
    }
}

/// A body that reports to `W` (see the module documentation).
pub struct Metered<B, W: Watcher> {
    inner: B,
    watcher: Option<W>,
}

impl<B, W: Watcher> Metered<B, W> {
    /// Wraps `inner`. An empty body ends at once, since nobody may ever poll it.
    pub fn new(inner: B, watcher: W) -> Self
    where
        B: Body,
    {
        let mut metered = Metered {
            inner,
            watcher: Some(watcher),
        };
        if metered.inner.is_end_stream() {
            metered.finish(End::Complete);
        }
        metered
    }

    fn finish(&mut self, end: End) {
        if let Some(watcher) = self.watcher.take() {
            watcher.end(end);
        }
    }
}

impl<B, W> Body for Metered<B, W>
where
    B: Body<Data = Bytes> + Unpin,
    W: Watcher + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // Every field is Unpin (the inner body by the bound, the watcher by value).
        let this = self.get_mut();
        let span = this
            .watcher
            .as_ref()
            .and_then(Watcher::span)
            .cloned()
            .unwrap_or_else(tracing::Span::none);
        let polled = span.in_scope(|| Pin::new(&mut this.inner).poll_frame(cx));
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(watcher) = this.watcher.as_mut() {
                    watcher.frame(frame);
                }
                // Trailers are a body's last frame: the server may drop the body once it has
                // sent them, without polling it again.
                if frame.is_trailers() || this.inner.is_end_stream() {
                    this.finish(End::Complete);
                }
            }
            Poll::Ready(Some(Err(_))) => this.finish(End::Failed),
            Poll::Ready(None) => this.finish(End::Complete),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B, W: Watcher> Drop for Metered<B, W> {
    fn drop(&mut self) {
        self.finish(End::Dropped);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http_body_util::{BodyExt as _, Full, StreamBody};

    use super::*;

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<(Vec<String>, Vec<End>)>>);

    impl Watcher for Seen {
        fn frame(&mut self, frame: &Frame<Bytes>) {
            let kind = if frame.is_trailers() {
                "trailers"
            } else {
                "data"
            };
            self.0.lock().expect("test setup").0.push(kind.to_owned());
        }
        fn end(self, end: End) {
            self.0.lock().expect("test setup").1.push(end);
        }
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_reports_its_frames_and_one_end() {
        let seen = Seen::default();
        let body = Metered::new(Full::new(Bytes::from_static(b"hello")), seen.clone());
        let collected = body.collect().await.expect("test setup").to_bytes();
        assert_eq!(collected, "hello");
        let (frames, ends) = seen.0.lock().expect("test setup").clone();
        assert_eq!(frames, ["data"]);
        assert_eq!(ends, [End::Complete]);
    }

    #[tokio::test]
    async fn trailers_are_seen_and_a_dropped_stream_ends_as_dropped() {
        let seen = Seen::default();
        let frames = vec![
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::trailers(http::HeaderMap::new())),
        ];
        let body = Metered::new(StreamBody::new(futures_stream(frames)), seen.clone());
        body.collect().await.expect("test setup");
        assert_eq!(seen.0.lock().expect("test setup").0, ["data", "trailers"]);
        assert_eq!(seen.0.lock().expect("test setup").1, [End::Complete]);

        let unfinished = Seen::default();
        let frames = vec![Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(
            b"a",
        )))];
        let mut body = Metered::new(StreamBody::new(pending_after(frames)), unfinished.clone());
        body.frame().await.expect("test setup").expect("test setup");
        assert!(
            unfinished.0.lock().expect("test setup").1.is_empty(),
            "not over yet"
        );
        drop(body);
        assert_eq!(unfinished.0.lock().expect("test setup").1, [End::Dropped]);
    }

    fn futures_stream<T: Send + 'static>(
        items: Vec<T>,
    ) -> impl tokio_stream::Stream<Item = T> + Unpin + Send {
        tokio_stream::iter(items)
    }

    fn pending_after<T: Send + 'static>(
        items: Vec<T>,
    ) -> impl tokio_stream::Stream<Item = T> + Unpin + Send {
        use tokio_stream::StreamExt as _;
        tokio_stream::iter(items).chain(tokio_stream::pending())
    }
}
