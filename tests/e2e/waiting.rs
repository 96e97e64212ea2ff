//! Waiting for what a test expects to become true: [`eventually`], the one polling loop.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// What a check answers: a value once what it waits for is there, or what it saw instead.
pub(crate) trait Observation {
    /// The value the wait answers.
    type Value;
    /// The value, or what was observed instead (shown if the wait times out).
    fn value(self) -> Result<Self::Value, String>;
}

impl<T> Observation for Option<T> {
    type Value = T;
    fn value(self) -> Result<T, String> {
        self.ok_or_else(|| "None".to_owned())
    }
}

impl<T, E: Debug> Observation for Result<T, E> {
    type Value = T;
    fn value(self) -> Result<T, String> {
        self.map_err(|error| format!("{error:?}"))
    }
}

/// Runs `check` until it answers `Some`/`Ok`, and answers that value; past `timeout`, panics
/// with the last thing `check` observed. Pauses grow from 10 ms to 200 ms between tries.
pub(crate) async fn eventually<O: Observation>(
    timeout: Duration,
    mut check: impl AsyncFnMut() -> O,
) -> O::Value {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    loop {
        let last = match check().await.value() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            panic!("not so within {timeout:?}; last observed: {last}");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}
