//! Reading a gRPC response stream to its real end. A caller that stops reading once it has
//! the message it needs (a command's result, a file's last byte) and drops the stream
//! resets the call before its status arrives in the trailers: both ends then record the call
//! as cancelled although it succeeded. These read the trailers first.

use std::time::Duration;

use futures::Stream;

/// How long the rest of a stream (normally only its trailers) is waited for once the last
/// message its caller needs has come.
const TRAILERS_WAIT: Duration = Duration::from_secs(5);

/// Reads what is left of `stream` after the last message its caller needs, so the call ends
/// with its server's status. Messages past that point are dropped; a server that keeps the
/// stream open is left after a few seconds.
pub async fn finish<T>(stream: &mut tonic::Streaming<T>) {
    let _ = tokio::time::timeout(TRAILERS_WAIT, async {
        while let Ok(Some(_)) = stream.message().await {}
    })
    .await;
}

/// `stream`'s messages, with the stream read to its end (see [`finish`]) before the message
/// `last` says is the last one its caller needs is handed on.
pub fn through_end<T, F>(
    stream: tonic::Streaming<T>,
    last: F,
) -> impl Stream<Item = Result<T, tonic::Status>> + Send + 'static
where
    T: Send + 'static,
    F: FnMut(&T) -> bool + Send + 'static,
{
    futures::stream::unfold(Some((stream, last)), |state| async move {
        let (mut stream, mut last) = state?;
        match stream.message().await {
            Ok(Some(message)) => {
                if last(&message) {
                    finish(&mut stream).await;
                    Some((Ok(message), None))
                } else {
                    Some((Ok(message), Some((stream, last))))
                }
            }
            Ok(None) => None,
            Err(status) => Some((Err(status), None)),
        }
    })
}
