-- A session's effective limits, decided by the gateway when it is created and never changed;
-- NULL is no limit (every session made before limits existed). CPU is in thousandths of a
-- core, so every limit is an integer.
ALTER TABLE sessions ADD COLUMN limit_memory_mb BIGINT;
ALTER TABLE sessions ADD COLUMN limit_pids BIGINT;
ALTER TABLE sessions ADD COLUMN limit_cpu_millicores BIGINT;
ALTER TABLE sessions ADD COLUMN limit_disk_mb BIGINT;
ALTER TABLE sessions ADD COLUMN limit_lifetime_s BIGINT;
ALTER TABLE sessions ADD COLUMN limit_idle_s BIGINT;
-- When the session ends by its lifetime or idle limit, whichever comes first: set when it is
-- placed, moved by each turn that moves its idle end, NULL when it has neither limit. The
-- sweep ends active sessions past it through this index, in batches, with one conditional
-- UPDATE, so several catalog replicas may sweep at once.
ALTER TABLE sessions ADD COLUMN ends_at_ms BIGINT;
CREATE INDEX sessions_ending ON sessions (ends_at_ms) WHERE status = 'active' AND ends_at_ms IS NOT NULL;
