//! Facts about how a process runs, shown under `ready` by `/readyz` (which cgroup version
//! holds sessions' limits, whether the blob store answers, which store is full). One line
//! each, replaced by its key. Kept apart from the admin surface so that any module may set a
//! line without depending on it.

use std::sync::Mutex;

static DETAILS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Sets a line `/readyz` shows once the process is ready: `key: value`.
pub fn describe(key: &str, value: impl Into<String>) {
    let mut details = DETAILS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    details.retain(|(existing, _)| existing != key);
    details.push((key.to_owned(), value.into()));
}

/// Every line, in the order they were first set.
pub(crate) fn lines() -> Vec<(String, String)> {
    DETAILS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}
