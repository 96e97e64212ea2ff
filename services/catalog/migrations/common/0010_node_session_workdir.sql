-- Where a node's sessions see their working directory (the same path for every session of an
-- isolated node: it is mounted there in each session's own mount namespace, so it does not
-- depend on where the node keeps it). Empty: `<sessions_dir>/<id>/work`, as before.
ALTER TABLE nodes ADD COLUMN session_workdir TEXT NOT NULL DEFAULT '';
