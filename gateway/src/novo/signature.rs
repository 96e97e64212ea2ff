//! `Novo-Signature`, checked before the body is trusted and, as far as it can be, before the
//! body is read at all.
//!
//! A call is `POST` with `Novo-Signature: t=<seconds>,v1=<hex>[,v1=…]`, the HMAC-SHA256 of
//! `"{t}.{raw body}"` with the adapter's secret (or the previous one inside its grace window).
//! Everything that does not need the body is checked first, from the headers alone: the
//! header is there, `t` is a number of seconds within ±300 s of now, and at least one `v1` is
//! 64 hex digits (nothing else can ever match). Only then is the body read, as it streams in,
//! into an HMAC per accepted secret, and refused the moment it passes the size limit; the
//! bytes are kept for the handler but trusted only once a `v1` matches (compared in constant
//! time). A request that passes is remembered for the window (see [`ReplayMemory`]) so the
//! same signed request cannot be sent again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt as _;
use hmac::{KeyInit, Mac};
use plinth_kit::grpc::constant_time_eq;
use plinth_kit::{ErrorCode, PlinthError};

use crate::error::{self, ApiError};

/// How far `t` may be from now, either way.
pub const TOLERANCE_SECONDS: i64 = 300;

/// One HMAC-SHA256.
type Digest = [u8; 32];

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

fn unauthenticated(message: impl Into<String>) -> ApiError {
    ApiError(PlinthError::new(ErrorCode::Unauthenticated, message))
}

/// The signature of `body` at `t` with `secret`, as lowercase hex.
#[cfg(test)]
pub fn sign(secret: &[u8], t: &str, body: &[u8]) -> String {
    let mut verifier = Verifier::new(&[secret], t);
    verifier.update(body);
    plinth_kit::hex(&verifier.macs[0].clone().finalize().into_bytes())
}

/// What `Novo-Signature` says, checked for shape and freshness: everything that can be known
/// before a byte of the body is read.
#[derive(Debug)]
pub struct SignatureHeader {
    /// `t` exactly as sent: it is part of what is signed.
    t: String,
    /// `t` as seconds since the epoch.
    pub at: i64,
    /// Every `v1` that could be a signature (64 hex digits), decoded.
    candidates: Vec<Digest>,
}

impl SignatureHeader {
    /// Reads the header; refuses (401) a missing one, a missing or non-numeric `t`, a `t` more
    /// than [`TOLERANCE_SECONDS`] from `now_s`, and one without any well-formed `v1`. Other
    /// schemes are ignored.
    pub fn parse(header: Option<&str>, now_s: i64) -> Result<Self, ApiError> {
        let header = header.ok_or_else(|| unauthenticated("Novo-Signature is missing"))?;
        let mut t = None;
        let mut candidates = Vec::new();
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", value)) => t = Some(value.trim()),
                Some(("v1", value)) => candidates.extend(decode_hex(value.trim())),
                _ => {}
            }
        }
        let t = t.ok_or_else(|| unauthenticated("Novo-Signature has no t="))?;
        let at: i64 = t
            .parse()
            .map_err(|_| unauthenticated("Novo-Signature: t is not a number of seconds"))?;
        if now_s.abs_diff(at) > TOLERANCE_SECONDS.unsigned_abs() {
            return Err(unauthenticated(
                "Novo-Signature: t is more than 300 s from now; check the clocks",
            ));
        }
        if candidates.is_empty() {
            return Err(unauthenticated(
                "Novo-Signature has no v1= signature of 64 hex digits",
            ));
        }
        Ok(SignatureHeader {
            t: t.to_owned(),
            at,
            candidates,
        })
    }
}

fn decode_hex(text: &str) -> Option<Digest> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let high = (pair[0] as char).to_digit(16)?;
        let low = (pair[1] as char).to_digit(16)?;
        *byte = u8::try_from(high * 16 + low).ok()?;
    }
    Some(out)
}

/// The HMAC of `"{t}.{body}"` under every accepted secret, fed as the body arrives.
struct Verifier {
    macs: Vec<HmacSha256>,
}

impl Verifier {
    fn new(secrets: &[&[u8]], t: &str) -> Self {
        let macs = secrets
            .iter()
            .filter(|secret| !secret.is_empty())
            .map(|secret| {
                let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key");
                mac.update(t.as_bytes());
                mac.update(b".");
                mac
            })
            .collect();
        Verifier { macs }
    }

    fn update(&mut self, chunk: &[u8]) {
        for mac in &mut self.macs {
            mac.update(chunk);
        }
    }

    /// The signature that matched one of `candidates`, if any; every pair is compared, in
    /// constant time, so timing says nothing about which.
    fn finish(self, candidates: &[Digest]) -> Option<Digest> {
        let mut matched = None;
        for mac in self.macs {
            let mut expected = [0u8; 32];
            expected.copy_from_slice(&mac.finalize().into_bytes());
            for candidate in candidates {
                if constant_time_eq(candidate, &expected) {
                    matched = Some(expected);
                }
            }
        }
        matched
    }
}

/// A body whose signature matched.
#[derive(Debug)]
pub struct Verified {
    /// The raw body, exactly as signed.
    pub body: Bytes,
    /// The signature that matched: with the adapter, what identifies this request.
    pub signature: Digest,
}

/// Reads `body` into an HMAC per secret as it arrives: refused (413) once it passes
/// `max_bytes`, refused (400) if it has not all arrived within `deadline`, and answered only
/// if a `v1` of `header` matches (401 otherwise).
pub async fn read_verified(
    body: Body,
    header: &SignatureHeader,
    secrets: &[&[u8]],
    max_bytes: usize,
    deadline: Duration,
) -> Result<Verified, ApiError> {
    let mut verifier = Verifier::new(secrets, &header.t);
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut received = 0usize;
    let mut stream = body.into_data_stream();
    let reading = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|_| {
                ApiError(PlinthError::new(
                    ErrorCode::WorkspaceInvalidRequest,
                    "the body was not received whole",
                ))
            })?;
            received = received.saturating_add(chunk.len());
            if received > max_bytes {
                return Err(too_large(max_bytes));
            }
            verifier.update(&chunk);
            chunks.push(chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(deadline, reading).await {
        Ok(read) => read?,
        Err(_) => {
            return Err(ApiError(PlinthError::new(
                ErrorCode::WorkspaceInvalidRequest,
                format!(
                    "the body did not arrive within {} s (gateway.request_timeout_seconds)",
                    deadline.as_secs()
                ),
            )));
        }
    }
    let signature = verifier.finish(&header.candidates).ok_or_else(|| {
        unauthenticated("Novo-Signature: no v1 signature matches this adapter's secret")
    })?;
    let body = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => Bytes::from(chunks.concat()),
    };
    Ok(Verified { body, signature })
}

/// `file_too_large` for a body past `max_bytes`.
pub fn too_large(max_bytes: usize) -> ApiError {
    ApiError(
        PlinthError::new(
            ErrorCode::FileTooLarge,
            format!("the body is larger than {max_bytes} bytes"),
        )
        .with_detail(serde_json::json!({ "max_bytes": max_bytes })),
    )
}

/// What identifies one signed request: its adapter and the signature that matched (which
/// covers `t` and the body).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ReplayKey {
    adapter: String,
    signature: Digest,
}

/// The first use of a signed request.
#[derive(Debug)]
struct FirstUse {
    run: String,
    request: String,
}

/// A verified call as the replay memory sees it.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    /// The adapter it was sent to.
    pub adapter: &'a str,
    /// The signature that matched.
    pub signature: Digest,
    /// Its `t`.
    pub at: i64,
    /// Its `Novo-Run-Id` (not signed).
    pub run: &'a str,
    /// Its `Novo-Request-Id` (not signed).
    pub request: &'a str,
    /// Whether its method is idempotent by `Novo-Request-Id` (a mutating one).
    pub idempotent: bool,
}

/// What [`ReplayMemory::admit`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Never seen: go on.
    First,
    /// Seen, and this is a retry of an idempotent call with the same `Novo-Request-Id` and
    /// `Novo-Run-Id`: go on, idempotency answers it without running it again.
    Retry,
}

/// Every signed request accepted in the last window, per adapter: a second arrival of one is
/// a replay and is refused, unless it is the same idempotent call retried (same
/// `Novo-Request-Id`, same run), which idempotency answers without running. An entry is
/// forgotten once its `t` is out of the window, since the request would be refused for its
/// age then. The memory holds at most `capacity` requests; when full, new calls are refused
/// (503, `Retry-After`) rather than forgetting one that could still be replayed.
#[derive(Debug)]
pub struct ReplayMemory {
    capacity: usize,
    inner: Mutex<Replays>,
}

#[derive(Debug, Default)]
struct Replays {
    seen: HashMap<ReplayKey, FirstUse>,
    by_time: BTreeSet<(i64, ReplayKey)>,
}

impl ReplayMemory {
    /// A memory of at most `capacity` requests.
    pub fn new(capacity: usize) -> Self {
        ReplayMemory {
            capacity: capacity.max(1),
            inner: Mutex::default(),
        }
    }

    /// Admits a verified call once.
    pub fn admit(&self, call: &Arrival<'_>, now_s: i64) -> Result<Admission, ApiError> {
        let Arrival {
            adapter,
            signature,
            at,
            run,
            request,
            idempotent,
        } = *call;
        let mut replays = self.inner.lock().unwrap_or_else(|poisoned| {
            // The map is consistent after every statement; a panic elsewhere cannot tear it.
            poisoned.into_inner()
        });
        replays.forget_older_than(now_s - TOLERANCE_SECONDS);
        let key = ReplayKey {
            adapter: adapter.to_owned(),
            signature,
        };
        if let Some(first) = replays.seen.get(&key) {
            if idempotent && !request.is_empty() && first.request == request && first.run == run {
                return Ok(Admission::Retry);
            }
            return Err(unauthenticated(
                "Novo-Signature: this signed request was already received; a replay is refused \
                 and nothing ran. Sign every call anew",
            ));
        }
        if replays.seen.len() >= self.capacity {
            let oldest = replays.by_time.first().map_or(at, |(t, _)| *t);
            let wait = (oldest + TOLERANCE_SECONDS - now_s).max(1);
            return Err(error::retry_after(
                ErrorCode::Unavailable,
                "too many signed calls in the last 300 s to remember them all; retry shortly",
                u64::try_from(wait).unwrap_or(1),
            ));
        }
        replays.by_time.insert((at, key.clone()));
        replays.seen.insert(
            key,
            FirstUse {
                run: run.to_owned(),
                request: request.to_owned(),
            },
        );
        Ok(Admission::First)
    }
}

impl Replays {
    fn forget_older_than(&mut self, cutoff: i64) {
        while let Some((t, _)) = self.by_time.first()
            && *t < cutoff
        {
            if let Some((_, key)) = self.by_time.pop_first() {
                self.seen.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"secret-0123456789";

    async fn check(
        header: &str,
        body: &'static [u8],
        secrets: &[&[u8]],
        now_s: i64,
    ) -> Result<Verified, ApiError> {
        let header = SignatureHeader::parse(Some(header), now_s)?;
        read_verified(
            Body::from(body),
            &header,
            secrets,
            1024,
            Duration::from_secs(5),
        )
        .await
    }

    #[tokio::test]
    async fn signatures_are_checked_over_the_raw_body() {
        let body: &'static [u8] = br#"{"method":"readFile","args":{"path":"a"}}"#;
        let t = "1796040000";
        let good = sign(SECRET, t, body);
        let header = format!("t={t},v0=zzz,v1=00ff,v1={good}");
        let verified = check(&header, body, &[SECRET], 1_796_040_100)
            .await
            .expect("good");
        assert_eq!(verified.body.as_ref(), body);
        assert!(
            check(&header, body, &[b"other-secret-000000"], 1_796_040_100)
                .await
                .is_err()
        );
        assert!(
            check(&header, &body[1..], &[SECRET], 1_796_040_100)
                .await
                .is_err()
        );
        // The previous secret is accepted beside the current one; an empty one never is.
        assert!(
            check(
                &header,
                body,
                &[b"", b"current-secret-000", SECRET],
                1_796_040_100
            )
            .await
            .is_ok()
        );
        assert!(check(&header, body, &[b""], 1_796_040_100).await.is_err());
        // Uppercase hex is the same signature.
        let upper = format!("t={t},v1={}", good.to_uppercase());
        assert!(check(&upper, body, &[SECRET], 1_796_040_000).await.is_ok());
    }

    #[test]
    fn the_header_is_checked_before_the_body() {
        let good = "ab".repeat(32);
        let now = 1_796_040_000;
        for bad in [
            None,
            Some(String::new()),
            Some(format!("v1={good}")),
            Some(format!("t=soon,v1={good}")),
            Some(format!("t={},v1={good}", now - 301)),
            Some(format!("t={},v1={good}", now + 301)),
            Some(format!("t={now},v0={good}")),
            Some(format!("t={now},v1=deadbeef")),
            Some(format!("t={now},v1={}", "zz".repeat(32))),
        ] {
            let error = SignatureHeader::parse(bad.as_deref(), now).expect_err("refused");
            assert_eq!(error.0.code, ErrorCode::Unauthenticated, "{bad:?}");
        }
        for good_enough in [
            format!("t={now},v1={good}"),
            format!("t={},v1=x,v1={good}", now - 300),
            format!(" t={} , v1={good} ", now + 300),
        ] {
            SignatureHeader::parse(Some(&good_enough), now).expect(&good_enough);
        }
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_refused_as_it_passes_it() {
        let header = SignatureHeader::parse(Some(&format!("t=100,v1={}", "00".repeat(32))), 100)
            .expect("header");
        // An endless body: the read stops at the limit instead of waiting for an end.
        let endless =
            futures::stream::repeat_with(|| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 4096])));
        let error = read_verified(
            Body::from_stream(endless),
            &header,
            &[SECRET],
            64 * 1024,
            Duration::from_secs(5),
        )
        .await
        .expect_err("too large");
        assert_eq!(error.0.code, ErrorCode::FileTooLarge);
        assert_eq!(
            error.0.detail,
            Some(serde_json::json!({"max_bytes": 64 * 1024}))
        );
    }

    #[tokio::test]
    async fn a_replay_is_refused_and_a_retry_of_the_same_idempotent_call_is_not() {
        let memory = ReplayMemory::new(2);
        let verified = |byte| Verified {
            body: Bytes::new(),
            signature: [byte; 32],
        };
        let now = 1_000;
        let admit = |v: &Verified, run: &str, request: &str, idempotent: bool, now_s: i64| {
            let call = Arrival {
                adapter: "wadp_a",
                signature: v.signature,
                at: now,
                run,
                request,
                idempotent,
            };
            memory.admit(&call, now_s)
        };
        assert_eq!(
            admit(&verified(1), "run_1", "req_1", true, now).expect("first"),
            Admission::First
        );
        assert_eq!(
            admit(&verified(1), "run_1", "req_1", true, now).expect("retry"),
            Admission::Retry
        );
        for (run, request, idempotent) in [
            ("run_2", "req_1", true),
            ("run_1", "req_2", true),
            ("run_1", "req_1", false),
            ("run_1", "", true),
        ] {
            let error = admit(&verified(1), run, request, idempotent, now).expect_err("replay");
            assert_eq!(error.0.code, ErrorCode::Unauthenticated);
        }
        // Another adapter's request with the same bytes is another request.
        assert_eq!(
            memory
                .admit(
                    &Arrival {
                        adapter: "wadp_b",
                        signature: verified(1).signature,
                        at: now,
                        run: "r",
                        request: "q",
                        idempotent: false,
                    },
                    now
                )
                .expect("other adapter"),
            Admission::First
        );
        // Full: refused with a time to retry, never forgotten early.
        let error = admit(&verified(2), "r", "q", false, now).expect_err("full");
        assert_eq!(error.0.code, ErrorCode::Unavailable);
        assert!(
            admit(&verified(1), "run_9", "req_9", false, now + 299).is_err(),
            "still remembered inside the window"
        );
        // Past the window the old entries are forgotten (such a request is refused for its age).
        assert_eq!(
            admit(&verified(2), "r", "q", false, now + 301).expect("room again"),
            Admission::First
        );
    }
}
