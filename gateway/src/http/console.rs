//! The web console: the files of `gateway/console/`, built into the binary, served at
//! `/console/` (and `/console`, which redirects there). Nothing else is needed to run it:
//! no file on disk, no other origin (its scripts, styles and xterm.js are among these files).
//!
//! Every answer carries a strict `Content-Security-Policy`: scripts, styles and connections
//! only from this origin (and its WebSockets, the terminal), no inline script, no frames
//! around it. The console's requests to the API are same-origin (`browsers.rs` treats the
//! server's own origin as allowed), authenticated with a bearer token the page keeps in
//! `sessionStorage`; the terminal uses a ticket (`rest/terminal.rs`).

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use include_dir::{Dir, include_dir};

/// The console's files.
static CONSOLE: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/console");

/// What the console's pages may load and connect to: this origin only.
pub const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; font-src 'self'; connect-src 'self' ws: wss:; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The console's routes.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(|| async { file("index.html") }))
        .route(
            "/console/{*path}",
            get(|Path(path): Path<String>| async move { file(&path) }),
        )
}

/// One of the console's files, or `404`.
fn file(path: &str) -> Response {
    let found = (!path
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == ".."))
    .then(|| CONSOLE.get_file(path))
    .flatten();
    let Some(found) = found else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such file in the console\n",
        )
            .into_response();
    };
    let kind = mime_guess::from_path(path).first_or_octet_stream();
    let kind = match kind.type_() {
        mime_guess::mime::TEXT | mime_guess::mime::APPLICATION
            if kind.get_param("charset").is_none()
                && matches!(
                    kind.subtype().as_str(),
                    "html" | "css" | "javascript" | "plain" | "json"
                ) =>
        {
            format!("{kind}; charset=utf-8")
        }
        _ => kind.to_string(),
    };
    let mut response = found.contents().into_response();
    let headers = response.headers_mut();
    if let Ok(kind) = HeaderValue::from_str(&kind) {
        headers.insert(header::CONTENT_TYPE, kind);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // The files change with the binary: a page always asks again (and gets the same bytes).
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_is_its_files_with_a_strict_policy_and_nothing_outside_them() {
        let index = file("index.html");
        assert_eq!(index.status(), StatusCode::OK);
        let headers = index.headers();
        assert_eq!(
            headers[header::CONTENT_TYPE].to_str().expect("ascii"),
            "text/html; charset=utf-8"
        );
        assert_eq!(headers[header::CONTENT_SECURITY_POLICY], POLICY);
        assert!(POLICY.contains("script-src 'self';") && !POLICY.contains("unsafe"));
        for outside in [
            "../Cargo.toml",
            "",
            "a//b",
            "./index.html",
            "nope.js",
            "src/lib.rs",
        ] {
            assert_eq!(file(outside).status(), StatusCode::NOT_FOUND, "{outside}");
        }
    }
}
