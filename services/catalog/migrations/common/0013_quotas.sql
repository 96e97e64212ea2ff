-- Quotas per scope. Every create that a quota limits (an environment, a session, a build)
-- first takes its scope's row here, in its own transaction, then counts and inserts: two
-- creates of one scope take turns, across catalog replicas, so they cannot both pass the
-- last slot. The row holds no count: what is counted is the rows themselves.
CREATE TABLE scope_quota_locks (
    scope  TEXT    NOT NULL PRIMARY KEY,
    takes  BIGINT  NOT NULL DEFAULT 0
);

-- Counting a scope's active sessions reads only them.
CREATE INDEX sessions_active_in_scope ON sessions (scope) WHERE status = 'active';
