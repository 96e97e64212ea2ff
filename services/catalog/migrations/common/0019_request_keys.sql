-- Idempotency keys of the tenant API's own requests (`Idempotency-Key` on POST /v1/sessions
-- and on a session's exec), by the same rules as an adapter's keys (`idempotency_keys`): the
-- first request claims the key with an insert (never check-then-insert), stores its answer,
-- and a retry gets that answer. A key is its scope's, for one route (method and path).
CREATE TABLE request_keys (
    scope           TEXT    NOT NULL,
    route           TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    body_sha256     TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('running', 'done')),
    claim           TEXT    NOT NULL,
    lease_until_ms  BIGINT  NOT NULL,
    status          BIGINT  NOT NULL DEFAULT 0,
    response        TEXT    NOT NULL DEFAULT '',
    expires_at_ms   BIGINT  NOT NULL,
    PRIMARY KEY (scope, route, key)
);
CREATE INDEX request_keys_expiry ON request_keys (expires_at_ms);
