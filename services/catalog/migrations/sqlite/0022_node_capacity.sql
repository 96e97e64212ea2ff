-- What each node can take, as it last said (NULL: it said nothing, as a node of an earlier
-- release does, and is taken for unlimited): sessions at once, and MiB of memory for
-- sessions. Beside them the memory its active sessions' limits commit, kept by the same
-- triggers as `active_sessions`, in the transaction that places, ends or deletes a session,
-- so placement compares one row's columns and counts nothing.
--
-- `left_at_ms` is when the node told the catalog it left on purpose (`plinth node --drain`);
-- 0 while it is part of the fleet. A node that left gets no sessions and is neither live nor
-- late; registering again under its name brings it back.
ALTER TABLE nodes ADD COLUMN max_sessions BIGINT;
ALTER TABLE nodes ADD COLUMN memory_mb BIGINT;
ALTER TABLE nodes ADD COLUMN committed_memory_mb BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN left_at_ms BIGINT NOT NULL DEFAULT 0;

DROP TRIGGER sessions_count_placed;
DROP TRIGGER sessions_count_changed;
DROP TRIGGER sessions_count_deleted;

CREATE TRIGGER sessions_count_placed AFTER INSERT ON sessions WHEN NEW.status = 'active'
BEGIN
    UPDATE nodes SET active_sessions = active_sessions + 1,
        committed_memory_mb = committed_memory_mb + COALESCE(NEW.limit_memory_mb, 0)
    WHERE id = NEW.node_id;
END;
CREATE TRIGGER sessions_count_changed AFTER UPDATE OF status, node_id ON sessions
WHEN OLD.status IS NOT NEW.status OR OLD.node_id IS NOT NEW.node_id
BEGIN
    UPDATE nodes SET active_sessions = active_sessions - 1,
        committed_memory_mb = committed_memory_mb - COALESCE(OLD.limit_memory_mb, 0)
    WHERE id = OLD.node_id AND OLD.status = 'active';
    UPDATE nodes SET active_sessions = active_sessions + 1,
        committed_memory_mb = committed_memory_mb + COALESCE(NEW.limit_memory_mb, 0)
    WHERE id = NEW.node_id AND NEW.status = 'active';
END;
CREATE TRIGGER sessions_count_deleted AFTER DELETE ON sessions WHEN OLD.status = 'active'
BEGIN
    UPDATE nodes SET active_sessions = active_sessions - 1,
        committed_memory_mb = committed_memory_mb - COALESCE(OLD.limit_memory_mb, 0)
    WHERE id = OLD.node_id;
END;

UPDATE nodes SET committed_memory_mb = (SELECT COALESCE(SUM(s.limit_memory_mb), 0)
    FROM sessions s WHERE s.node_id = nodes.id AND s.status = 'active');
