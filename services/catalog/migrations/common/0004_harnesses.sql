-- Harnesses: one row per harness, naming the environment its tasks read (UHP §5).
--
-- environment_id deliberately has no foreign key: a harness keeps its reference when its
-- environment is deleted (the environment's DELETE neither cascades here nor is blocked),
-- and a task of it is refused when it starts. That the environment is of the harness's
-- scope and exists is checked by the write itself (INSERT … SELECT / UPDATE … WHERE EXISTS).
CREATE TABLE harnesses (
    id              TEXT    NOT NULL PRIMARY KEY,
    scope           TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    base            TEXT    NOT NULL,
    environment_id  TEXT    NOT NULL,
    created_at_ms   BIGINT  NOT NULL,
    updated_at_ms   BIGINT  NOT NULL,
    CHECK (length(id) = 37),
    CHECK (length(environment_id) = 37)
);

CREATE INDEX harnesses_scope_created ON harnesses (scope, created_at_ms, id);
-- What a rebuild reaches: the harnesses that name one environment.
CREATE INDEX harnesses_scope_environment ON harnesses (scope, environment_id, created_at_ms, id);
