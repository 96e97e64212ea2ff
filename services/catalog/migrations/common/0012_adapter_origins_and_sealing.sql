-- A Brain adapter's callback origins (a JSON array of normalised origins; empty: none, so no
-- execution's callback is ever sent), and which seal key sealed the row's credentials.
-- `secret` and `previous_secret` hold sealed values from now on; rows an earlier version wrote
-- in clear have an empty `seal_key_id` until the catalog seals them, at its next start.
ALTER TABLE workspace_adapters ADD COLUMN callback_origins TEXT NOT NULL DEFAULT '[]';
ALTER TABLE workspace_adapters ADD COLUMN seal_key_id TEXT NOT NULL DEFAULT '';
