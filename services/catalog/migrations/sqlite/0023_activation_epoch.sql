-- A count of the changes to which version of any environment is active (an activation, a
-- rollback, an environment deleted), kept by the database itself in the transaction that
-- makes the change. A heartbeat answers a node the active versions of its cache only when
-- this count or the node's set changed since the list the node holds (see the PostgreSQL
-- migration of the same number).
CREATE TABLE activation_epoch (
    id     INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    epoch  BIGINT  NOT NULL
);
-- From 1: a node that names epoch 0 names none, and is answered the list.
INSERT INTO activation_epoch (id, epoch) VALUES (1, 1);

CREATE TRIGGER environments_activation_changed AFTER UPDATE OF active_version ON environments
WHEN OLD.active_version IS NOT NEW.active_version
BEGIN
    UPDATE activation_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
CREATE TRIGGER environments_activation_deleted AFTER DELETE ON environments
BEGIN
    UPDATE activation_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
