-- The Brain environment service (environment/v1).
--
-- A binding is one Environment of one Brain session, served by one adapter registration: it
-- pins the version its sessions read and names the Plinth session that currently holds its
-- resources ('' when none: before the first allocation, after a disposable release, after
-- teardown). The swap of that session is a compare-and-set on this row, so two tool calls
-- racing to allocate after a release agree on one session.
CREATE TABLE brain_bindings (
    adapter_id           TEXT    NOT NULL,
    session_id           TEXT    NOT NULL,
    environment          TEXT    NOT NULL,
    scope                TEXT    NOT NULL,
    environment_id       TEXT    NOT NULL,
    version              BIGINT  NOT NULL,
    lifetime             TEXT    NOT NULL CHECK (lifetime IN ('disposable', 'workspace')),
    release_on_turn_end  BIGINT  NOT NULL,
    plinth_session_id    TEXT    NOT NULL DEFAULT '',
    state                TEXT    NOT NULL CHECK (state IN ('attached', 'detached', 'torn_down')),
    configuration        TEXT    NOT NULL DEFAULT '{}',
    created_at_ms        BIGINT  NOT NULL,
    updated_at_ms        BIGINT  NOT NULL,
    PRIMARY KEY (adapter_id, session_id, environment)
);

-- Every operation delivered, identified by (adapter, Brain session, sequence): claimed by one
-- INSERT … ON CONFLICT DO NOTHING before anything runs, so a duplicate delivery never runs it
-- again, and finished with its receipt exactly once (the UPDATE names the runner that claimed
-- it and requires it still started). A started row whose runner stopped renewing its lease
-- had an effect that may or may not have happened: it is settled as `unknown`, never rerun.
CREATE TABLE brain_operations (
    adapter_id        TEXT    NOT NULL,
    session_id        TEXT    NOT NULL,
    sequence          BIGINT  NOT NULL,
    environment       TEXT    NOT NULL,
    kind              TEXT    NOT NULL,
    digest            TEXT    NOT NULL,
    state             TEXT    NOT NULL CHECK (state IN ('started', 'finished')),
    runner            TEXT    NOT NULL,
    lease_until_ms    BIGINT  NOT NULL,
    cancel_requested  BIGINT  NOT NULL DEFAULT 0,
    receipt           TEXT    NOT NULL DEFAULT '',
    started_at_ms     BIGINT  NOT NULL,
    finished_at_ms    BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (adapter_id, session_id, sequence)
);
-- What a turn-end release waits for: the binding's executions still running.
CREATE INDEX brain_operations_running ON brain_operations (adapter_id, session_id, environment)
    WHERE state = 'started';

-- Who a session was made for (a Brain binding: `brain:<adapter>:<session>:<environment>`),
-- so teardown finds every session a binding ever had, even one made just before a crash.
ALTER TABLE sessions ADD COLUMN owner TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_owner ON sessions (scope, owner) WHERE owner <> '';
