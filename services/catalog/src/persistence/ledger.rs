//! The one mechanism behind both "run at most once, answer the same ever after" records: a
//! Novo call's idempotency key (`idempotency_keys`) and a Brain operation
//! (`brain_operations`). What is durable here and why: a call or operation must never run
//! twice, and every repeat of it must get the same answer, across restarts and gateway
//! replicas. The rules, the same for both tables:
//!
//! - **Claim**: an `INSERT … ON CONFLICT DO NOTHING` of a running record naming its holder
//!   (a fresh random claim) and a lease; the primary key decides who runs it however
//!   deliveries race.
//! - A repeat finds the record and [`decide`]s: another request under the same key is a
//!   mismatch (nothing changes); a stored answer is answered; a running record under a live
//!   lease is in progress; a running record whose lease ran out was **abandoned**.
//! - **Settle**: an abandoned record gets the `unknown` answer, compare-and-set on its holder
//!   and on the lease still being out, in the repeat's own transaction; it is never run again
//!   (its effect may have happened).
//! - **Renew** and **finish** name the holder and require the record still running, so a
//!   holder that lost its lease can neither extend it nor overwrite the `unknown` a repeat was
//!   told. **Release** (only for a call that certainly did not start) deletes a running
//!   record its holder names.
//!
//! Each table keeps its own columns (a merge would cost a data migration for no new rule);
//! [`Table`] names them, and this module owns every statement that applies the rules.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::StoreError;

/// The columns of one ledger table.
pub(super) struct Table {
    /// The table.
    pub name: &'static str,
    /// Its primary key's columns, in the order key values are given.
    pub key: &'static [&'static str],
    /// The digest of the request the record was claimed for.
    pub digest: &'static str,
    /// The holder's claim.
    pub holder: &'static str,
    /// The state column, and its two values.
    pub state: &'static str,
    /// The state of a record that runs (no answer yet).
    pub running: &'static str,
    /// The state of a record with its answer.
    pub done: &'static str,
    /// The columns of the stored answer, in the order answer values are given.
    pub answer: &'static [&'static str],
    /// The time column an answer stamps (when it was stored, or until when it is kept).
    pub stamp: &'static str,
}

/// A value bound to a statement.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value<'a> {
    Text(&'a str),
    Int(i64),
    /// A whole number or SQL `NULL`.
    MaybeInt(Option<i64>),
}

/// What a repeat finds in a stored record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// Claimed for another request: nothing changes.
    Mismatch,
    /// Its answer is stored.
    Done,
    /// It runs under a live lease.
    Live,
    /// It runs with its lease run out: its holder stopped renewing. Settle it.
    Abandoned,
}

/// The rule a repeat follows; a different request is refused before anything else, so it
/// never touches the record.
pub(super) fn decide(
    stored_digest: &str,
    running: bool,
    lease_until_ms: i64,
    digest: &str,
    now: i64,
) -> Found {
    if stored_digest != digest {
        Found::Mismatch
    } else if !running {
        Found::Done
    } else if lease_until_ms > now {
        Found::Live
    } else {
        Found::Abandoned
    }
}

/// Whether a finish records the turns its work made: when it stored its answer, and when the
/// record was settled meanwhile (the work ran all the same); not when the answer stored is
/// this very one, which means this finish is a repeat of one that landed (its reply was lost).
pub(super) fn turns_due(stored: bool, same_answer: bool) -> bool {
    stored || !same_answer
}

/// `values` bound to `query` in order.
pub(super) fn bind<'q>(
    mut query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    values: &[Value<'q>],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    for value in values {
        query = match *value {
            Value::Text(text) => query.bind(text),
            Value::Int(number) => query.bind(number),
            Value::MaybeInt(number) => query.bind(number),
        };
    }
    query
}

/// `sql` with every placeholder `$n` made `$(n + offset)`, so statements written from `$1` can
/// follow each other in one script (one trip to SQLite's thread; see `durability`).
pub(super) fn renumbered(sql: &str, offset: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        match after[..digits].parse::<usize>() {
            Ok(n) => out.push_str(&format!("${}", n + offset)),
            Err(_) => out.push('$'),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// Whether `row` has a column of that name (a script's rows come from several statements).
pub(super) fn has_column(row: &AnyRow, name: &str) -> bool {
    use sqlx::Column as _;
    row.columns().iter().any(|column| column.name() == name)
}

impl Table {
    /// `k1 = $first AND k2 = $first+1 …`
    pub(super) fn key_match(&self, first: usize) -> String {
        self.key
            .iter()
            .enumerate()
            .map(|(index, column)| format!("{column} = ${}", first + index))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// `a1 = $first, a2 = $first+1 …`
    fn answer_set(&self, first: usize) -> String {
        self.answer
            .iter()
            .enumerate()
            .map(|(index, column)| format!("{column} = ${}", first + index))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The claim: inserts a running record of `columns` (which name the key, digest, holder
    /// and lease among the rest) unless one exists; true when this inserted it.
    pub async fn claim(
        &self,
        connection: &mut AnyConnection,
        columns: &[&str],
        values: &[Value<'_>],
    ) -> Result<bool, StoreError> {
        self.insert(connection, columns, values, self.running).await
    }

    /// Inserts a record of `columns` in `state` unless one exists; true when this inserted it.
    async fn insert(
        &self,
        connection: &mut AnyConnection,
        columns: &[&str],
        values: &[Value<'_>],
        state: &str,
    ) -> Result<bool, StoreError> {
        let inserted = bind(
            sqlx::query(sqlx::AssertSqlSafe(self.insert_sql(columns, values, state))),
            values,
        )
        .execute(&mut *connection)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    /// [`Table::insert`], answering the `returning` columns of the record it inserted.
    async fn insert_returning(
        &self,
        connection: &mut AnyConnection,
        columns: &[&str],
        values: &[Value<'_>],
        state: &str,
        returning: &str,
    ) -> Result<Option<AnyRow>, StoreError> {
        let sql = format!(
            "{} RETURNING {returning}",
            self.insert_sql(columns, values, state)
        );
        Ok(bind(sqlx::query(sqlx::AssertSqlSafe(sql)), values)
            .fetch_optional(&mut *connection)
            .await?)
    }

    pub(super) fn insert_sql(&self, columns: &[&str], values: &[Value<'_>], state: &str) -> String {
        let placeholders = (1..=values.len())
            .map(|n| format!("${n}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "INSERT INTO {} ({}, {}) VALUES ({placeholders}, '{}') ON CONFLICT DO NOTHING",
            self.name,
            columns.join(", "),
            self.state,
            state,
        )
    }

    /// A record with its answer, for work that ran without a claim (it has no effect, so a
    /// second run would change nothing): inserts a done record of `columns` (which name the
    /// key, digest, holder, lease, answer and stamp among the rest) unless one exists; true
    /// when this inserted it. A record found is [`decide`]d as a claim's repeat would be.
    pub async fn record(
        &self,
        connection: &mut AnyConnection,
        columns: &[&str],
        values: &[Value<'_>],
        returning: &str,
    ) -> Result<Option<AnyRow>, StoreError> {
        self.insert_returning(connection, columns, values, self.done, returning)
            .await
    }

    /// The stored record's digest, holder, whether it runs and its lease, for [`decide`];
    /// `None` when there is none.
    pub async fn found(
        &self,
        connection: &mut AnyConnection,
        key: &[Value<'_>],
    ) -> Result<Option<(String, String, bool, i64)>, StoreError> {
        let sql = format!(
            "SELECT {} AS digest, {} AS holder, {} AS state, lease_until_ms FROM {} WHERE {}",
            self.digest,
            self.holder,
            self.state,
            self.name,
            self.key_match(1)
        );
        let row = bind(sqlx::query(sqlx::AssertSqlSafe(sql)), key)
            .fetch_optional(&mut *connection)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let state: String = row.try_get("state")?;
        let running = if state == self.running {
            true
        } else if state == self.done {
            false
        } else {
            return Err(StoreError::Corrupt(format!(
                "{} record in state {state:?}",
                self.name
            )));
        };
        Ok(Some((
            row.try_get("digest")?,
            row.try_get("holder")?,
            running,
            row.try_get("lease_until_ms")?,
        )))
    }

    /// Stores `answer` for a record still running under `holder`; with `abandoned_by` only if
    /// its lease ran out by then (settling), else whatever its lease (finishing). True when
    /// this stored it.
    pub async fn answer(
        &self,
        connection: &mut AnyConnection,
        key: &[Value<'_>],
        holder: &str,
        answer: &[Value<'_>],
        stamp: i64,
        abandoned_by: Option<i64>,
    ) -> Result<bool, StoreError> {
        let (sql, values) = self.answer_sql(key, holder, answer, stamp, abandoned_by);
        let updated = bind(sqlx::query(sqlx::AssertSqlSafe(sql)), &values)
            .execute(&mut *connection)
            .await?;
        Ok(updated.rows_affected() == 1)
    }

    /// [`Table::answer`] when finishing, answering the record's `returning` columns when this
    /// stored it.
    pub async fn answer_returning(
        &self,
        connection: &mut AnyConnection,
        key: &[Value<'_>],
        holder: &str,
        answer: &[Value<'_>],
        stamp: i64,
        returning: &str,
    ) -> Result<Option<AnyRow>, StoreError> {
        let (sql, values) = self.answer_sql(key, holder, answer, stamp, None);
        let sql = format!("{sql} RETURNING {returning}");
        Ok(bind(sqlx::query(sqlx::AssertSqlSafe(sql)), &values)
            .fetch_optional(&mut *connection)
            .await?)
    }

    pub(super) fn answer_sql<'v>(
        &self,
        key: &[Value<'v>],
        holder: &'v str,
        answer: &[Value<'v>],
        stamp: i64,
        abandoned_by: Option<i64>,
    ) -> (String, Vec<Value<'v>>) {
        let mut values: Vec<Value<'v>> = answer.to_vec();
        values.push(Value::Int(stamp));
        values.extend_from_slice(key);
        values.push(Value::Text(holder));
        let mut sql = format!(
            "UPDATE {} SET {} = '{}', {}, {} = ${} WHERE {} AND {} = ${} AND {} = '{}'",
            self.name,
            self.state,
            self.done,
            self.answer_set(1),
            self.stamp,
            answer.len() + 1,
            self.key_match(answer.len() + 2),
            self.holder,
            answer.len() + key.len() + 2,
            self.state,
            self.running,
        );
        if let Some(now) = abandoned_by {
            values.push(Value::Int(now));
            sql.push_str(&format!(" AND lease_until_ms <= ${}", values.len()));
        }
        (sql, values)
    }

    /// Extends `holder`'s lease to `lease_until_ms` while the record runs; answers the
    /// `returning` columns (none when empty) when it still holds it.
    pub async fn renew(
        &self,
        connection: &mut AnyConnection,
        key: &[Value<'_>],
        holder: &str,
        lease_until_ms: i64,
        returning: &str,
    ) -> Result<Option<AnyRow>, StoreError> {
        let mut values = vec![Value::Int(lease_until_ms)];
        values.extend_from_slice(key);
        values.push(Value::Text(holder));
        let sql = format!(
            "UPDATE {} SET lease_until_ms = $1 WHERE {} AND {} = ${} AND {} = '{}' RETURNING {}",
            self.name,
            self.key_match(2),
            self.holder,
            key.len() + 2,
            self.state,
            self.running,
            if returning.is_empty() {
                "lease_until_ms"
            } else {
                returning
            },
        );
        Ok(bind(sqlx::query(sqlx::AssertSqlSafe(sql)), &values)
            .fetch_optional(&mut *connection)
            .await?)
    }

    /// Takes a record whose retention ([`Table::stamp`]) ran out by `now` over for a new
    /// claim: sets it running with `fresh` (column, value) pairs, compare-and-set on its
    /// holder and on its retention still being out. `None` while its retention lasts;
    /// otherwise whether this took it (a concurrent claim may have first). `NotFound` when
    /// there is no record.
    pub async fn take_over_expired(
        &self,
        connection: &mut AnyConnection,
        key: &[Value<'_>],
        fresh: &[(&str, Value<'_>)],
        now: i64,
    ) -> Result<Option<bool>, StoreError> {
        let sql = format!(
            "SELECT {} AS holder, {} AS stamp FROM {} WHERE {}",
            self.holder,
            self.stamp,
            self.name,
            self.key_match(1)
        );
        let row = bind(sqlx::query(sqlx::AssertSqlSafe(sql)), key)
            .fetch_optional(&mut *connection)
            .await?
            .ok_or(StoreError::NotFound)?;
        let stamp: i64 = row.try_get("stamp")?;
        if stamp > now {
            return Ok(None);
        }
        let held: String = row.try_get("holder")?;
        let mut values: Vec<Value<'_>> = fresh.iter().map(|(_, value)| *value).collect();
        let set = fresh
            .iter()
            .enumerate()
            .map(|(index, (column, _))| format!("{column} = ${}", index + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let first_key = values.len() + 1;
        values.extend_from_slice(key);
        values.push(Value::Text(&held));
        values.push(Value::Int(now));
        let sql = format!(
            "UPDATE {} SET {} = '{}', {set} WHERE {} AND {} = ${} AND {} <= ${}",
            self.name,
            self.state,
            self.running,
            self.key_match(first_key),
            self.holder,
            values.len() - 1,
            self.stamp,
            values.len(),
        );
        let taken = bind(sqlx::query(sqlx::AssertSqlSafe(sql)), &values)
            .execute(&mut *connection)
            .await?;
        Ok(Some(taken.rows_affected() == 1))
    }

    /// Deletes a record still running under `holder`: its call certainly did not start.
    pub async fn release(
        &self,
        connection: &mut AnyConnection,
        key: &[Value<'_>],
        holder: &str,
    ) -> Result<bool, StoreError> {
        let mut values = key.to_vec();
        values.push(Value::Text(holder));
        let sql = format!(
            "DELETE FROM {} WHERE {} AND {} = ${} AND {} = '{}'",
            self.name,
            self.key_match(1),
            self.holder,
            key.len() + 1,
            self.state,
            self.running,
        );
        let deleted = bind(sqlx::query(sqlx::AssertSqlSafe(sql)), &values)
            .execute(&mut *connection)
            .await?;
        Ok(deleted.rows_affected() == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_renumbered_and_nothing_else() {
        assert_eq!(
            super::renumbered("a = $1 AND b = $12 AND c = '$' || $3", 10),
            "a = $11 AND b = $22 AND c = '$' || $13"
        );
        assert_eq!(super::renumbered("no placeholders", 4), "no placeholders");
    }

    #[test]
    fn another_request_is_refused_before_anything_else() {
        assert_eq!(decide("a", true, 0, "b", 10), Found::Mismatch);
        assert_eq!(decide("a", false, 0, "a", 10), Found::Done);
        assert_eq!(decide("a", true, 11, "a", 10), Found::Live);
        assert_eq!(decide("a", true, 10, "a", 10), Found::Abandoned);
    }

    #[test]
    fn a_repeated_finish_records_no_second_turn() {
        assert!(turns_due(true, true));
        assert!(turns_due(false, false), "settled meanwhile: the work ran");
        assert!(!turns_due(false, true), "a repeat of a finish that landed");
    }
}
