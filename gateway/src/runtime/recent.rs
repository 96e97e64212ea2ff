//! What the catalog answered a moment ago, kept for a moment so that a burst of calls asks it
//! once: a bounded map whose entries are good for a fixed time after they were stored.
//!
//! Used only where an answer a second old is as good as a fresh one (the gateway that changes
//! such a thing forgets its entry at once; another replica sees the change within the time),
//! or where the answer never changes (what a version installed).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Answers kept for `ttl` after they were stored, at most `cap` of them (the oldest go).
#[derive(Debug)]
pub(crate) struct Recent<K, V> {
    ttl: Duration,
    cap: usize,
    inner: Mutex<Inner<K, V>>,
}

#[derive(Debug)]
struct Inner<K, V> {
    entries: HashMap<K, (Instant, V)>,
    /// Keys in the order stored, oldest first; may name entries forgotten or stored again
    /// since.
    order: VecDeque<(K, Instant)>,
}

impl<K: Eq + Hash + Clone, V: Clone> Recent<K, V> {
    pub(crate) fn new(ttl: Duration, cap: usize) -> Self {
        Recent {
            ttl,
            cap: cap.max(1),
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K, V>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The answer stored for `key` less than the time ago.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        let mut inner = self.lock();
        match inner.entries.get(key) {
            Some((stored, value)) if stored.elapsed() < self.ttl => Some(value.clone()),
            Some(_) => {
                inner.entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for `key` from now.
    pub(crate) fn put(&self, key: K, value: V) {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.entries.insert(key.clone(), (now, value));
        inner.order.push_back((key, now));
        // Past the cap, or once the order holds many stale keys, the oldest go.
        while inner.entries.len() > self.cap || inner.order.len() > 2 * self.cap {
            let Some((oldest, stored)) = inner.order.pop_front() else {
                break;
            };
            if inner
                .entries
                .get(&oldest)
                .is_some_and(|(at, _)| *at == stored)
            {
                inner.entries.remove(&oldest);
            }
        }
    }

    /// Forgets `key` (this gateway changed what it answered).
    pub(crate) fn forget(&self, key: &K) {
        self.lock().entries.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_kept_for_its_time_and_forgotten_on_demand() {
        let recent = Recent::new(Duration::from_millis(200), 10);
        recent.put("a", 1);
        recent.put("b", 2);
        assert_eq!((recent.get(&"a"), recent.get(&"b")), (Some(1), Some(2)));
        recent.forget(&"a");
        assert_eq!(recent.get(&"a"), None);
        recent.put("c", 3);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(recent.get(&"c"), None, "past its time");
    }

    #[test]
    fn past_the_cap_the_oldest_go_and_storing_again_renews() {
        let recent = Recent::new(Duration::from_secs(60), 2);
        recent.put(1, "one");
        recent.put(2, "two");
        recent.put(1, "one again");
        recent.put(3, "three");
        assert_eq!(recent.get(&2), None, "the oldest went");
        assert_eq!(recent.get(&1), Some("one again"));
        assert_eq!(recent.get(&3), Some("three"));
        for key in 0..1000 {
            recent.put(key % 3, "churn");
        }
        assert!(recent.lock().order.len() <= 4, "stale keys do not pile up");
    }
}
