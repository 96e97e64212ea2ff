-- Workspace adapters (Novo, Brain): each names an environment of its scope, checked by the
-- insert itself (no foreign key, like harnesses). `secret` is what verifies calls: a Novo
-- adapter's HMAC key as given (both sides must hold it), a Brain adapter's token as its
-- SHA-256. After a rotation the previous one is accepted until previous_expires_at_ms.
CREATE TABLE workspace_adapters (
    id                      TEXT    NOT NULL PRIMARY KEY,
    scope                   TEXT    NOT NULL,
    protocol                TEXT    NOT NULL CHECK (protocol IN ('novo', 'brain')),
    environment_id          TEXT    NOT NULL,
    secret                  TEXT    NOT NULL,
    previous_secret         TEXT    NOT NULL DEFAULT '',
    previous_expires_at_ms  BIGINT  NOT NULL DEFAULT 0,
    created_at_ms           BIGINT  NOT NULL,
    rotated_at_ms           BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX workspace_adapters_scope ON workspace_adapters (scope, created_at_ms);
