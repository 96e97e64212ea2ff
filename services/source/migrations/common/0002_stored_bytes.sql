-- Stored bytes per scope: each distinct blob a scope's sources and build layers hold, counted
-- once however many files, environments and layers hold it.
--
-- Which scope a source belongs to, and whether its files are counted in that scope's ledger
-- (a source an earlier version wrote is counted the first time a request names its scope).
ALTER TABLE source_environments ADD COLUMN scope TEXT NOT NULL DEFAULT '';
ALTER TABLE source_environments ADD COLUMN counted BIGINT NOT NULL DEFAULT 0;

-- Per scope, each distinct blob it holds and how many hold it: each file of a source is one
-- holder, each recorded layer that holds the blob is one, however many of its files do.
CREATE TABLE scope_blobs (
    scope    TEXT    NOT NULL,
    digest   TEXT    NOT NULL,
    size     BIGINT  NOT NULL,
    holders  BIGINT  NOT NULL CHECK (holders > 0),
    PRIMARY KEY (scope, digest)
);

-- Per scope, the bytes of its distinct blobs: the sum of its `scope_blobs` sizes, changed in
-- the same transaction as they are. Every change of a scope's blobs takes this row first, so
-- the changes of one scope take turns (on every replica) and the quota is checked against
-- what the previous change committed.
CREATE TABLE scope_stored_bytes (
    scope  TEXT    NOT NULL PRIMARY KEY,
    bytes  BIGINT  NOT NULL DEFAULT 0
);

-- The layers builders recorded: one per environment and version, from the latest attempt.
CREATE TABLE source_layers (
    environment_id  TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    attempt         BIGINT  NOT NULL,
    scope           TEXT    NOT NULL,
    layer_tree      TEXT    NOT NULL,
    PRIMARY KEY (environment_id, version)
);
CREATE INDEX source_layers_tree ON source_layers (layer_tree);

-- Each recorded layer tree's distinct file blobs, read from the tree once: what its layers
-- hold, and what forgetting one lets go of (the tree's own blob may be gone by then).
CREATE TABLE layer_blobs (
    layer_tree  TEXT    NOT NULL,
    digest      TEXT    NOT NULL,
    size        BIGINT  NOT NULL,
    PRIMARY KEY (layer_tree, digest)
);
