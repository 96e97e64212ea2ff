-- Symlinks in the index: kind 'symlink' with its target, which imports checked stays inside
-- the root (see `links.rs`). The constraints are replaced, keeping their names.
ALTER TABLE source_entries ADD COLUMN target TEXT NOT NULL DEFAULT '';
ALTER TABLE source_entries DROP CONSTRAINT source_entries_kind_check;
ALTER TABLE source_entries DROP CONSTRAINT source_entries_check;
ALTER TABLE source_entries ADD CONSTRAINT source_entries_kind_check
    CHECK (kind IN ('file', 'dir', 'symlink'));
ALTER TABLE source_entries ADD CONSTRAINT source_entries_check
    CHECK ((kind = 'file' AND length(digest) = 71 AND target = '')
        OR (kind = 'dir' AND digest = '' AND target = '')
        OR (kind = 'symlink' AND digest = '' AND size = 0 AND target <> ''));

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
