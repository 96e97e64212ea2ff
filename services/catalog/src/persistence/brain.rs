//! The Brain operation ledger and bindings. What is durable here and why: Brain sends each
//! operation once and may deliver it again (after either side restarts); an operation must
//! never run twice, and every delivery must answer the same receipt. The claim, lease,
//! settle and finish rules are the ledger's (`super::ledger`), shared with Novo's idempotency
//! keys; what a delivery answers is decided here, in the claim's transaction. A binding's
//! Plinth session is replaced only by compare-and-set on its row, and its state moves only
//! as `crate::domain::brain::may_move` allows, checked by the UPDATE itself.

use plinth_kit::database::{Backend, now_ms};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::durability::Durable;
use super::ledger::{self, Found, Table, Value};
use super::sessions::NewTurn;
use super::{Store, StoreError};
use crate::domain::brain::{
    Binding, BindingKey, BindingState, Claim, Lifetime, NewOperation, Operation, OperationKey,
    OperationKind, OperationState, may_move,
};
use crate::domain::model::{EnvironmentId, Scope};
use crate::domain::sessions::SessionId;

const OPERATION_COLUMNS: &str = "adapter_id, session_id, sequence, environment, kind, digest, \
     state, runner, lease_until_ms, cancel_requested, receipt, started_at_ms, finished_at_ms";

const BINDING_COLUMNS: &str = "adapter_id, session_id, environment, scope, environment_id, \
     version, lifetime, release_on_turn_end, plinth_session_id, state, configuration, \
     created_at_ms, updated_at_ms";

/// The operation ledger's columns.
const OPERATIONS: Table = Table {
    name: "brain_operations",
    key: &["adapter_id", "session_id", "sequence"],
    digest: "digest",
    holder: "runner",
    state: "state",
    running: "started",
    done: "finished",
    answer: &["receipt"],
    stamp: "finished_at_ms",
};

fn key_values(key: &OperationKey) -> Result<[Value<'_>; 3], StoreError> {
    Ok([
        Value::Text(&key.adapter_id),
        Value::Text(&key.session_id),
        Value::Int(sequence(key)?),
    ])
}

/// The columns of a delivery's new row, as a claim inserts it.
const NEW_COLUMNS: [&str; 9] = [
    "adapter_id",
    "session_id",
    "sequence",
    "environment",
    "kind",
    "digest",
    "runner",
    "lease_until_ms",
    "started_at_ms",
];

/// [`NEW_COLUMNS`] and its receipt, as a read's record inserts it.
fn recorded_columns() -> Vec<&'static str> {
    [NEW_COLUMNS.as_slice(), &["receipt", "finished_at_ms"]].concat()
}

/// `new`'s values for [`NEW_COLUMNS`]: started `now`, its lease until `lease_until`.
fn new_values(
    new: &NewOperation,
    now: i64,
    lease_until: i64,
) -> Result<Vec<Value<'_>>, StoreError> {
    let mut values = key_values(&new.key)?.to_vec();
    values.extend([
        Value::Text(&new.environment),
        Value::Text(new.kind.label()),
        Value::Text(&new.digest),
        Value::Text(&new.runner),
        Value::Int(lease_until),
        Value::Int(now),
    ]);
    Ok(values)
}

/// `new` recorded at `now` with `receipt`: values for [`recorded_columns`].
fn recorded_values<'a>(
    new: &'a NewOperation,
    receipt: &'a str,
    now: i64,
) -> Result<Vec<Value<'a>>, StoreError> {
    let mut values = new_values(new, now, now)?;
    values.extend([Value::Text(receipt), Value::Int(now)]);
    Ok(values)
}

fn sequence(key: &OperationKey) -> Result<i64, StoreError> {
    i64::try_from(key.sequence)
        .map_err(|_| StoreError::Corrupt(format!("sequence {} is past 2^63", key.sequence)))
}

impl Store {
    /// Claims an operation for `new.runner`, or decides what an earlier delivery of it
    /// answers (see [`Claim`]); one that was abandoned is settled with `unknown` in this same
    /// transaction.
    pub async fn claim_operation(
        &self,
        new: &NewOperation,
        unknown: &str,
    ) -> Result<Claim, StoreError> {
        Ok(self.claim_operation_of(new, unknown, None).await?.0)
    }

    /// [`Store::claim_operation`], and when it is claimed, the binding `binding` names as it
    /// is in the claim's transaction (`None` when there is none), which the operation runs
    /// on.
    ///
    /// A claim is on disk before it is answered (`Durable::BeforeAnswer`): nothing runs
    /// before its claim would survive a loss of power, so nothing runs twice.
    pub async fn claim_operation_of(
        &self,
        new: &NewOperation,
        unknown: &str,
        binding: Option<&BindingKey>,
    ) -> Result<(Claim, Option<Binding>), StoreError> {
        let now = now_ms();
        let columns = NEW_COLUMNS;
        let values = new_values(new, now, now.saturating_add(new.lease_ms))?;
        // The first delivery (nearly every one): one statement, its own transaction, on disk
        // before this answers (on SQLite synced outside the writer, so concurrent claims
        // share the file system's commits). The binding is read after it on the same
        // connection, the one writer, so it is the binding as the claim left it; on SQLite
        // both are one trip to the database's thread.
        {
            let insert = format!(
                "{} RETURNING {OPERATION_COLUMNS}",
                OPERATIONS.insert_sql(&columns, &values, OPERATIONS.running)
            );
            let (operation, found) = if self.db.backend == Backend::Sqlite {
                let mut script = insert;
                let mut all = values.to_vec();
                if let Some(binding) = binding {
                    script.push_str("; ");
                    script.push_str(&ledger::renumbered(&binding_by_key(), all.len()));
                    all.extend(binding_values(binding));
                }
                let rows = self.synced_script(&script, &all).await?;
                let operation = rows.iter().find(|row| ledger::has_column(row, "digest"));
                let found = rows
                    .iter()
                    .find(|row| ledger::has_column(row, "environment_id"));
                (
                    operation.map(operation_from_row).transpose()?,
                    found.map(binding_from_row).transpose()?,
                )
            } else {
                let mut connection = self.db.writer.acquire().await?;
                let inserted = ledger::bind(sqlx::query(sqlx::AssertSqlSafe(insert)), &values)
                    .fetch_optional(&mut *connection)
                    .await?;
                match inserted {
                    Some(row) => {
                        let found = match binding {
                            Some(binding) => binding_in(&mut connection, binding).await?,
                            None => None,
                        };
                        (Some(operation_from_row(&row)?), found)
                    }
                    None => (None, None),
                }
            };
            if let Some(operation) = operation {
                return Ok((Claim::Claimed(operation), found));
            }
        }
        // Delivered before: what that delivery left decides, in one transaction.
        let mut tx = self.begin_ledger_write(Durable::BeforeAnswer).await?;
        let claimed = OPERATIONS.claim(&mut tx, &columns, &values).await?;
        let mut found = None;
        let claim = if claimed {
            let operation = operation_in(&mut tx, &new.key).await?;
            if let Some(binding) = binding {
                found = binding_in(&mut tx, binding).await?;
            }
            Claim::Claimed(operation)
        } else {
            repeat_in(&mut tx, new, unknown, now).await?
        };
        tx.commit().await?;
        Ok((claim, found))
    }

    /// Stores the receipt of an operation run without a claim (one with no effect, which a
    /// second run would not change) and the `turns` it made, in one transaction, unless a
    /// delivery of it was stored or claimed first: then answers what a claim would have
    /// found, and records nothing. `Claimed` means this receipt was stored. Committed before
    /// it is answered, synced just after (`Durable::Committed`): a kill of any process loses
    /// nothing; a loss of power in that moment leaves no record, and a redelivery reads again.
    pub async fn record_operation(
        &self,
        new: &NewOperation,
        receipt: &str,
        turns: &[NewTurn],
        unknown: &str,
    ) -> Result<Claim, StoreError> {
        let now = now_ms();
        if self.db.backend == Backend::Sqlite
            && let Some(claim) = self
                .record_operation_script(new, receipt, turns, now)
                .await?
        {
            return Ok(claim);
        }
        let mut tx = self.begin_ledger_write(Durable::Committed).await?;
        let recorded = OPERATIONS
            .record(
                &mut tx,
                &recorded_columns(),
                &recorded_values(new, receipt, now)?,
                OPERATION_COLUMNS,
            )
            .await?;
        let claim = if let Some(row) = recorded {
            for turn in turns {
                super::sessions::insert_turn(&mut tx, turn).await?;
            }
            Claim::Claimed(operation_from_row(&row)?)
        } else {
            repeat_in(&mut tx, new, unknown, now).await?
        };
        tx.commit().await?;
        Ok(claim)
    }

    /// One operation; `NotFound` when it was never delivered. Read from the writer, so a
    /// claim or finish just made is always seen.
    pub async fn operation(&self, key: &OperationKey) -> Result<Operation, StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        operation_in(&mut connection, key).await
    }

    /// Extends `runner`'s lease; `None` when it no longer holds the operation, else whether a
    /// cancellation was asked for.
    pub async fn renew_operation(
        &self,
        key: &OperationKey,
        runner: &str,
        lease_ms: i64,
    ) -> Result<Option<bool>, StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        let row = OPERATIONS
            .renew(
                &mut connection,
                &key_values(key)?,
                runner,
                now_ms().saturating_add(lease_ms),
                "cancel_requested",
            )
            .await?;
        row.map(|row| Ok(row.try_get::<i64, _>("cancel_requested")? != 0))
            .transpose()
    }

    /// Stores `runner`'s receipt if the operation is still its own and started, and records
    /// the `turns` it made in the same transaction (see `ledger::turns_due`; a turn its
    /// session refuses is left out); answers whether the receipt was stored, and the
    /// operation as stored. Committed before it is answered, synced just after
    /// (`Durable::Committed`): a kill of any process loses nothing; a loss of power in that
    /// moment can take the receipt, and the claim, on disk since before the operation ran,
    /// is then settled as `unknown`, never run again.
    pub async fn finish_operation(
        &self,
        key: &OperationKey,
        runner: &str,
        receipt: &str,
        turns: &[NewTurn],
    ) -> Result<(bool, Operation), StoreError> {
        if self.db.backend == Backend::Sqlite {
            return self
                .finish_operation_script(key, runner, receipt, turns)
                .await;
        }
        let mut tx = self.begin_ledger_write(Durable::Committed).await?;
        let stored = OPERATIONS
            .answer_returning(
                &mut tx,
                &key_values(key)?,
                runner,
                &[Value::Text(receipt)],
                now_ms(),
                OPERATION_COLUMNS,
            )
            .await?;
        let recorded = stored.is_some();
        let operation = match stored {
            Some(row) => operation_from_row(&row)?,
            None => operation_in(&mut tx, key).await?,
        };
        if ledger::turns_due(recorded, operation.receipt == receipt) {
            for turn in turns {
                super::sessions::insert_turn(&mut tx, turn).await?;
            }
        }
        tx.commit().await?;
        Ok((recorded, operation))
    }

    /// Asks the runner of a started operation to cancel it; answers the operation as stored.
    pub async fn cancel_operation(&self, key: &OperationKey) -> Result<Operation, StoreError> {
        sqlx::query(
            "UPDATE brain_operations SET cancel_requested = 1 \
             WHERE adapter_id = $1 AND session_id = $2 AND sequence = $3 AND state = 'started'",
        )
        .bind(&key.adapter_id)
        .bind(&key.session_id)
        .bind(sequence(key)?)
        .execute(&self.db.writer)
        .await?;
        self.operation(key).await
    }

    /// How many executions of a binding delivered before `before` still run under a live
    /// lease.
    pub async fn count_running(
        &self,
        binding: &BindingKey,
        before: u64,
    ) -> Result<u64, StoreError> {
        let before = i64::try_from(before).unwrap_or(i64::MAX);
        let row = sqlx::query(
            "SELECT COUNT(*) AS running FROM brain_operations \
             WHERE adapter_id = $1 AND session_id = $2 AND environment = $3 \
             AND state = 'started' AND kind = $6 AND sequence < $4 \
             AND lease_until_ms > $5",
        )
        .bind(&binding.adapter_id)
        .bind(&binding.session_id)
        .bind(&binding.environment)
        .bind(before)
        .bind(now_ms())
        .bind(OperationKind::Execute.label())
        .fetch_one(&self.db.writer)
        .await?;
        let running: i64 = row.try_get("running")?;
        Ok(u64::try_from(running).unwrap_or(0))
    }

    /// Creates a binding (attached), or answers the existing one; `true` when created.
    pub async fn create_binding(&self, binding: &Binding) -> Result<(bool, Binding), StoreError> {
        let now = now_ms();
        let inserted = sqlx::query(
            "INSERT INTO brain_bindings (adapter_id, session_id, environment, scope, \
             environment_id, version, lifetime, release_on_turn_end, plinth_session_id, state, \
             configuration, created_at_ms, updated_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'attached', $10, $11, $11) \
             ON CONFLICT (adapter_id, session_id, environment) DO NOTHING",
        )
        .bind(&binding.key.adapter_id)
        .bind(&binding.key.session_id)
        .bind(&binding.key.environment)
        .bind(binding.scope.as_str())
        .bind(binding.environment_id.as_str())
        .bind(i64::from(binding.version))
        .bind(binding.lifetime.label())
        .bind(i64::from(binding.release_on_turn_end))
        .bind(
            binding
                .plinth_session
                .as_ref()
                .map_or("", SessionId::as_str),
        )
        .bind(&binding.configuration)
        .bind(now)
        .execute(&self.db.writer)
        .await?;
        Ok((
            inserted.rows_affected() == 1,
            self.binding(&binding.key).await?,
        ))
    }

    /// One binding; `NotFound` when none.
    pub async fn binding(&self, key: &BindingKey) -> Result<Binding, StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        binding_in(&mut connection, key)
            .await?
            .ok_or(StoreError::NotFound)
    }

    /// Replaces the binding's Plinth session if it is still `expected`; answers whether it
    /// was, and the binding as it is now. A session is given only to an attached binding
    /// (`BindingState` naming where it is otherwise); taking one away works in every state.
    pub async fn swap_binding_session(
        &self,
        key: &BindingKey,
        expected: Option<&SessionId>,
        replacement: Option<&SessionId>,
    ) -> Result<(bool, Binding), StoreError> {
        let updated = sqlx::query(
            "UPDATE brain_bindings SET plinth_session_id = $1, updated_at_ms = $2 \
             WHERE adapter_id = $3 AND session_id = $4 AND environment = $5 \
             AND plinth_session_id = $6 AND ($1 = '' OR state = 'attached')",
        )
        .bind(replacement.map_or("", SessionId::as_str))
        .bind(now_ms())
        .bind(&key.adapter_id)
        .bind(&key.session_id)
        .bind(&key.environment)
        .bind(expected.map_or("", SessionId::as_str))
        .execute(&self.db.writer)
        .await?;
        let binding = self.binding(key).await?;
        if updated.rows_affected() == 0
            && replacement.is_some()
            && binding.state != BindingState::Attached
        {
            return Err(StoreError::BindingState(binding.state));
        }
        Ok((updated.rows_affected() == 1, binding))
    }

    /// Moves a binding to `state` if its life allows it ([`may_move`]); a binding already in
    /// `state` is answered unchanged. `NotFound` when there is none, `BindingState` naming
    /// where it is when the move is refused (a torn-down binding stays torn down).
    pub async fn set_binding_state(
        &self,
        key: &BindingKey,
        state: BindingState,
    ) -> Result<Binding, StoreError> {
        // The states it may move from are in the UPDATE, so a teardown racing a setup can
        // never be undone.
        let from: Vec<&str> = BindingState::ALL
            .iter()
            .filter(|from| may_move(**from, state) && **from != state)
            .map(|from| from.label())
            .collect();
        let placeholders = (0..from.len())
            .map(|n| format!("${}", n + 6))
            .collect::<Vec<_>>()
            .join(", ");
        if !from.is_empty() {
            let sql = format!(
                "UPDATE brain_bindings SET state = $1, updated_at_ms = $2 \
                 WHERE adapter_id = $3 AND session_id = $4 AND environment = $5 \
                 AND state IN ({placeholders})"
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(state.label())
                .bind(now_ms())
                .bind(&key.adapter_id)
                .bind(&key.session_id)
                .bind(&key.environment);
            for label in &from {
                query = query.bind(*label);
            }
            query.execute(&self.db.writer).await?;
        }
        let binding = self.binding(key).await?;
        if binding.state != state {
            return Err(StoreError::BindingState(binding.state));
        }
        Ok(binding)
    }
}

/// SQLite's ledger writes as scripts: each is two trips to the database's thread (its
/// statements, then the turns and the commit) where statement by statement it was five or
/// more, each trip costing about as much as the statements' work.
impl Store {
    /// [`Store::record_operation`]'s first delivery; `None`, with nothing written, when a
    /// delivery of it was stored or claimed first.
    async fn record_operation_script(
        &self,
        new: &NewOperation,
        receipt: &str,
        turns: &[NewTurn],
        now: i64,
    ) -> Result<Option<Claim>, StoreError> {
        let columns = recorded_columns();
        let mut values = recorded_values(new, receipt, now)?;
        let insert = OPERATIONS.insert_sql(&columns, &values, OPERATIONS.done);
        let (taken, taken_values) = turns_taken(turns, now, values.len());
        values.extend(taken_values);
        let script = format!("{insert} RETURNING {OPERATION_COLUMNS}; {taken}");
        let (write, rows) = self
            .begin_ledger_script(Durable::Committed, &script, &values)
            .await?;
        let Some(row) = rows.iter().find(|row| ledger::has_column(row, "digest")) else {
            write.rollback().await?;
            return Ok(None);
        };
        let operation = operation_from_row(row)?;
        let details = turns
            .iter()
            .map(|turn| super::sessions::stored_detail(&turn.detail))
            .collect::<Vec<_>>();
        let (recorded, recorded_values) = turns_recorded(turns, &details, &rows, now)?;
        write.commit_script(&recorded, &recorded_values).await?;
        Ok(Some(Claim::Claimed(operation)))
    }

    /// [`Store::finish_operation`].
    async fn finish_operation_script(
        &self,
        key: &OperationKey,
        runner: &str,
        receipt: &str,
        turns: &[NewTurn],
    ) -> Result<(bool, Operation), StoreError> {
        let now = now_ms();
        let key_values = key_values(key)?;
        let answer = [Value::Text(receipt)];
        let (update, mut values) = OPERATIONS.answer_sql(&key_values, runner, &answer, now, None);
        // `changes()`: whether the UPDATE just before stored this receipt.
        let select = format!(
            "SELECT {OPERATION_COLUMNS}, changes() AS stored FROM brain_operations WHERE {}",
            OPERATIONS.key_match(answer.len() + 2)
        );
        let (taken, taken_values) = turns_taken(turns, now, values.len());
        values.extend(taken_values);
        let script = format!("{update}; {select}; {taken}");
        let (write, rows) = self
            .begin_ledger_script(Durable::Committed, &script, &values)
            .await?;
        let Some(row) = rows.iter().find(|row| ledger::has_column(row, "stored")) else {
            write.rollback().await?;
            return Err(StoreError::NotFound);
        };
        let recorded = row.try_get::<i64, _>("stored")? == 1;
        let operation = operation_from_row(row)?;
        if !ledger::turns_due(recorded, operation.receipt == receipt) {
            write.rollback().await?;
            return Ok((recorded, operation));
        }
        let details = turns
            .iter()
            .map(|turn| super::sessions::stored_detail(&turn.detail))
            .collect::<Vec<_>>();
        let (recorded_sql, recorded_values) = turns_recorded(turns, &details, &rows, now)?;
        write.commit_script(&recorded_sql, &recorded_values).await?;
        Ok((recorded, operation))
    }
}

/// The statements that take each of `turns` at `now` in a script whose values so far number
/// `before`: each session's update ([`super::sessions::TURN_TAKEN`]), answering its turn's
/// sequence, the version and the turn's index; and their values.
fn turns_taken(turns: &[NewTurn], now: i64, before: usize) -> (String, Vec<Value<'_>>) {
    let mut sql = String::new();
    let mut values = Vec::with_capacity(turns.len() * 3);
    for (index, turn) in turns.iter().enumerate() {
        sql.push_str(&ledger::renumbered(
            super::sessions::TURN_TAKEN,
            before + values.len(),
        ));
        sql.push_str(&format!(", {index} AS turn_index; "));
        values.extend([
            Value::Text(turn.session.as_str()),
            Value::Text(turn.scope.as_str()),
            Value::Int(now),
        ]);
    }
    (sql, values)
}

/// The statements that record the turns `rows` say were taken ([`turns_taken`]; a session
/// that ended took none), `details` being each turn's as stored; and their values.
fn turns_recorded<'a>(
    turns: &'a [NewTurn],
    details: &'a [String],
    rows: &[AnyRow],
    now: i64,
) -> Result<(String, Vec<Value<'a>>), StoreError> {
    let mut sql = String::new();
    let mut values = Vec::new();
    for row in rows
        .iter()
        .filter(|row| ledger::has_column(row, "turn_index"))
    {
        let index = usize::try_from(row.try_get::<i64, _>("turn_index")?)
            .map_err(|_| StoreError::Corrupt("a turn's index".into()))?;
        let (Some(turn), Some(detail)) = (turns.get(index), details.get(index)) else {
            return Err(StoreError::Corrupt(format!("no turn {index}")));
        };
        sql.push_str(&ledger::renumbered(
            super::sessions::TURN_RECORDED,
            values.len(),
        ));
        sql.push_str("; ");
        values.extend([
            Value::Text(turn.session.as_str()),
            Value::Int(row.try_get::<i64, _>("turns")?),
            Value::Text(turn.kind.as_str()),
            Value::Text(detail),
            Value::Int(row.try_get::<i64, _>("version")?),
            Value::Int(now),
            Value::MaybeInt(turn.exit_code.map(i64::from)),
        ]);
    }
    Ok((sql, values))
}

/// A binding by its key, `$1` to `$3` ([`binding_values`]).
fn binding_by_key() -> String {
    format!(
        "SELECT {BINDING_COLUMNS} FROM brain_bindings \
         WHERE adapter_id = $1 AND session_id = $2 AND environment = $3"
    )
}

fn binding_values(key: &BindingKey) -> [Value<'_>; 3] {
    [
        Value::Text(&key.adapter_id),
        Value::Text(&key.session_id),
        Value::Text(&key.environment),
    ]
}

/// What a delivery that found the operation already stored or claimed answers (see
/// [`Claim`]); one that was abandoned is settled with `unknown` here, in the caller's
/// transaction.
async fn repeat_in(
    tx: &mut sqlx::AnyConnection,
    new: &NewOperation,
    unknown: &str,
    now: i64,
) -> Result<Claim, StoreError> {
    let key = key_values(&new.key)?;
    let (digest, holder, running, lease_until) = OPERATIONS
        .found(tx, &key)
        .await?
        .ok_or(StoreError::NotFound)?;
    let mut settling = false;
    let claim: fn(Operation) -> Claim = match ledger::decide(
        &digest,
        running,
        lease_until,
        &new.digest,
        now,
    ) {
        Found::Mismatch => Claim::SequenceReused,
        Found::Done => Claim::Duplicate,
        Found::Live => Claim::InProgress,
        Found::Abandoned => {
            settling = true;
            let settled = OPERATIONS
                .answer(tx, &key, &holder, &[Value::Text(unknown)], now, Some(now))
                .await?;
            if settled {
                tracing::warn!(brain_session = %new.key.session_id, sequence = new.key.sequence, "a brain operation abandoned mid-run is settled as unknown");
            }
            // Not settled here when a concurrent delivery settled it first (its receipt is
            // the answer) or its runner renewed just now (it runs).
            Claim::SettledUnknown
        }
    };
    let operation = operation_in(tx, &new.key).await?;
    if settling && operation.state == OperationState::Started {
        return Ok(Claim::InProgress(operation));
    }
    Ok(claim(operation))
}

/// The binding `key` names, if any.
async fn binding_in(
    connection: &mut sqlx::AnyConnection,
    key: &BindingKey,
) -> Result<Option<Binding>, StoreError> {
    let row = ledger::bind(
        sqlx::query(sqlx::AssertSqlSafe(binding_by_key())),
        &binding_values(key),
    )
    .fetch_optional(&mut *connection)
    .await?;
    row.map(|row| binding_from_row(&row)).transpose()
}

async fn operation_in(
    connection: &mut sqlx::AnyConnection,
    key: &OperationKey,
) -> Result<Operation, StoreError> {
    let sql = format!(
        "SELECT {OPERATION_COLUMNS} FROM brain_operations \
         WHERE adapter_id = $1 AND session_id = $2 AND sequence = $3"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&key.adapter_id)
        .bind(&key.session_id)
        .bind(sequence(key)?)
        .fetch_optional(&mut *connection)
        .await?
        .ok_or(StoreError::NotFound)?;
    operation_from_row(&row)
}

fn operation_from_row(row: &AnyRow) -> Result<Operation, StoreError> {
    let sequence: i64 = row.try_get("sequence")?;
    let state: String = row.try_get("state")?;
    let kind: String = row.try_get("kind")?;
    let cancel_requested: i64 = row.try_get("cancel_requested")?;
    Ok(Operation {
        key: OperationKey {
            adapter_id: row.try_get("adapter_id")?,
            session_id: row.try_get("session_id")?,
            sequence: u64::try_from(sequence)
                .map_err(|_| StoreError::Corrupt(format!("operation sequence {sequence}")))?,
        },
        environment: row.try_get("environment")?,
        // Rows an earlier version wrote name what Brain sent (`malformed`, a type not
        // served): every such one is a kind this service does not serve.
        kind: OperationKind::from_label(&kind).unwrap_or(OperationKind::Other),
        digest: row.try_get("digest")?,
        state: OperationState::from_label(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("operation state {state:?}")))?,
        runner: row.try_get("runner")?,
        lease_until_ms: row.try_get("lease_until_ms")?,
        cancel_requested: cancel_requested != 0,
        receipt: row.try_get("receipt")?,
        started_at_ms: row.try_get("started_at_ms")?,
        finished_at_ms: row.try_get("finished_at_ms")?,
    })
}

fn binding_from_row(row: &AnyRow) -> Result<Binding, StoreError> {
    let key = BindingKey {
        adapter_id: row.try_get("adapter_id")?,
        session_id: row.try_get("session_id")?,
        environment: row.try_get("environment")?,
    };
    let corrupt = |what: &str| StoreError::Corrupt(format!("{what} of binding {key:?}"));
    let scope: String = row.try_get("scope")?;
    let environment_id: String = row.try_get("environment_id")?;
    let version: i64 = row.try_get("version")?;
    let lifetime: String = row.try_get("lifetime")?;
    let release: i64 = row.try_get("release_on_turn_end")?;
    let session: String = row.try_get("plinth_session_id")?;
    let state: String = row.try_get("state")?;
    let plinth_session = if session.is_empty() {
        None
    } else {
        Some(SessionId::parse(&session).ok_or_else(|| corrupt("session"))?)
    };
    Ok(Binding {
        scope: Scope::parse(&scope).map_err(|_| corrupt("scope"))?,
        environment_id: EnvironmentId::parse(&environment_id)
            .ok_or_else(|| corrupt("environment"))?,
        version: u32::try_from(version).map_err(|_| corrupt("version"))?,
        lifetime: Lifetime::from_label(&lifetime).ok_or_else(|| corrupt("lifetime"))?,
        release_on_turn_end: release != 0,
        plinth_session,
        state: BindingState::from_label(&state).ok_or_else(|| corrupt("state"))?,
        configuration: row.try_get("configuration")?,
        created_at_ms: row.try_get("created_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
        key,
    })
}
