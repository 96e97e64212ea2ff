-- What a version derived from git needs beyond the commit and its description: whether a
-- pushed checkout had uncommitted changes, whether a git import fetched the history and tags
-- its description needs, when the origin was recorded (the date of a dirty version), and how
-- many commits reach the commit (setuptools-scm's count when no tag does; 0: not known).
-- Flags are 0 or 1, as `counted` is.
ALTER TABLE source_origins ADD COLUMN dirty BIGINT NOT NULL DEFAULT 0;
ALTER TABLE source_origins ADD COLUMN history_incomplete BIGINT NOT NULL DEFAULT 0;
ALTER TABLE source_origins ADD COLUMN recorded_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE source_origins ADD COLUMN commits BIGINT NOT NULL DEFAULT 0;
