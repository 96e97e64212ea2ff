-- Builds: one row per version of an environment, and the build queue itself. A build is
-- queued, then building under a builder's lease, then ready or failed.
CREATE TABLE builds (
    environment_id      TEXT    NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    version             BIGINT  NOT NULL,
    status              TEXT    NOT NULL CHECK (status IN ('queued', 'building', 'ready', 'failed')),
    source_tree         TEXT    NOT NULL,
    layer_tree          TEXT    NOT NULL DEFAULT '',
    error               TEXT    NOT NULL DEFAULT '',
    packages            TEXT    NOT NULL DEFAULT '[]',
    package_count       BIGINT  NOT NULL DEFAULT 0,
    size                BIGINT  NOT NULL DEFAULT 0,
    attempt             BIGINT  NOT NULL DEFAULT 0,
    lease_token         TEXT    NOT NULL DEFAULT '',
    lease_expires_at_ms BIGINT  NOT NULL DEFAULT 0,
    builder             TEXT    NOT NULL DEFAULT '',
    log_bytes           BIGINT  NOT NULL DEFAULT 0,
    queued_at_ms        BIGINT  NOT NULL,
    started_at_ms       BIGINT  NOT NULL DEFAULT 0,
    finished_at_ms      BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (environment_id, version)
);

-- One build at a time per environment, in the schema: a second queued or running build of
-- the same environment cannot be inserted, however the requests race.
CREATE UNIQUE INDEX builds_one_in_flight ON builds (environment_id)
    WHERE status IN ('queued', 'building');
CREATE INDEX builds_queue ON builds (queued_at_ms, environment_id, version)
    WHERE status = 'queued';

-- A build's log, in the order its builder appended it; offsets are bytes of the whole log.
CREATE TABLE build_logs (
    environment_id  TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    start_offset    BIGINT  NOT NULL,
    chunk           TEXT    NOT NULL,
    PRIMARY KEY (environment_id, version, start_offset),
    FOREIGN KEY (environment_id, version) REFERENCES builds (environment_id, version) ON DELETE CASCADE
);
