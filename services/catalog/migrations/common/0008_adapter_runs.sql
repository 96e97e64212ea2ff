-- The runs an adapter serves: a run's first call makes its session, later calls reuse it.
-- The primary key makes the first call's insert the only one that wins, however calls race.
CREATE TABLE adapter_runs (
    adapter_id       TEXT    NOT NULL,
    run_id           TEXT    NOT NULL,
    session_id       TEXT    NOT NULL,
    started_at_ms    BIGINT  NOT NULL,
    last_used_at_ms  BIGINT  NOT NULL,
    PRIMARY KEY (adapter_id, run_id)
);
CREATE INDEX adapter_runs_idle ON adapter_runs (last_used_at_ms);

-- Idempotency keys of adapters' mutating calls: the first call claims the key with an
-- insert (never check-then-insert), stores its answer, and a retry gets that answer. A
-- claim whose holder vanished can be taken over after its lease.
CREATE TABLE idempotency_keys (
    adapter_id      TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    run_id          TEXT    NOT NULL DEFAULT '',
    body_sha256     TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('running', 'done')),
    claim           TEXT    NOT NULL,
    lease_until_ms  BIGINT  NOT NULL,
    status          BIGINT  NOT NULL DEFAULT 0,
    response        TEXT    NOT NULL DEFAULT '',
    expires_at_ms   BIGINT  NOT NULL,
    PRIMARY KEY (adapter_id, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at_ms);
