-- Every time in the API is in milliseconds, so a session's lifetime and idle limits are stored
-- in milliseconds too: the store and the sweep then never convert. Limits were bounded to 2^40
-- seconds when stored, so multiplying by 1000 stays inside a BIGINT.
ALTER TABLE sessions RENAME COLUMN limit_lifetime_s TO limit_lifetime_ms;
ALTER TABLE sessions RENAME COLUMN limit_idle_s TO limit_idle_ms;
UPDATE sessions SET limit_lifetime_ms = limit_lifetime_ms * 1000 WHERE limit_lifetime_ms IS NOT NULL;
UPDATE sessions SET limit_idle_ms = limit_idle_ms * 1000 WHERE limit_idle_ms IS NOT NULL;
-- A node's and an owner's live sessions are read in pages, in creation order then id: these
-- indexes walk a page from its cursor instead of sorting every live session of the node or
-- the owner.
DROP INDEX sessions_live_on_node;
CREATE INDEX sessions_live_on_node ON sessions (node_id, created_at_ms, id) WHERE status = 'active';
DROP INDEX sessions_owner;
CREATE INDEX sessions_owner ON sessions (scope, owner, created_at_ms, id) WHERE owner <> '';
