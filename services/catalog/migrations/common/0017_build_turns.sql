-- Builds are claimed fairly across scopes: a claim serves the scope with the fewest builds
-- running, then the one served longest ago (`last_turn`, a number that grows with every
-- claim), then its oldest queued build. A scope's row is also what a claim holds while it
-- counts the scope's running builds against the per-scope cap, so claims on several replicas
-- never pass the cap together (on PostgreSQL they skip a row another claim holds). A scope's
-- row is made by its first claim.
CREATE TABLE build_turns (
    scope      TEXT    NOT NULL PRIMARY KEY,
    last_turn  BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX build_turns_last ON build_turns (last_turn);

