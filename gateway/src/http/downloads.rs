//! How a file's bytes are answered, from an environment or a session: with a content type
//! guessed from its name, never sniffed, and, for the types a browser would run (HTML, SVG,
//! JavaScript, XHTML, XML that may carry script), as an attachment. A file an agent or a
//! project wrote is someone else's content: opened in a browser from the API's origin, it must
//! not run there with the API's cookies and origin.

use axum::http::{HeaderMap, HeaderValue, header};

/// A content type a browser may render and run script in, when navigated to.
pub fn runs_in_a_browser(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let Some((kind, subtype)) = essence.split_once('/') else {
        // Not a content type at all: let the browser treat it as nothing it may run.
        return true;
    };
    let scripted = [
        "html",
        "xml",
        "javascript",
        "ecmascript",
        "x-javascript",
        "x-ecmascript",
        "jscript",
        "livescript",
        "vbscript",
        "xsl",
        "xslt",
        "pdf",
        "x-shockwave-flash",
    ];
    subtype.ends_with("+xml")
        || scripted.contains(&subtype)
        || (kind == "text" && subtype.starts_with("x-") && subtype.ends_with("script"))
        || kind == "multipart"
}

/// Adds the download headers to a file's answer: `X-Content-Type-Options: nosniff` and a
/// sandboxing `Content-Security-Policy` always, `Content-Disposition: attachment` (with the
/// file's name) for the types [`runs_in_a_browser`].
pub fn mark(headers: &mut HeaderMap, path: &str) {
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if runs_in_a_browser(content_type) {
        headers.insert(header::CONTENT_DISPOSITION, attachment(path));
    }
}

/// `attachment; filename="…"; filename*=UTF-8''…` for the last component of `path` (RFC 6266:
/// the quoted name in plain ASCII, the exact name percent-encoded).
fn attachment(path: &str) -> HeaderValue {
    let name = path.rsplit('/').next().unwrap_or_default();
    let plain: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' && c != '%' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut encoded = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    HeaderValue::from_str(&format!(
        "attachment; filename=\"{plain}\"; filename*=UTF-8''{encoded}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_browser_would_run_is_an_attachment() {
        for active in [
            "text/html",
            "text/html; charset=utf-8",
            "image/svg+xml",
            "application/xhtml+xml",
            "text/javascript",
            "application/javascript",
            "application/xml",
            "text/xml",
            "application/rss+xml",
            "application/xslt+xml",
            "application/pdf",
            "TEXT/HTML",
            "nonsense",
        ] {
            assert!(runs_in_a_browser(active), "{active}");
        }
        for inert in [
            "text/plain",
            "application/json",
            "application/octet-stream",
            "image/png",
            "text/css",
            "text/x-python",
            "application/wasm",
        ] {
            assert!(!runs_in_a_browser(inert), "{inert}");
        }
    }

    #[test]
    fn the_name_is_given_safely() {
        assert_eq!(
            attachment("site/index.html"),
            "attachment; filename=\"index.html\"; filename*=UTF-8''index.html"
        );
        assert_eq!(
            attachment("a/\"x y\"\u{e9}.svg"),
            "attachment; filename=\"_x_y__.svg\"; filename*=UTF-8''%22x%20y%22%C3%A9.svg"
        );
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        mark(&mut headers, "notes.txt");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert!(headers.get(header::CONTENT_DISPOSITION).is_none());
    }
}
