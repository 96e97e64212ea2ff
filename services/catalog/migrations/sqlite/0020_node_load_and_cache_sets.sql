-- Each node's count of active sessions, kept by the database itself: placement reads the
-- least-loaded live node from one index instead of counting every node's sessions, and no
-- code path that places or ends a session has to remember to keep the count (triggers do,
-- in the transaction that inserts, ends or deletes the session).
ALTER TABLE nodes ADD COLUMN active_sessions BIGINT NOT NULL DEFAULT 0;
CREATE INDEX nodes_by_load ON nodes (active_sessions, registered_at_ms, id);

CREATE TRIGGER sessions_count_placed AFTER INSERT ON sessions WHEN NEW.status = 'active'
BEGIN
    UPDATE nodes SET active_sessions = active_sessions + 1 WHERE id = NEW.node_id;
END;
CREATE TRIGGER sessions_count_changed AFTER UPDATE OF status, node_id ON sessions
WHEN OLD.status IS NOT NEW.status OR OLD.node_id IS NOT NEW.node_id
BEGIN
    UPDATE nodes SET active_sessions = active_sessions - 1
    WHERE id = OLD.node_id AND OLD.status = 'active';
    UPDATE nodes SET active_sessions = active_sessions + 1
    WHERE id = NEW.node_id AND NEW.status = 'active';
END;
CREATE TRIGGER sessions_count_deleted AFTER DELETE ON sessions WHEN OLD.status = 'active'
BEGIN
    UPDATE nodes SET active_sessions = active_sessions - 1 WHERE id = OLD.node_id;
END;

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
