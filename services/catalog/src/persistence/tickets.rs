//! Terminal tickets: what lets a web page open one session's terminal, since a browser cannot
//! send an `Authorization` header on a WebSocket. A ticket is issued to a bearer-authenticated
//! caller for one session and the origin of the page that asked, lives a few seconds, and is
//! redeemed at most once, on whichever gateway replica the WebSocket lands: redeeming removes
//! it (`DELETE … RETURNING`), so two redemptions of one ticket cannot both find it. Only its
//! SHA-256 is stored.

use plinth_kit::database::now_ms;
use sqlx::Row;

use super::{Store, StoreError};

/// What a ticket was issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalTicket {
    /// The scope of the caller it was issued to.
    pub scope: String,
    /// The session whose terminal it opens.
    pub session_id: String,
    /// The `Origin` of the page that asked for it (`""`: none was sent).
    pub origin: String,
    /// When it stops opening anything (ms since the epoch).
    pub expires_at_ms: i64,
}

impl Store {
    /// Stores a ticket by its digest, and removes tickets that expired a minute ago or more.
    pub async fn issue_terminal_ticket(
        &self,
        ticket_sha256: &str,
        ticket: &TerminalTicket,
    ) -> Result<(), StoreError> {
        let mut tx = self.db.begin_write().await?;
        sqlx::query("DELETE FROM terminal_tickets WHERE expires_at_ms < $1")
            .bind(now_ms().saturating_sub(60_000))
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO terminal_tickets (ticket_sha256, scope, session_id, origin, \
             expires_at_ms) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(ticket_sha256)
        .bind(&ticket.scope)
        .bind(&ticket.session_id)
        .bind(&ticket.origin)
        .bind(ticket.expires_at_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Takes the ticket with this digest away and answers what it was issued for (expired or
    /// not: the caller compares); `None` when there is none (never issued, or redeemed).
    pub async fn redeem_terminal_ticket(
        &self,
        ticket_sha256: &str,
    ) -> Result<Option<TerminalTicket>, StoreError> {
        let row = sqlx::query(
            "DELETE FROM terminal_tickets WHERE ticket_sha256 = $1 \
             RETURNING scope, session_id, origin, expires_at_ms",
        )
        .bind(ticket_sha256)
        .fetch_optional(&self.db.writer)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(TerminalTicket {
            scope: row.try_get("scope")?,
            session_id: row.try_get("session_id")?,
            origin: row.try_get("origin")?,
            expires_at_ms: row.try_get("expires_at_ms")?,
        }))
    }
}
