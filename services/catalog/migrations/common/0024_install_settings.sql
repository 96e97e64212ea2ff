-- How an environment's builds install, where its owner says rather than the manifests found
-- (`install` on the environment object, as JSON: `{"python": {...}}`; empty: nothing said),
-- and each build's copy of it, taken when the build is started: a build, and every retry of
-- it, installs as the environment said then.
ALTER TABLE environments ADD COLUMN install TEXT NOT NULL DEFAULT '';
ALTER TABLE builds ADD COLUMN install TEXT NOT NULL DEFAULT '';
