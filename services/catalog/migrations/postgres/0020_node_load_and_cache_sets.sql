-- Each node's count of active sessions, kept by the database itself: placement reads the
-- least-loaded live node from one index instead of counting every node's sessions, and no
-- code path that places or ends a session has to remember to keep the count (a trigger does,
-- in the transaction that inserts, ends or deletes the session).
ALTER TABLE nodes ADD COLUMN active_sessions BIGINT NOT NULL DEFAULT 0;
CREATE INDEX nodes_by_load ON nodes (active_sessions, registered_at_ms, id);
-- Every heartbeat rewrites its node's row: room in each page lets the new row version stay
-- there (a heap-only update, no index entry), as `heartbeat_at_ms` is in no index.
ALTER TABLE nodes SET (fillfactor = 50);

CREATE FUNCTION plinth_count_node_sessions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.status = 'active' THEN
        UPDATE nodes SET active_sessions = active_sessions - 1 WHERE id = OLD.node_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.status = 'active' THEN
        UPDATE nodes SET active_sessions = active_sessions + 1 WHERE id = NEW.node_id;
    END IF;
    RETURN NULL;
END
$$;
-- Created before the count is taken: creating it locks `sessions` against writes until this
-- migration commits, so a replica still running the previous release cannot place or end a
-- session between the count and the trigger.
CREATE TRIGGER sessions_count_placed AFTER INSERT ON sessions
    FOR EACH ROW WHEN (NEW.status = 'active') EXECUTE FUNCTION plinth_count_node_sessions();
CREATE TRIGGER sessions_count_changed AFTER UPDATE OF status, node_id ON sessions
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.node_id IS DISTINCT FROM NEW.node_id)
    EXECUTE FUNCTION plinth_count_node_sessions();
CREATE TRIGGER sessions_count_deleted AFTER DELETE ON sessions
    FOR EACH ROW WHEN (OLD.status = 'active') EXECUTE FUNCTION plinth_count_node_sessions();

UPDATE nodes SET active_sessions =
    (SELECT COUNT(*) FROM sessions s WHERE s.node_id = nodes.id AND s.status = 'active');

-- The versions each node caches, as its last whole report said, named by the digest the
-- node gave that set (0: none held). A heartbeat whose set is unchanged carries only the
-- digest; a changed set replaces the rows in one transaction.
ALTER TABLE nodes ADD COLUMN cache_digest BIGINT NOT NULL DEFAULT 0;
CREATE TABLE node_cached_versions (
    node_id         TEXT    NOT NULL REFERENCES nodes (id),
    environment_id  TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    PRIMARY KEY (node_id, environment_id, version)
);
