-- Node agents: one row per host, found again by name when the agent restarts.
CREATE TABLE nodes (
    id                TEXT    NOT NULL PRIMARY KEY,
    name              TEXT    NOT NULL,
    address           TEXT    NOT NULL,
    isolated          BIGINT  NOT NULL DEFAULT 1,
    registered_at_ms  BIGINT  NOT NULL,
    heartbeat_at_ms   BIGINT  NOT NULL
);
CREATE UNIQUE INDEX nodes_name ON nodes (name);

-- Sessions: what each reads is pinned here when it is created (environment, version, layer
-- tree) and never changes; the environment may be rebuilt or deleted meanwhile.
CREATE TABLE sessions (
    id                TEXT    NOT NULL PRIMARY KEY,
    scope             TEXT    NOT NULL,
    environment_id    TEXT    NOT NULL,
    environment_name  TEXT    NOT NULL,
    entry             TEXT    NOT NULL DEFAULT '',
    version           BIGINT  NOT NULL,
    slug              TEXT    NOT NULL,
    layer_tree        TEXT    NOT NULL,
    node_id           TEXT    NOT NULL REFERENCES nodes (id),
    harness_id        TEXT    NOT NULL DEFAULT '',
    workdir           TEXT    NOT NULL DEFAULT '',
    isolated          BIGINT  NOT NULL DEFAULT 1,
    status            TEXT    NOT NULL CHECK (status IN ('active', 'ended')),
    turns             BIGINT  NOT NULL DEFAULT 0,
    created_at_ms     BIGINT  NOT NULL,
    ended_at_ms       BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX sessions_live_on_node ON sessions (node_id) WHERE status = 'active';

-- Every exec and file call of a session, with the version it read (UHP §6.5). The sequence
-- comes from the session row's counter, taken under its row lock.
CREATE TABLE turns (
    session_id  TEXT    NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    sequence    BIGINT  NOT NULL,
    kind        TEXT    NOT NULL,
    detail      TEXT    NOT NULL,
    version     BIGINT  NOT NULL,
    at_ms       BIGINT  NOT NULL,
    exit_code   BIGINT,
    PRIMARY KEY (session_id, sequence)
);

-- Tasks (UHP §5): refused before anything starts unless their environment is ready; each
-- runs in the session created for it.
CREATE TABLE tasks (
    id              TEXT    NOT NULL PRIMARY KEY,
    scope           TEXT    NOT NULL,
    input           TEXT    NOT NULL,
    harness_id      TEXT    NOT NULL DEFAULT '',
    environment_id  TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    session_id      TEXT    NOT NULL REFERENCES sessions (id),
    metadata        TEXT    NOT NULL DEFAULT '{}',
    created_at_ms   BIGINT  NOT NULL
);
