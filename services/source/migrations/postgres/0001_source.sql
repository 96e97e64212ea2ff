-- One row per environment that has a source: its file statistics, and a generation that
-- every write bumps. Bumping it first in a write transaction serializes the writers of one
-- environment (a row lock on PostgreSQL; SQLite has one writer anyway), so file/directory
-- checks and statistics never race.
CREATE TABLE source_environments (
    environment_id  TEXT    NOT NULL PRIMARY KEY,
    files_count     BIGINT  NOT NULL DEFAULT 0,
    files_bytes     BIGINT  NOT NULL DEFAULT 0,
    generation      BIGINT  NOT NULL DEFAULT 0
);

-- The index: one row per file or directory. Paths compare byte-wise, so a directory's
-- subtree is the range [dir/, dir0).
CREATE TABLE source_entries (
    environment_id  TEXT    NOT NULL,
    path            TEXT    COLLATE "C" NOT NULL,
    kind            TEXT    NOT NULL CHECK (kind IN ('file', 'dir')),
    digest          TEXT    NOT NULL DEFAULT '',
    size            BIGINT  NOT NULL DEFAULT 0,
    executable      BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (environment_id, path),
    CHECK ((kind = 'file' AND length(digest) = 71) OR (kind = 'dir' AND digest = ''))
);
