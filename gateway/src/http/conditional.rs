//! Conditional and range requests on file reads and writes (RFC 9110 §13, §14), for the
//! environment files and the session files alike: the `ETag` a file is answered with,
//! `If-Match` and `If-None-Match` on reads (`304`, `412`) and writes (`412`, the check itself
//! made by the service that writes), and one byte range per read (`206`, `416`).
//!
//! A file's entity tag is its content digest in quotes, `"sha256:<hex>"`: a strong validator
//! (two answers with one tag are byte for byte the same), so a tag from a read is a safe
//! `If-Match` for a write and a safe `If-Range` for resuming a download.
//!
//! Only one range per request is answered as `206`: a request for several ranges gets the
//! whole file (`200`), which RFC 9110 allows, and which no download resumer needs otherwise.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::source::v1 as source;

use crate::http::error::ApiError;

/// The entity tag of a file with this content digest.
pub fn etag(digest: &str) -> String {
    format!("\"{digest}\"")
}

/// The entity tag of bytes in hand: their SHA-256, as a stored file's digest is written.
pub fn content_etag(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    etag(&format!(
        "sha256:{}",
        plinth_kit::hex(&sha2::Sha256::digest(bytes))
    ))
}

/// One entity tag of a request's list.
#[derive(Debug, PartialEq, Eq)]
struct Tag<'a> {
    weak: bool,
    /// Between the quotes.
    opaque: &'a str,
}

/// `*`, or a list of entity tags.
#[derive(Debug, PartialEq, Eq)]
enum TagList<'a> {
    Any,
    Tags(Vec<Tag<'a>>),
}

impl TagList<'_> {
    /// Whether the list names the file whose tag is `current` (`None`: no file), comparing
    /// strongly (both strong and the same) or weakly (the same text, weak or not).
    fn matches(&self, current: Option<&str>, strong: bool) -> bool {
        let Some(current) = current else {
            return false;
        };
        match self {
            TagList::Any => true,
            TagList::Tags(tags) => tags
                .iter()
                .any(|tag| tag.opaque == current && !(strong && tag.weak)),
        }
    }
}

/// Parses `*` or `#entity-tag` (RFC 9110 §8.8.3); `None` when it is neither.
fn parse_list(value: &str) -> Option<TagList<'_>> {
    let value = value.trim();
    if value == "*" {
        return Some(TagList::Any);
    }
    let mut tags = Vec::new();
    let mut rest = value;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            break;
        }
        let (weak, quoted) = match rest.strip_prefix("W/") {
            Some(quoted) => (true, quoted),
            None => (false, rest),
        };
        let inner = quoted.strip_prefix('"')?;
        let end = inner.find('"')?;
        tags.push(Tag {
            weak,
            opaque: &inner[..end],
        });
        rest = &inner[end + 1..];
        // Only whitespace may come before the next comma.
        let next = rest.trim_start_matches([' ', '\t']);
        if !next.is_empty() && !next.starts_with(',') {
            return None;
        }
    }
    // An empty list (`If-None-Match:` with nothing, or only commas) is a list of no tags, as
    // RFC 9110 §5.6.1 reads `#entity-tag`: it names no file, so `If-Match` with it never
    // holds and `If-None-Match` with it always does.
    Some(TagList::Tags(tags))
}

/// Every line of a list header, joined as RFC 9110 §5.3 allows; `None` when absent.
fn header_text(headers: &HeaderMap, name: &HeaderName) -> Result<Option<String>, PlinthError> {
    let mut lines = Vec::new();
    for value in headers.get_all(name) {
        let text = value.to_str().map_err(|_| {
            PlinthError::invalid(format!(
                "{name}: not visible ASCII; send entity tags such as \"sha256:…\" from an ETag"
            ))
        })?;
        lines.push(text);
    }
    Ok((!lines.is_empty()).then(|| lines.join(", ")))
}

/// A header's entity tags; a header that is not a list of them is refused rather than
/// ignored, since ignoring a precondition would overwrite what the caller meant to protect.
fn tag_header<'a>(name: &HeaderName, text: &'a str) -> Result<TagList<'a>, PlinthError> {
    parse_list(text).ok_or_else(|| {
        PlinthError::invalid(format!(
            "{name}: {text:?} is not `*` or a list of quoted entity tags; send the ETag exactly as a read answered it, quotes included (\"sha256:…\")"
        ))
    })
}

/// `precondition_failed` for a read whose `If-Match` does not name the file.
fn read_precondition_failed(current: &str) -> PlinthError {
    PlinthError::new(
        ErrorCode::PreconditionFailed,
        format!(
            "the file changed since you read it: its ETag is now {current}; read it again without If-Match"
        ),
    )
    .with_detail(serde_json::json!({ "etag": current }))
}

/// Bytes `start..=end` of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    /// The first byte.
    pub start: u64,
    /// The last byte, included.
    pub end: u64,
}

impl ByteRange {
    /// How many bytes.
    pub fn len(self) -> u64 {
        self.end - self.start + 1
    }
}

/// How a read is answered once its conditions are weighed.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadAnswer {
    /// `304`: the caller's copy is current.
    NotModified,
    /// `200` with the whole file.
    Full,
    /// `206` with one range.
    Partial(ByteRange),
    /// `416`: the range starts at or past the end.
    Unsatisfiable,
}

/// Weighs a read's `If-Match`, `If-None-Match`, `If-Range` and `Range` against the file's
/// tag and size, in RFC 9110 §13.2.2's order. `Err` is `412` (`If-Match` does not hold) or
/// `400` (a condition header that is not a list of entity tags).
pub fn weigh_read(headers: &HeaderMap, etag: &str, size: u64) -> Result<ReadAnswer, PlinthError> {
    let current = etag.trim_matches('"');
    if let Some(text) = header_text(headers, &header::IF_MATCH)?
        && !tag_header(&header::IF_MATCH, &text)?.matches(Some(current), true)
    {
        return Err(read_precondition_failed(etag));
    }
    if let Some(text) = header_text(headers, &header::IF_NONE_MATCH)?
        && tag_header(&header::IF_NONE_MATCH, &text)?.matches(Some(current), false)
    {
        return Ok(ReadAnswer::NotModified);
    }
    let Some(range) = headers.get(header::RANGE) else {
        return Ok(ReadAnswer::Full);
    };
    // `If-Range` holds only for the same strong tag; a date (this API sends no
    // Last-Modified) or another tag means the caller's part is stale: the whole file.
    if let Some(if_range) = headers.get(header::IF_RANGE) {
        let fresh = if_range
            .to_str()
            .ok()
            .and_then(parse_list)
            .is_some_and(|list| {
                matches!(&list, TagList::Tags(tags) if tags.len() == 1)
                    && list.matches(Some(current), true)
            });
        if !fresh {
            return Ok(ReadAnswer::Full);
        }
    }
    Ok(
        match range.to_str().ok().map(|text| parse_range(text, size)) {
            Some(RangeRequest::One(range)) => ReadAnswer::Partial(range),
            Some(RangeRequest::Unsatisfiable) => ReadAnswer::Unsatisfiable,
            // An unknown unit, several ranges or a malformed header: RFC 9110 §14.2 lets the
            // server ignore it, and the whole file is always a right answer.
            Some(RangeRequest::Ignored) | None => ReadAnswer::Full,
        },
    )
}

/// What a `Range` header asks of a file of `size` bytes.
#[derive(Debug, PartialEq, Eq)]
enum RangeRequest {
    One(ByteRange),
    Unsatisfiable,
    Ignored,
}

fn parse_range(text: &str, size: u64) -> RangeRequest {
    let Some(spec) = text.trim().strip_prefix("bytes=") else {
        return RangeRequest::Ignored;
    };
    let spec = spec.trim();
    if spec.contains(',') {
        return RangeRequest::Ignored;
    }
    let Some((first, last)) = spec.split_once('-') else {
        return RangeRequest::Ignored;
    };
    let number = |text: &str| -> Option<u64> {
        let text = text.trim();
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse().ok())
            .flatten()
    };
    if first.trim().is_empty() {
        // `bytes=-n`: the last n bytes.
        return match number(last) {
            None => RangeRequest::Ignored,
            Some(0) => RangeRequest::Unsatisfiable,
            Some(_) if size == 0 => RangeRequest::Unsatisfiable,
            Some(suffix) => RangeRequest::One(ByteRange {
                start: size - suffix.min(size),
                end: size - 1,
            }),
        };
    }
    let Some(start) = number(first) else {
        return RangeRequest::Ignored;
    };
    let end = if last.trim().is_empty() {
        None
    } else {
        match number(last) {
            Some(end) if end >= start => Some(end),
            _ => return RangeRequest::Ignored,
        }
    };
    if start >= size {
        return RangeRequest::Unsatisfiable;
    }
    RangeRequest::One(ByteRange {
        start,
        end: end.map_or(size - 1, |end| end.min(size - 1)),
    })
}

/// `304 Not Modified`: the tag and nothing else.
pub fn not_modified(etag: &str) -> Response {
    let mut response = StatusCode::NOT_MODIFIED.into_response();
    if let Ok(value) = HeaderValue::from_str(etag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

/// `416 range_not_satisfiable`, with `Content-Range: bytes */<size>` for the caller to
/// correct its range.
pub fn unsatisfiable(size: u64) -> Response {
    let mut response = ApiError(PlinthError::new(
        ErrorCode::RangeNotSatisfiable,
        format!("the range starts at or past the end of the file, which has {size} bytes"),
    ))
    .into_response();
    if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
        response.headers_mut().insert(header::CONTENT_RANGE, value);
    }
    response
}

/// Sets the status and headers of a `200` (`range: None`) or `206` answer of a file: its
/// tag, `Accept-Ranges`, the length of what is sent, and for a part its `Content-Range`.
pub fn mark_answer(response: &mut Response, etag: &str, size: u64, range: Option<ByteRange>) {
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    match range {
        None => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
        }
        Some(range) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(range.len()));
            if let Ok(value) =
                HeaderValue::from_str(&format!("bytes {}-{}/{size}", range.start, range.end))
            {
                headers.insert(header::CONTENT_RANGE, value);
            }
            *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        }
    }
}

/// The bytes of `range` out of a file's stream of chunks, as they pass: nothing before the
/// range is kept, and the stream is dropped (its call cancelled) once the range is sent.
pub fn slice<E>(
    chunks: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    range: ByteRange,
) -> impl Stream<Item = Result<Bytes, E>> + Send + 'static
where
    E: Send + 'static,
{
    chunks
        .scan(0u64, move |position, chunk| {
            let at = *position;
            if at > range.end {
                return futures::future::ready(None);
            }
            let item = chunk.map(|chunk| {
                let length = chunk.len() as u64;
                *position = at + length;
                let from = range.start.saturating_sub(at).min(length);
                let to = (range.end + 1).saturating_sub(at).min(length);
                // Both are at most `chunk.len()`, a usize.
                chunk.slice(from as usize..to.max(from) as usize)
            });
            futures::future::ready(Some(item))
        })
        .filter(|item| futures::future::ready(!matches!(item, Ok(chunk) if chunk.is_empty())))
}

/// The preconditions of a file write, for the source to check as it writes: `If-Match`
/// (strong comparison, so a weak tag names no file) and `If-None-Match` (weak comparison).
/// `None` when the request has neither.
pub fn write_precondition(
    headers: &HeaderMap,
) -> Result<Option<source::WritePrecondition>, PlinthError> {
    let condition = |name: &HeaderName, strong: bool| -> Result<_, PlinthError> {
        let Some(text) = header_text(headers, name)? else {
            return Ok(None);
        };
        Ok(Some(match tag_header(name, &text)? {
            TagList::Any => source::DigestCondition {
                any: true,
                digests: Vec::new(),
            },
            TagList::Tags(tags) => source::DigestCondition {
                any: false,
                digests: tags
                    .into_iter()
                    .filter(|tag| !(strong && tag.weak))
                    .map(|tag| tag.opaque.to_owned())
                    .collect(),
            },
        }))
    };
    let if_match = condition(&header::IF_MATCH, true)?;
    let if_none_match = condition(&header::IF_NONE_MATCH, false)?;
    Ok(
        (if_match.is_some() || if_none_match.is_some()).then_some(source::WritePrecondition {
            if_match,
            if_none_match,
        }),
    )
}

/// Adds the `ETag` that a `412` names in its detail, so a client can retry with it.
pub fn precondition_failed_response(error: ApiError) -> Response {
    let etag = (error.0.code == ErrorCode::PreconditionFailed)
        .then(|| {
            error
                .0
                .detail
                .as_ref()
                .and_then(|detail| detail.get("etag"))
                .and_then(serde_json::Value::as_str)
                .and_then(|etag| HeaderValue::from_str(etag).ok())
        })
        .flatten();
    let mut response = error.into_response();
    if let Some(etag) = etag {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: &str = "\"sha256:aa\"";

    fn headers(pairs: &[(HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name, HeaderValue::from_str(value).expect("header"));
        }
        map
    }

    fn read(pairs: &[(HeaderName, &str)], size: u64) -> Result<ReadAnswer, PlinthError> {
        weigh_read(&headers(pairs), TAG, size)
    }

    fn range(start: u64, end: u64) -> ReadAnswer {
        ReadAnswer::Partial(ByteRange { start, end })
    }

    #[test]
    fn if_none_match_compares_weakly_across_a_list_and_star() {
        for matching in [
            TAG,
            "*",
            "W/\"sha256:aa\"",
            "\"other\", \"sha256:aa\"",
            "\"a,b\" ,W/\"sha256:aa\"",
        ] {
            assert_eq!(
                read(&[(header::IF_NONE_MATCH, matching)], 10),
                Ok(ReadAnswer::NotModified),
                "{matching}"
            );
        }
        assert_eq!(
            read(&[(header::IF_NONE_MATCH, "\"sha256:bb\"")], 10),
            Ok(ReadAnswer::Full)
        );
        // Two header lines are one list.
        assert_eq!(
            read(
                &[
                    (header::IF_NONE_MATCH, "\"x\""),
                    (header::IF_NONE_MATCH, TAG)
                ],
                10
            ),
            Ok(ReadAnswer::NotModified)
        );
        let refused = read(&[(header::IF_NONE_MATCH, "sha256:aa")], 10).expect_err("unquoted");
        assert_eq!(refused.code, ErrorCode::EnvironmentInvalid);
        assert!(refused.message.contains("quotes"), "{}", refused.message);
    }

    #[test]
    fn bytes_in_hand_are_tagged_as_a_stored_file_is() {
        assert_eq!(
            content_etag(b""),
            "\"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\""
        );
    }

    #[test]
    fn an_empty_list_names_no_file() {
        for empty in ["", " ", ", ,"] {
            assert_eq!(
                read(&[(header::IF_NONE_MATCH, empty)], 10),
                Ok(ReadAnswer::Full),
                "If-None-Match: {empty:?}"
            );
            assert_eq!(
                read(&[(header::IF_MATCH, empty)], 10).map_err(|error| error.code),
                Err(ErrorCode::PreconditionFailed),
                "If-Match: {empty:?}"
            );
            let condition = write_precondition(&headers(&[(header::IF_NONE_MATCH, empty)]))
                .expect("a list")
                .and_then(|condition| condition.if_none_match)
                .expect("a condition");
            assert!(!condition.any && condition.digests.is_empty());
        }
        assert!(read(&[(header::IF_NONE_MATCH, "sha256:aa")], 10).is_err());
    }

    #[test]
    fn if_match_on_a_read_compares_strongly() {
        assert_eq!(read(&[(header::IF_MATCH, TAG)], 10), Ok(ReadAnswer::Full));
        for stale in ["W/\"sha256:aa\"", "\"sha256:bb\""] {
            let refused = read(&[(header::IF_MATCH, stale)], 10).expect_err(stale);
            assert_eq!(refused.code, ErrorCode::PreconditionFailed);
            assert!(refused.message.contains(TAG), "{}", refused.message);
        }
    }

    #[test]
    fn each_single_range_form_answers_its_bytes() {
        let cases = [
            ("bytes=0-0", range(0, 0)),
            ("bytes=2-5", range(2, 5)),
            ("bytes=2-", range(2, 9)),
            ("bytes=7-100", range(7, 9)),
            ("bytes=-3", range(7, 9)),
            ("bytes=-30", range(0, 9)),
            ("bytes=10-", ReadAnswer::Unsatisfiable),
            ("bytes=10-20", ReadAnswer::Unsatisfiable),
            ("bytes=-0", ReadAnswer::Unsatisfiable),
            // Ignored: several ranges, another unit, nonsense, a backwards range.
            ("bytes=0-1,4-5", ReadAnswer::Full),
            ("items=0-1", ReadAnswer::Full),
            ("bytes=a-b", ReadAnswer::Full),
            ("bytes=5-2", ReadAnswer::Full),
            ("bytes=+1-2", ReadAnswer::Full),
        ];
        for (header_value, expected) in cases {
            assert_eq!(
                read(&[(header::RANGE, header_value)], 10),
                Ok(expected),
                "{header_value}"
            );
        }
        assert_eq!(
            read(&[(header::RANGE, "bytes=0-")], 0),
            Ok(ReadAnswer::Unsatisfiable)
        );
    }

    #[test]
    fn if_range_answers_the_part_only_for_the_same_strong_tag() {
        let part = [(header::RANGE, "bytes=4-"), (header::IF_RANGE, TAG)];
        assert_eq!(read(&part, 10), Ok(range(4, 9)));
        for stale in [
            "\"sha256:bb\"",
            "W/\"sha256:aa\"",
            "Wed, 21 Oct 2015 07:28:00 GMT",
        ] {
            assert_eq!(
                read(
                    &[(header::RANGE, "bytes=4-"), (header::IF_RANGE, stale)],
                    10
                ),
                Ok(ReadAnswer::Full),
                "{stale}"
            );
        }
    }

    #[test]
    fn a_slice_takes_only_the_range_across_chunk_boundaries() {
        let chunks: Vec<Result<Bytes, ()>> = vec![
            Ok(Bytes::from_static(b"0123")),
            Ok(Bytes::from_static(b"4567")),
            Ok(Bytes::from_static(b"89")),
        ];
        for (start, end, expected) in [
            (0, 9, "0123456789"),
            (3, 4, "34"),
            (4, 7, "4567"),
            (9, 9, "9"),
            (0, 0, "0"),
        ] {
            let sliced = futures::executor::block_on(
                slice(
                    futures::stream::iter(chunks.clone()),
                    ByteRange { start, end },
                )
                .collect::<Vec<_>>(),
            );
            let joined: Vec<u8> = sliced
                .into_iter()
                .flat_map(|chunk| chunk.expect("chunk").to_vec())
                .collect();
            assert_eq!(joined, expected.as_bytes(), "{start}-{end}");
        }
    }

    #[test]
    fn write_preconditions_become_the_sources_digest_conditions() {
        assert_eq!(write_precondition(&HeaderMap::new()), Ok(None));
        let condition = write_precondition(&headers(&[
            (header::IF_MATCH, "\"sha256:aa\", W/\"sha256:bb\""),
            (header::IF_NONE_MATCH, "*"),
        ]))
        .expect("parsed")
        .expect("some");
        assert_eq!(
            condition.if_match,
            Some(source::DigestCondition {
                any: false,
                digests: vec!["sha256:aa".to_owned()],
            })
        );
        assert_eq!(
            condition.if_none_match,
            Some(source::DigestCondition {
                any: true,
                digests: Vec::new(),
            })
        );
        assert!(write_precondition(&headers(&[(header::IF_MATCH, "sha256:aa")])).is_err());
    }
}
