-- A count of the changes to which version of any environment is active (an activation, a
-- rollback, an environment deleted), kept by the database itself in the transaction that
-- makes the change. A heartbeat answers a node the active versions of its cache only when
-- this count or the node's set changed since the list the node holds: at a thousand nodes a
-- second, reading two hundred cached versions each against their environments was most of
-- what a heartbeat cost the database, to answer what had not changed.
CREATE TABLE activation_epoch (
    id     BIGINT NOT NULL PRIMARY KEY CHECK (id = 1),
    epoch  BIGINT NOT NULL
);
-- From 1: a node that names epoch 0 names none, and is answered the list.
INSERT INTO activation_epoch (id, epoch) VALUES (1, 1);

CREATE FUNCTION plinth_bump_activation_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE activation_epoch SET epoch = epoch + 1 WHERE id = 1;
    RETURN NULL;
END
$$;
CREATE TRIGGER environments_activation_changed AFTER UPDATE OF active_version ON environments
    FOR EACH ROW WHEN (OLD.active_version IS DISTINCT FROM NEW.active_version)
    EXECUTE FUNCTION plinth_bump_activation_epoch();
CREATE TRIGGER environments_activation_deleted AFTER DELETE ON environments
    FOR EACH STATEMENT EXECUTE FUNCTION plinth_bump_activation_epoch();
