-- Where a node keeps its sessions: a session's working directory is `<sessions_dir>/<id>/work`,
-- known when the session is placed, so attaching needs no second write. Empty for a node that
-- does not say; its sessions get their working directory recorded after attaching.
ALTER TABLE nodes ADD COLUMN sessions_dir TEXT NOT NULL DEFAULT '';
