-- Garbage collection and retention.
--
-- Blobs a leased build is about to rely on (its layer's files and tree, a layer it reuses),
-- held until the build ends: a collection round keeps every blob held by a build whose lease
-- is live. `tree` = 1 holds everything the tree names too.
CREATE TABLE build_holds (
    lease_token  TEXT    NOT NULL,
    digest       TEXT    NOT NULL,
    tree         BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (lease_token, digest)
);

-- The fence a collection round raises while it deletes: no hold is taken while it stands
-- (a hold and the round's UPDATE of this row are both writes, and SQLite has one writer), so every
-- hold is either seen by the round or taken after its deletes.
CREATE TABLE collection_fence (
    name      TEXT    NOT NULL PRIMARY KEY,
    until_ms  BIGINT  NOT NULL DEFAULT 0
);
INSERT INTO collection_fence (name, until_ms) VALUES ('blobs', 0);

-- Environments deleted here, so the source forgets their files even when the gateway that
-- deleted them stopped before telling it. Kept for the retention period.
CREATE TABLE deleted_environments (
    id             TEXT    NOT NULL PRIMARY KEY,
    deleted_at_ms  BIGINT  NOT NULL
);

-- What retention looks for, without scanning what it keeps.
CREATE INDEX sessions_ended ON sessions (ended_at_ms) WHERE status = 'ended';
CREATE INDEX tasks_session ON tasks (session_id);
CREATE INDEX adapter_runs_session ON adapter_runs (session_id);
CREATE INDEX brain_operations_finished ON brain_operations (finished_at_ms) WHERE state = 'finished';
CREATE INDEX brain_bindings_session ON brain_bindings (plinth_session_id) WHERE plinth_session_id <> '';
CREATE INDEX sessions_version ON sessions (environment_id, version) WHERE status = 'active';
