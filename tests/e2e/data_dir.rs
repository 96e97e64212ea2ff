//! The data directory as another local user meets it: `plinth serve` makes it `0700` (and
//! narrows one it owns that was open to others), and its databases `0600`, so a user of the
//! same host reads nothing of any tenant's source, catalog or sessions' files, while the
//! server goes on serving them.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use crate::helpers::{Server, create_environment, put_file};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// `command` run as `nobody` (uid and gid 65534, no supplementary groups): whether it
/// succeeded, and what it said.
fn as_another_user(command: &[&str]) -> (bool, String) {
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(command)
        .output()
        .expect("run setpriv");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[tokio::test]
async fn another_local_user_reads_nothing_under_the_data_directory() {
    // Another uid is needed to be the other user.
    if !crate::helpers::can_build() {
        return;
    }
    // A data directory left open to everyone, as an earlier version made it.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let data = dir.path().to_owned();
    let server = Server::start_in(dir, &[]).await;
    let id = create_environment(&server, "Private").await;
    put_file(&server, &id, "secret.txt", "tenant secret\n").await;

    assert_eq!(mode(&data), 0o700, "the data directory is private");
    for database in ["catalog.db", "source.db"] {
        let path = data.join(database);
        assert_eq!(mode(&path), 0o600, "{database}");
        for companion in ["-wal", "-shm"] {
            let file = data.join(format!("{database}{companion}"));
            if file.exists() {
                assert_eq!(mode(&file) & 0o077, 0, "{}", file.display());
            }
        }
    }

    // The other user, trying every way in by name: listing, reading the databases, finding
    // the blob that holds the file.
    let data_str = data.to_str().expect("utf-8");
    for command in [
        vec!["ls", data_str],
        vec!["cat", &format!("{data_str}/catalog.db")],
        vec!["cat", &format!("{data_str}/source.db")],
        vec!["find", data_str, "-type", "f"],
        vec!["grep", "-r", "tenant secret", data_str],
    ] {
        let (ok, said) = as_another_user(&command);
        assert!(!ok, "{command:?} succeeded as another user: {said}");
        assert!(!said.contains("tenant secret"), "{command:?}: {said}");
    }

    // The server itself still reads and serves it.
    let read = server
        .client
        .get(server.url(&format!("/v1/environments/{id}/files/secret.txt")))
        .send()
        .await
        .expect("read");
    assert_eq!(read.status(), 200);
    assert_eq!(read.text().await.expect("text"), "tenant secret\n");
    server.stop().await;
}
