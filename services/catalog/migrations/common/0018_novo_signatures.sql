-- Signatures of Novo's mutating calls already used, per adapter: a second arrival of one is a
-- replay (refused) unless it is the same call retried with the same Novo-Request-Id and run
-- (idempotency answers it). A row is needed only while its `t` could still be accepted, so it
-- expires at t + 300 s; the insert counts only an adapter's live rows against its bound, and
-- the sweeps delete expired ones. The primary key makes the first arrival's insert the only
-- one that wins, across gateway replicas and restarts.
CREATE TABLE novo_signatures (
    adapter_id     TEXT    NOT NULL,
    signature      TEXT    NOT NULL,
    run_id         TEXT    NOT NULL,
    request_id     TEXT    NOT NULL,
    expires_at_ms  BIGINT  NOT NULL,
    PRIMARY KEY (adapter_id, signature)
);
CREATE INDEX novo_signatures_live ON novo_signatures (adapter_id, expires_at_ms);
CREATE INDEX novo_signatures_expiry ON novo_signatures (expires_at_ms);
