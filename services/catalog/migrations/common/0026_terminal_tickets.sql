-- Single-use tickets that open one session's terminal from a web page (a browser cannot send
-- an Authorization header on a WebSocket). Only the SHA-256 of a ticket is kept, so the table
-- holds nothing that opens a terminal; a ticket is removed when it is redeemed (once) and
-- expired ones when the next is issued. A ticket goes with its session's scope and origin:
-- the page's `Origin` when it was asked for ('' for a client that sent none).
CREATE TABLE terminal_tickets (
    ticket_sha256   TEXT    NOT NULL PRIMARY KEY,
    scope           TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    origin          TEXT    NOT NULL,
    expires_at_ms   BIGINT  NOT NULL
);
CREATE INDEX terminal_tickets_expiry ON terminal_tickets (expires_at_ms);
