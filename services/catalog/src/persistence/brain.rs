//! The Brain operation ledger and bindings. What is durable here and why: Brain sends each
//! operation once and may deliver it again (after either side restarts); an operation must
//! never run twice, and every delivery must answer the same receipt. So an operation is
//! claimed by one `INSERT … ON CONFLICT DO NOTHING` before it runs (the primary key decides
//! who runs it, however deliveries race across gateway replicas), and its receipt is stored
//! by an UPDATE that names the claim and requires the row still started, so a runner that
//! lost its lease can never overwrite the `unknown` a later delivery was told. A binding's
//! Plinth session is replaced only by compare-and-set on its row.

use plinth_kit::database::now_ms;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Store, StoreError};
use crate::brain::{
    Binding, BindingKey, BindingState, Claim, Lifetime, NewOperation, Operation, OperationKey,
    OperationState,
};
use crate::model::{EnvironmentId, Scope};
use crate::sessions::SessionId;

const OPERATION_COLUMNS: &str = "adapter_id, session_id, sequence, environment, kind, digest, \
     state, runner, lease_until_ms, cancel_requested, receipt, started_at_ms, finished_at_ms";

const BINDING_COLUMNS: &str = "adapter_id, session_id, environment, scope, environment_id, \
     version, lifetime, release_on_turn_end, plinth_session_id, state, configuration, \
     created_at_ms, updated_at_ms";

fn sequence(key: &OperationKey) -> Result<i64, StoreError> {
    i64::try_from(key.sequence)
        .map_err(|_| StoreError::Corrupt(format!("sequence {} is past 2^63", key.sequence)))
}

impl Store {
    /// Claims an operation for `new.runner`, or answers it as stored when it was delivered
    /// before (with whether its runner's lease is still live).
    pub async fn claim_operation(&self, new: &NewOperation) -> Result<Claim, StoreError> {
        let now = now_ms();
        let inserted = sqlx::query(
            "INSERT INTO brain_operations (adapter_id, session_id, sequence, environment, kind, \
             digest, state, runner, lease_until_ms, started_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, 'started', $7, $8, $9) \
             ON CONFLICT (adapter_id, session_id, sequence) DO NOTHING",
        )
        .bind(&new.key.adapter_id)
        .bind(&new.key.session_id)
        .bind(sequence(&new.key)?)
        .bind(&new.environment)
        .bind(&new.kind)
        .bind(&new.digest)
        .bind(&new.runner)
        .bind(now + new.lease_ms)
        .bind(now)
        .execute(&self.db.writer)
        .await?;
        let operation = self.operation(&new.key).await?;
        if inserted.rows_affected() == 1 {
            return Ok(Claim::Started(operation));
        }
        let lease_live =
            operation.state == OperationState::Started && operation.lease_until_ms > now_ms();
        Ok(Claim::Duplicate {
            operation,
            lease_live,
        })
    }

    /// One operation; `NotFound` when it was never delivered. Read from the writer, so a
    /// claim or finish just made is always seen.
    pub async fn operation(&self, key: &OperationKey) -> Result<Operation, StoreError> {
        let sql = format!(
            "SELECT {OPERATION_COLUMNS} FROM brain_operations \
             WHERE adapter_id = $1 AND session_id = $2 AND sequence = $3"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&key.adapter_id)
            .bind(&key.session_id)
            .bind(sequence(key)?)
            .fetch_optional(&self.db.writer)
            .await?
            .ok_or(StoreError::NotFound)?;
        operation_from_row(&row)
    }

    /// Extends `runner`'s lease; `None` when it no longer holds the operation, else whether a
    /// cancellation was asked for.
    pub async fn renew_operation(
        &self,
        key: &OperationKey,
        runner: &str,
        lease_ms: i64,
    ) -> Result<Option<bool>, StoreError> {
        let row = sqlx::query(
            "UPDATE brain_operations SET lease_until_ms = $1 \
             WHERE adapter_id = $2 AND session_id = $3 AND sequence = $4 \
             AND state = 'started' AND runner = $5 RETURNING cancel_requested",
        )
        .bind(now_ms() + lease_ms)
        .bind(&key.adapter_id)
        .bind(&key.session_id)
        .bind(sequence(key)?)
        .bind(runner)
        .fetch_optional(&self.db.writer)
        .await?;
        row.map(|row| Ok(row.try_get::<i64, _>("cancel_requested")? != 0))
            .transpose()
    }

    /// Stores `runner`'s receipt if the operation is still its own and started; answers
    /// whether it did, and the operation as stored.
    pub async fn finish_operation(
        &self,
        key: &OperationKey,
        runner: &str,
        receipt: &str,
    ) -> Result<(bool, Operation), StoreError> {
        let updated = sqlx::query(
            "UPDATE brain_operations SET state = 'finished', receipt = $1, finished_at_ms = $2 \
             WHERE adapter_id = $3 AND session_id = $4 AND sequence = $5 \
             AND state = 'started' AND runner = $6",
        )
        .bind(receipt)
        .bind(now_ms())
        .bind(&key.adapter_id)
        .bind(&key.session_id)
        .bind(sequence(key)?)
        .bind(runner)
        .execute(&self.db.writer)
        .await?;
        Ok((updated.rows_affected() == 1, self.operation(key).await?))
    }

    /// Stores `receipt` for an operation still started whose lease has run out; answers the
    /// operation as stored, whoever stored its receipt.
    pub async fn settle_abandoned(
        &self,
        key: &OperationKey,
        receipt: &str,
    ) -> Result<Operation, StoreError> {
        let now = now_ms();
        sqlx::query(
            "UPDATE brain_operations SET state = 'finished', receipt = $1, finished_at_ms = $2 \
             WHERE adapter_id = $3 AND session_id = $4 AND sequence = $5 \
             AND state = 'started' AND lease_until_ms <= $2",
        )
        .bind(receipt)
        .bind(now)
        .bind(&key.adapter_id)
        .bind(&key.session_id)
        .bind(sequence(key)?)
        .execute(&self.db.writer)
        .await?;
        self.operation(key).await
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
             AND state = 'started' AND kind = 'execute' AND sequence < $4 \
             AND lease_until_ms > $5",
        )
        .bind(&binding.adapter_id)
        .bind(&binding.session_id)
        .bind(&binding.environment)
        .bind(before)
        .bind(now_ms())
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
        .bind(binding.lifetime.as_str())
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
    /// was, and the binding as it is now.
    pub async fn swap_binding_session(
        &self,
        key: &BindingKey,
        expected: Option<&SessionId>,
        replacement: Option<&SessionId>,
    ) -> Result<(bool, Binding), StoreError> {
        let updated = sqlx::query(
            "UPDATE brain_bindings SET plinth_session_id = $1, updated_at_ms = $2 \
             WHERE adapter_id = $3 AND session_id = $4 AND environment = $5 \
             AND plinth_session_id = $6",
        )
        .bind(replacement.map_or("", SessionId::as_str))
        .bind(now_ms())
        .bind(&key.adapter_id)
        .bind(&key.session_id)
        .bind(&key.environment)
        .bind(expected.map_or("", SessionId::as_str))
        .execute(&self.db.writer)
        .await?;
        Ok((updated.rows_affected() == 1, self.binding(key).await?))
    }

    /// Moves a binding to `state`.
    pub async fn set_binding_state(
        &self,
        key: &BindingKey,
        state: BindingState,
    ) -> Result<Binding, StoreError> {
        let updated = sqlx::query(
            "UPDATE brain_bindings SET state = $1, updated_at_ms = $2 \
             WHERE adapter_id = $3 AND session_id = $4 AND environment = $5",
        )
        .bind(state.as_str())
        .bind(now_ms())
        .bind(&key.adapter_id)
        .bind(&key.session_id)
        .bind(&key.environment)
        .execute(&self.db.writer)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        self.binding(key).await
    }
}

fn operation_from_row(row: &AnyRow) -> Result<Operation, StoreError> {
    let sequence: i64 = row.try_get("sequence")?;
    let state: String = row.try_get("state")?;
    let cancel_requested: i64 = row.try_get("cancel_requested")?;
    Ok(Operation {
        key: OperationKey {
            adapter_id: row.try_get("adapter_id")?,
            session_id: row.try_get("session_id")?,
            sequence: u64::try_from(sequence)
                .map_err(|_| StoreError::Corrupt(format!("operation sequence {sequence}")))?,
        },
        environment: row.try_get("environment")?,
        kind: row.try_get("kind")?,
        digest: row.try_get("digest")?,
        state: OperationState::parse(&state)
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
        lifetime: Lifetime::parse(&lifetime).ok_or_else(|| corrupt("lifetime"))?,
        release_on_turn_end: release != 0,
        plinth_session,
        state: BindingState::parse(&state).ok_or_else(|| corrupt("state"))?,
        configuration: row.try_get("configuration")?,
        created_at_ms: row.try_get("created_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
        key,
    })
}
