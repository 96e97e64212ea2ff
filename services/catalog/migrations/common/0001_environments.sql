-- Environments: one row per environment. The slug is the mount path's last segment, so it is
-- unique per scope in the schema itself; concurrent creates cannot both win.
CREATE TABLE environments (
    id              TEXT    NOT NULL PRIMARY KEY,
    scope           TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    slug            TEXT    NOT NULL,
    description     TEXT    NOT NULL DEFAULT '',
    entry           TEXT    NOT NULL DEFAULT '',
    active_version  BIGINT,
    latest_version  BIGINT,
    files_count     BIGINT  NOT NULL DEFAULT 0,
    files_bytes     BIGINT  NOT NULL DEFAULT 0,
    created_at_ms   BIGINT  NOT NULL,
    updated_at_ms   BIGINT  NOT NULL,
    CHECK (length(id) = 37),
    CHECK (slug <> '')
);

CREATE UNIQUE INDEX environments_scope_slug ON environments (scope, slug);
CREATE INDEX environments_scope_created ON environments (scope, created_at_ms, id);
