//! The Brain operation ledger and bindings. What is durable here and why: Brain sends each
//! operation once and may deliver it again (after either side restarts); an operation must
//! never run twice, and every delivery must answer the same receipt. The claim, lease,
//! settle and finish rules are the ledger's (`super::ledger`), shared with Novo's idempotency
//! keys; what a delivery answers is decided here, in the claim's transaction. A binding's
//! Plinth session is replaced only by compare-and-set on its row, and its state moves only
//! as `crate::domain::brain::may_move` allows, checked by the UPDATE itself.

use plinth_kit::database::now_ms;
use sqlx::Row;
use sqlx::any::AnyRow;

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
        let now = now_ms();
        let key = key_values(&new.key)?;
        let mut tx = self.db.begin_write().await?;
        let claimed = OPERATIONS
            .claim(
                &mut tx,
                &[
                    "adapter_id",
                    "session_id",
                    "sequence",
                    "environment",
                    "kind",
                    "digest",
                    "runner",
                    "lease_until_ms",
                    "started_at_ms",
                ],
                &[
                    key[0],
                    key[1],
                    key[2],
                    Value::Text(&new.environment),
                    Value::Text(new.kind.label()),
                    Value::Text(&new.digest),
                    Value::Text(&new.runner),
                    Value::Int(now.saturating_add(new.lease_ms)),
                    Value::Int(now),
                ],
            )
            .await?;
        let mut settling = false;
        let claim: fn(Operation) -> Claim = if claimed {
            Claim::Claimed
        } else {
            let (digest, holder, running, lease_until) = OPERATIONS
                .found(&mut tx, &key)
                .await?
                .ok_or(StoreError::NotFound)?;
            match ledger::decide(&digest, running, lease_until, &new.digest, now) {
                Found::Mismatch => Claim::SequenceReused,
                Found::Done => Claim::Duplicate,
                Found::Live => Claim::InProgress,
                Found::Abandoned => {
                    settling = true;
                    let settled = OPERATIONS
                        .answer(
                            &mut tx,
                            &key,
                            &holder,
                            &[Value::Text(unknown)],
                            now,
                            Some(now),
                        )
                        .await?;
                    if settled {
                        tracing::warn!(brain_session = %new.key.session_id, sequence = new.key.sequence, "a brain operation abandoned mid-run is settled as unknown");
                    }
                    // Not settled here when a concurrent delivery settled it first (its
                    // receipt is the answer) or its runner renewed just now (it runs).
                    Claim::SettledUnknown
                }
            }
        };
        let operation = operation_in(&mut tx, &new.key).await?;
        tx.commit().await?;
        if settling && operation.state == OperationState::Started {
            return Ok(Claim::InProgress(operation));
        }
        Ok(claim(operation))
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
    /// operation as stored.
    pub async fn finish_operation(
        &self,
        key: &OperationKey,
        runner: &str,
        receipt: &str,
        turns: &[NewTurn],
    ) -> Result<(bool, Operation), StoreError> {
        let mut tx = self.db.begin_write().await?;
        let recorded = OPERATIONS
            .answer(
                &mut tx,
                &key_values(key)?,
                runner,
                &[Value::Text(receipt)],
                now_ms(),
                None,
            )
            .await?;
        let operation = operation_in(&mut tx, key).await?;
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
        let sql = format!(
            "SELECT {BINDING_COLUMNS} FROM brain_bindings \
             WHERE adapter_id = $1 AND session_id = $2 AND environment = $3"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&key.adapter_id)
            .bind(&key.session_id)
            .bind(&key.environment)
            .fetch_optional(&self.db.writer)
            .await?
            .ok_or(StoreError::NotFound)?;
        binding_from_row(&row)
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
