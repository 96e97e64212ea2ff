//! The web console in a real headless Chromium (Debian's, driven by Playwright for Python)
//! against a real `plinth serve` with tokens on: `console.py` signs in, creates an
//! environment, imports a project archive, builds it and follows the log, edits a file (and
//! is refused a conflicting save), builds again, compares versions 1 and 2 (files and
//! packages), activates version 1, opens a terminal in a new session, runs
//! `python3 -c "print(6*7)"` and sees 42, resizes it, exits and sees the status, and ends the
//! session. It fails on any console error and on any request to another origin, and leaves a
//! screenshot of each page in `target/console-screenshots` (or `PLINTH_CONSOLE_SCREENSHOTS`).
//! The build installs a package from PyPI: under CI, which reaches it, this runs.

use std::process::Command;

use crate::helpers::Server;

#[tokio::test]
async fn an_owner_works_through_the_console_in_a_real_browser() {
    if !crate::helpers::can_build() || !crate::browsers::have_browser() {
        return;
    }
    let server = Server::start_with_tokens(&[("tok-console", "acme")], &[]).await;
    let shots = std::env::var_os("PLINTH_CONSOLE_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots")
        });
    let _ = std::fs::remove_dir_all(&shots);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/console.py");
    let base = server.base.clone();
    let into = shots.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .args([
                "--base-url",
                &base,
                "--token",
                "tok-console",
                "--require-file-diff",
            ])
            .arg("--screenshots")
            .arg(&into)
            .output()
            .expect("run python3")
    })
    .await
    .expect("browser");
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the console test failed:\n{said}");
    assert!(said.contains("console test passed"), "{said}");
    let screenshots = std::fs::read_dir(&shots)
        .expect("screenshots")
        .flatten()
        .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "png"))
        .count();
    assert!(
        screenshots >= 10,
        "{screenshots} screenshots in {}",
        shots.display()
    );
    server.stop().await;
}
