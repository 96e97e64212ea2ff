-- A build may be asked to reuse nothing from earlier builds (`POST …/build {"clean": true}`),
-- and a ready build records the toolchains its installers ran with (a JSON array of
-- `{name, version, path}`).
ALTER TABLE builds ADD COLUMN clean BIGINT NOT NULL DEFAULT 0;
ALTER TABLE builds ADD COLUMN toolchains TEXT NOT NULL DEFAULT '[]';
