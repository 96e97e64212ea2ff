-- Symlinks in the index: kind 'symlink' with its target, which imports checked stays inside
-- the root (see `links.rs`). SQLite cannot change a CHECK constraint, so the table is made
-- anew with the same rows, and its index with it.
CREATE TABLE source_entries_new (
    environment_id  TEXT    NOT NULL,
    path            TEXT    NOT NULL,
    kind            TEXT    NOT NULL CHECK (kind IN ('file', 'dir', 'symlink')),
    digest          TEXT    NOT NULL DEFAULT '',
    size            BIGINT  NOT NULL DEFAULT 0,
    executable      BIGINT  NOT NULL DEFAULT 0,
    target          TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (environment_id, path),
    CHECK ((kind = 'file' AND length(digest) = 71 AND target = '')
        OR (kind = 'dir' AND digest = '' AND target = '')
        OR (kind = 'symlink' AND digest = '' AND size = 0 AND target <> ''))
);
INSERT INTO source_entries_new (environment_id, path, kind, digest, size, executable)
    SELECT environment_id, path, kind, digest, size, executable FROM source_entries;
DROP TABLE source_entries;
ALTER TABLE source_entries_new RENAME TO source_entries;
CREATE INDEX source_entries_digest ON source_entries (digest) WHERE kind = 'file';

-- Where an environment's source last came from by git: the commit (full id), the ref asked
-- for, and `git describe --tags --always`. Builders read it to give installers a version
-- (setuptools-scm, hatch-vcs). The last git import writes it; an archive import with
-- `replace` forgets it; edits keep it. The URL is not kept (it may carry credentials).
CREATE TABLE source_origins (
    environment_id  TEXT    NOT NULL PRIMARY KEY,
    commit_id       TEXT    NOT NULL CHECK (length(commit_id) IN (40, 64)),
    reference       TEXT    NOT NULL DEFAULT '',
    describe        TEXT    NOT NULL DEFAULT ''
);
