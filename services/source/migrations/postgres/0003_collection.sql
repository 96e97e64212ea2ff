-- Garbage collection of the blob store (see `gc.rs`).
--
-- Work that writes blobs (an upload, an import, a snapshot) holds them before it names them,
-- until what names them is committed: a collection keeps every blob held by work that has
-- not expired. Work renews itself while it runs; a holder that died stops renewing, and its
-- holds lapse with it. `tree` = 1 holds everything the tree names too.
CREATE TABLE blob_work (
    work_id        TEXT    NOT NULL PRIMARY KEY,
    expires_at_ms  BIGINT  NOT NULL
);
CREATE TABLE blob_holds (
    work_id  TEXT    NOT NULL,
    digest   TEXT    NOT NULL,
    tree     BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (work_id, digest)
);

-- `pass`: the lease of the one collection pass running across replicas (`holder`, until
-- when). `fence`: raised while a collection round deletes; no hold is taken while it stands
-- (a hold's transaction reads the row FOR SHARE, the round's UPDATE waits for it).
CREATE TABLE collection_state (
    name      TEXT    NOT NULL PRIMARY KEY,
    holder    TEXT    NOT NULL DEFAULT '',
    until_ms  BIGINT  NOT NULL DEFAULT 0
);
INSERT INTO collection_state (name) VALUES ('pass'), ('fence');

-- Which files name a blob: a collection asks about the blobs it would take.
CREATE INDEX source_entries_digest ON source_entries (digest) WHERE kind = 'file';
