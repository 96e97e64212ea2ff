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
//! time). What a verified request leaves in the replay memory is [`replay_digest`], kept until
//! [`accepted_until_ms`]; the memory itself is the catalog's (see the `novo` module).

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt as _;
use hmac::{KeyInit, Mac};
use plinth_kit::grpc::constant_time_eq;
use plinth_kit::{ErrorCode, PlinthError};

use crate::http::error::ApiError;

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

/// What the replay memory keeps of a signed request: the SHA-256 of the signature that
/// matched (which covers `t` and the body), as lowercase hex. The signature itself is not
/// stored, so the table holds nothing that verifies as a call.
pub fn replay_digest(signature: &Digest) -> String {
    use sha2::Digest as _;
    plinth_kit::hex(&sha2::Sha256::digest(signature))
}

/// Until when a request signed at `at` (seconds) is accepted, in ms since the epoch: a
/// replay memory entry is needed that long and no longer, whether `t` is behind now or ahead.
pub fn accepted_until_ms(at: i64) -> i64 {
    at.saturating_add(TOLERANCE_SECONDS).saturating_mul(1000)
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

    #[test]
    fn a_signature_is_remembered_as_long_as_its_t_is_accepted_and_no_longer() {
        let now = 1_796_040_000;
        // Accepted until t + 300 s, whether t is behind now or ahead of it.
        for t in [now - 300, now, now + 300] {
            assert_eq!(accepted_until_ms(t), (t + TOLERANCE_SECONDS) * 1000);
            assert!(
                SignatureHeader::parse(Some(&format!("t={t},v1={}", "ab".repeat(32))), now).is_ok()
            );
            let after = (accepted_until_ms(t) / 1000) + 1;
            assert!(
                SignatureHeader::parse(Some(&format!("t={t},v1={}", "ab".repeat(32))), after)
                    .is_err()
            );
        }
        // What is kept is a digest of the signature, never the signature.
        let kept = replay_digest(&[7; 32]);
        assert_eq!(kept.len(), 64);
        assert_ne!(kept, plinth_kit::hex(&[7; 32]));
    }
}
