//! How many background fetches (materializations, pre-warm) run at once: as many as the store
//! answers without slowing down.
//!
//! A store that serves requests one after another (a single-process S3-protocol server, a
//! saturated link, a throttled bucket) answers each request later the more are in flight, and a
//! session's request waits behind all of them: sixty-four background fetches in flight put a
//! session's open sixty-four answers back. A store that serves them side by side (S3 itself)
//! answers as fast at sixty-four as at one, and a lower limit would only slow pre-warm down.
//!
//! So the limit follows the store, as TCP Vegas and Netflix's gradient limiter do: every
//! answered fetch of a small blob is a sample of the store's latency. The *baseline* is the
//! latency of fetches that started with nothing else of this node's in flight (the store
//! unloaded by this node); the *current* latency is the recent samples' moving average. While
//! the current latency stays within [`TOLERANCE`] of the baseline (plus [`SLACK`], for stores
//! that answer in microseconds), the limit grows by about its square root; as it rises past,
//! the limit shrinks in proportion (at most by half a sample). On a store that serializes, it
//! settles at a handful, where a session's fetch waits behind a handful; on one that does not,
//! it reaches the configured concurrency.
//!
//! A node that is always busy never starts a fetch alone; every [`PROBE_EVERY`] the limiter
//! lets background fetches start only when nothing is in flight, until [`PROBE_SAMPLES`] such
//! fetches renewed the baseline (a store that became slower for good is learned again).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The limit a node starts with (or the configured concurrency, if lower).
const START: f64 = 8.0;

/// How much slower than the baseline the store may answer before the limit shrinks.
const TOLERANCE: f64 = 2.0;

/// Latency added to the tolerated: a store on local disk answers in microseconds, and a
/// millisecond of scheduling noise is not the store slowing down.
const SLACK: Duration = Duration::from_millis(1);

/// Blobs larger than this are not samples: their answer's time is mostly their bytes.
const SAMPLE_BYTES: u64 = 256 * 1024;

/// How often an always-busy node measures the store alone again.
const PROBE_EVERY: Duration = Duration::from_secs(30);

/// Fetches alone that renew the baseline.
const PROBE_SAMPLES: u32 = 4;

/// The longest a probe holds background fetches back (sessions may keep the store busy).
const PROBE_AT_MOST: Duration = Duration::from_secs(1);

/// Weight of a new sample in the current latency's moving average.
const CURRENT_WEIGHT: f64 = 1.0 / 8.0;

/// Weight of a new alone sample in the baseline's moving average.
const BASELINE_WEIGHT: f64 = 1.0 / 4.0;

/// Weight of a sample's target in the limit (the rest is the limit as it was).
const LIMIT_WEIGHT: f64 = 0.2;

/// The background fetches' limit, adapting to the store's latency.
pub(super) struct Limit {
    max: f64,
    state: Mutex<State>,
    freed: tokio::sync::Notify,
}

struct State {
    limit: f64,
    /// Background fetches holding a slot.
    background: usize,
    /// Fetches of any kind asking the store.
    asking: usize,
    /// Latency of fetches that started alone (moving average, seconds).
    baseline: Option<f64>,
    /// Latency of recent fetches (moving average, seconds).
    current: Option<f64>,
    /// When the last fetch alone was answered.
    last_alone: Option<Instant>,
    /// Alone fetches still wanted before background fetches start beside others again.
    probing: u32,
    /// When the probe began.
    probe_since: Option<Instant>,
}

/// A background fetch's turn, given back when dropped.
pub(super) struct Slot<'a>(&'a Limit);

/// One fetch asking the store: [`Asking::answered`] makes it a sample; dropped unanswered (a
/// failure, a cancelled fetch) it counts only as no longer in flight.
pub(super) struct Asking<'a> {
    limit: &'a Limit,
    alone: bool,
    since: Instant,
}

impl Limit {
    /// A limit of at most `max` (at least 1) background fetches at once.
    pub(super) fn new(max: usize) -> Self {
        let max = max.max(1) as f64;
        Limit {
            max,
            state: Mutex::new(State {
                limit: START.min(max),
                background: 0,
                asking: 0,
                baseline: None,
                current: None,
                last_alone: None,
                probing: 0,
                probe_since: None,
            }),
            freed: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Background fetches let run at once now.
    pub(super) fn current(&self) -> usize {
        self.lock().limit as usize
    }

    /// Waits for a background fetch's turn.
    pub(super) async fn slot(&self) -> Slot<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let probe_waits = {
                let mut state = self.lock();
                if state.probing > 0
                    && state
                        .probe_since
                        .is_some_and(|since| since.elapsed() >= PROBE_AT_MOST)
                {
                    // The store never fell quiet: the baseline stands for another while.
                    state.probing = 0;
                    state.last_alone = Some(Instant::now());
                }
                let room = state.background < (state.limit as usize).max(1);
                // One background fetch at a time, with nothing else in flight.
                let probe_waits = state.probing > 0 && (state.asking > 0 || state.background > 0);
                if room && !probe_waits {
                    state.background += 1;
                    return Slot(self);
                }
                probe_waits
            };
            if probe_waits {
                // Woken by a fetch's end, or in time to give the probe up.
                let _ = tokio::time::timeout(PROBE_AT_MOST, freed).await;
            } else {
                freed.await;
            }
        }
    }

    /// A fetch (of any kind) starts asking the store.
    pub(super) fn asking(&self) -> Asking<'_> {
        let mut state = self.lock();
        let alone = state.asking == 0;
        state.asking += 1;
        Asking {
            limit: self,
            alone,
            since: Instant::now(),
        }
    }

    /// Takes an answer's latency, `alone` if nothing else of this node's was in flight when it
    /// was asked.
    fn sample(&self, state: &mut State, latency: Duration, alone: bool, now: Instant) {
        let seconds = latency.as_secs_f64();
        if alone {
            state.baseline = Some(match state.baseline {
                Some(baseline) => baseline + BASELINE_WEIGHT * (seconds - baseline),
                None => seconds,
            });
            state.last_alone = Some(now);
            state.probing = state.probing.saturating_sub(1);
        } else if state.probing == 0
            && state
                .last_alone
                .is_some_and(|last| now.duration_since(last) >= PROBE_EVERY)
        {
            state.probing = PROBE_SAMPLES;
            state.probe_since = Some(now);
        }
        let current = match state.current {
            Some(current) => current + CURRENT_WEIGHT * (seconds - current),
            None => seconds,
        };
        state.current = Some(current);
        let Some(baseline) = state.baseline else {
            return;
        };
        let tolerated = TOLERANCE * baseline + SLACK.as_secs_f64();
        let gradient = (tolerated / current.max(f64::MIN_POSITIVE)).clamp(0.5, 1.0);
        let target = state.limit * gradient + state.limit.sqrt();
        state.limit = (state.limit + LIMIT_WEIGHT * (target - state.limit)).clamp(1.0, self.max);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.lock().background -= 1;
        self.0.freed.notify_waiters();
    }
}

impl Asking<'_> {
    /// The store answered with `bytes`: a sample if the blob is small.
    pub(super) fn answered(self, bytes: u64) {
        if bytes <= SAMPLE_BYTES {
            let latency = self.since.elapsed();
            let mut state = self.limit.lock();
            self.limit
                .sample(&mut state, latency, self.alone, Instant::now());
        }
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.limit.lock().asking -= 1;
        // A probe waits for nothing to be in flight.
        self.limit.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `rounds` of a store answering `latency(in flight)` to fetches kept at the limit,
    /// one alone fetch first; answers the limit at the end.
    fn settle(max: usize, rounds: usize, latency: impl Fn(f64) -> f64) -> usize {
        let limit = Limit::new(max);
        let start = Instant::now();
        let mut state = limit.lock();
        limit.sample(
            &mut state,
            Duration::from_secs_f64(latency(1.0)),
            true,
            start,
        );
        for round in 0..rounds {
            let in_flight = state.limit.floor().max(1.0);
            let now = start + Duration::from_millis(round as u64);
            limit.sample(
                &mut state,
                Duration::from_secs_f64(latency(in_flight)),
                false,
                now,
            );
        }
        state.limit as usize
    }

    #[test]
    fn a_store_that_answers_one_request_at_a_time_gets_a_handful() {
        // 3 ms an answer, each waiting for those ahead of it.
        let limit = settle(64, 2_000, |in_flight| 0.003 * in_flight);
        assert!((2..=8).contains(&limit), "settled at {limit}");
    }

    #[test]
    fn a_store_that_answers_side_by_side_gets_the_configured_concurrency() {
        let limit = settle(64, 2_000, |_| 0.020);
        assert_eq!(limit, 64);
        // And never more than configured.
        assert_eq!(settle(3, 2_000, |_| 0.020), 3);
    }

    #[test]
    fn a_store_answering_in_microseconds_is_not_held_back_by_noise() {
        // 50 µs alone, up to 400 µs when busy: the slack covers it.
        let limit = settle(64, 2_000, |in_flight| 0.000_05 + 0.000_005 * in_flight);
        assert_eq!(limit, 64);
    }

    #[test]
    fn a_store_that_slows_under_load_later_gets_fewer_and_more_when_it_recovers() {
        let limit = Limit::new(64);
        let start = Instant::now();
        let mut state = limit.lock();
        limit.sample(&mut state, Duration::from_millis(20), true, start);
        for _ in 0..500 {
            limit.sample(&mut state, Duration::from_millis(20), false, start);
        }
        assert_eq!(state.limit as usize, 64);
        for _ in 0..500 {
            let slow = Duration::from_secs_f64(0.001 * state.limit);
            limit.sample(
                &mut state,
                slow.max(Duration::from_millis(20)),
                false,
                start,
            );
        }
        let busy = state.limit as usize;
        assert!(busy < 48, "stayed at {busy}");
        for _ in 0..500 {
            limit.sample(&mut state, Duration::from_millis(20), false, start);
        }
        assert_eq!(state.limit as usize, 64);
    }

    #[tokio::test]
    async fn a_slot_waits_for_room_and_a_probe_for_nothing_in_flight() {
        let limit = Limit::new(2);
        {
            let mut state = limit.lock();
            state.limit = 2.0;
        }
        let first = limit.slot().await;
        let second = limit.slot().await;
        // Full: the third waits until one is given back.
        let third = limit.slot();
        tokio::pin!(third);
        assert!(
            futures::poll!(third.as_mut()).is_pending(),
            "a third slot was given beside two"
        );
        drop(first);
        let third = third.await;
        drop(third);

        // The baseline is old: the next answer starts a probe, and slots wait for nothing in
        // flight at all.
        let start = Instant::now();
        {
            let mut state = limit.lock();
            limit.sample(&mut state, Duration::from_millis(5), true, start);
            limit.sample(
                &mut state,
                Duration::from_millis(5),
                false,
                start + PROBE_EVERY,
            );
            assert_eq!(state.probing, PROBE_SAMPLES);
        }
        let asking = limit.asking();
        let probe = limit.slot();
        tokio::pin!(probe);
        assert!(
            futures::poll!(probe.as_mut()).is_pending(),
            "a probe started beside a fetch in flight"
        );
        drop(asking);
        // Nor beside another background fetch holding its slot.
        assert!(
            futures::poll!(probe.as_mut()).is_pending(),
            "a probe started beside a background fetch"
        );
        drop(second);
        let _probe = tokio::time::timeout(PROBE_AT_MOST / 2, probe)
            .await
            .expect("the probe started once nothing was in flight");
    }
}
