-- Until when a node is held suspect: a gateway could not reach it (a call past its deadline,
-- a connection that failed) although its heartbeats may still arrive, as they do through a
-- partition between the gateways and the node only. Placement passes over a node until this
-- moment (0: never marked, or cleared once it answered the gateway's probes again); the mark
-- lapses by itself, so a gateway that died holding it does not exclude the node for good.
-- Not indexed: placement walks `nodes_by_load` and checks it on each node it reads, as it
-- checks `heartbeat_at_ms`, and a write of it stays a heap-only update on PostgreSQL.
ALTER TABLE nodes ADD COLUMN suspect_until_ms BIGINT NOT NULL DEFAULT 0;
