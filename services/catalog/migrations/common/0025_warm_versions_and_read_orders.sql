-- When each environment's active version became active (ms since the epoch; 0 for none), so
-- a heartbeat that answers a node its active list also answers the versions to hold warm, the
-- most recently activated first, from an index (`catalog.prewarm_versions` of them at most)
-- rather than by sorting every environment. Environments active before this migration count
-- as activated at their last change.
ALTER TABLE environments ADD COLUMN activated_at_ms BIGINT NOT NULL DEFAULT 0;
UPDATE environments SET activated_at_ms = updated_at_ms WHERE active_version IS NOT NULL;
CREATE INDEX environments_activated ON environments (activated_at_ms DESC, id)
    WHERE active_version IS NOT NULL;

-- Which files the first sessions of a version read, in the order they first read them: the
-- first recording is kept and never replaced (a version never changes, nor what it is read
-- for). The paths are read whole, so they are one text: joined by newlines, a backslash and a
-- newline within a path escaped as `\\` and `\n`. A version's read order goes with it (its
-- environment deleted, or the version retired).
CREATE TABLE read_orders (
    environment_id  TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    paths           TEXT    NOT NULL,
    path_count      BIGINT  NOT NULL,
    node_id         TEXT    NOT NULL,
    recorded_at_ms  BIGINT  NOT NULL,
    PRIMARY KEY (environment_id, version),
    FOREIGN KEY (environment_id, version) REFERENCES builds (environment_id, version) ON DELETE CASCADE
);
