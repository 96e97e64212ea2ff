-- What a ready build's dependencies were installed from, so a later build of the same scope
-- with the same key reuses them instead of running the installers again.
ALTER TABLE builds ADD COLUMN dependency_key TEXT NOT NULL DEFAULT '';
CREATE INDEX builds_dependency_key ON builds (dependency_key) WHERE status = 'ready';
CREATE INDEX builds_source_tree ON builds (source_tree) WHERE status = 'ready';
