//! Harnesses. What is durable here and why: a harness row is the owner's record of which
//! environment a harness's tasks read, so that a task naming only the harness finds its
//! project, and an owner can see what a rebuild will reach. The environment is checked by the
//! write itself: an insert or update that names an environment of another scope, or one that
//! does not exist, touches no row, so a harness is never written pointing outside its scope
//! however requests race. There is no foreign key: deleting the environment neither cascades
//! to harnesses nor waits for them, and the harness keeps the old id (UHP §2, §5).

use plinth_kit::database::now_ms;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Store, StoreError};
use crate::domain::model::{
    Cursor, EnvironmentId, Harness, HarnessFields, HarnessId, Page, PageRequest, Scope,
};

const HARNESS_COLUMNS: &str = "id, scope, name, base, environment_id, created_at_ms, updated_at_ms";

impl Store {
    /// Inserts a new harness, if its environment is one of the scope
    /// (`StoreError::NoSuchEnvironment` otherwise).
    pub async fn create_harness(&self, fields: HarnessFields) -> Result<Harness, StoreError> {
        let now = now_ms();
        let harness = Harness {
            id: HarnessId::generate(),
            scope: fields.scope,
            name: fields.name,
            base: fields.base,
            environment_id: fields.environment_id,
            created_at_ms: now,
            updated_at_ms: now,
        };
        let inserted = sqlx::query(
            "INSERT INTO harnesses (id, scope, name, base, environment_id, created_at_ms, \
             updated_at_ms) SELECT $1, scope, $2, $3, id, $4, $5 FROM environments \
             WHERE scope = $6 AND id = $7",
        )
        .bind(harness.id.as_str())
        .bind(&harness.name)
        .bind(&harness.base)
        .bind(now)
        .bind(now)
        .bind(harness.scope.as_str())
        .bind(harness.environment_id.as_str())
        .execute(&self.db.writer)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::NoSuchEnvironment);
        }
        Ok(harness)
    }

    /// One harness of the scope, whatever became of its environment.
    pub async fn get_harness(&self, scope: &Scope, id: &HarnessId) -> Result<Harness, StoreError> {
        let sql = format!("SELECT {HARNESS_COLUMNS} FROM harnesses WHERE scope = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(scope.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.db.reader)
            .await?
            .ok_or(StoreError::NotFound)?;
        harness_from_row(&row)
    }

    /// Every harness of the scope, oldest first.
    pub async fn list_harnesses(&self, scope: &Scope) -> Result<Vec<Harness>, StoreError> {
        self.harnesses_after(scope, None, None, None).await
    }

    /// One page of the scope's harnesses, oldest first; only those naming `environment` when
    /// it is given, and then the environment must exist in the scope (`StoreError::NotFound`
    /// otherwise), so a deleted environment answers like any other that is not there.
    pub async fn list_harnesses_page(
        &self,
        scope: &Scope,
        environment: Option<&EnvironmentId>,
        page: &PageRequest,
    ) -> Result<Page<Harness>, StoreError> {
        if let Some(environment) = environment {
            self.environment_exists(scope, environment).await?;
        }
        let limit = page.limit as usize;
        let mut harnesses = self
            .harnesses_after(scope, environment, page.after.as_ref(), Some(limit + 1))
            .await?;
        let next = if harnesses.len() > limit {
            harnesses.truncate(limit);
            harnesses.last().map(|last| Cursor {
                key: last.created_at_ms,
                id: last.id.as_str().to_owned(),
            })
        } else {
            None
        };
        Ok(Page {
            items: harnesses,
            next,
        })
    }

    /// The harnesses of the scope that name `environment`, oldest first: what a rebuild of it
    /// reaches. The environment must exist in the scope (`StoreError::NotFound` otherwise),
    /// so a deleted environment answers like any other that is not there.
    pub async fn list_environment_harnesses(
        &self,
        scope: &Scope,
        environment: &EnvironmentId,
    ) -> Result<Vec<Harness>, StoreError> {
        self.environment_exists(scope, environment).await?;
        self.harnesses_after(scope, Some(environment), None, None)
            .await
    }

    async fn environment_exists(
        &self,
        scope: &Scope,
        environment: &EnvironmentId,
    ) -> Result<(), StoreError> {
        let exists =
            sqlx::query("SELECT 1 AS found FROM environments WHERE scope = $1 AND id = $2")
                .bind(scope.as_str())
                .bind(environment.as_str())
                .fetch_optional(&self.db.reader)
                .await?;
        match exists {
            Some(_) => Ok(()),
            None => Err(StoreError::NotFound),
        }
    }

    /// Harnesses in listing order (creation time, then id), of one environment when given,
    /// after `after` and at most `limit` of them: a keyset read on either index.
    async fn harnesses_after(
        &self,
        scope: &Scope,
        environment: Option<&EnvironmentId>,
        after: Option<&Cursor>,
        limit: Option<usize>,
    ) -> Result<Vec<Harness>, StoreError> {
        let mut sql = format!("SELECT {HARNESS_COLUMNS} FROM harnesses WHERE scope = $1");
        let mut next = 2;
        if environment.is_some() {
            sql.push_str(&format!(" AND environment_id = ${next}"));
            next += 1;
        }
        if after.is_some() {
            sql.push_str(&format!(
                " AND (created_at_ms, id) > (${next}, ${})",
                next + 1
            ));
        }
        sql.push_str(" ORDER BY created_at_ms, id");
        if let Some(limit) = limit {
            sql.push_str(&format!(" LIMIT {limit}"));
        }
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(scope.as_str());
        if let Some(environment) = environment {
            query = query.bind(environment.as_str());
        }
        if let Some(after) = after {
            query = query.bind(after.key).bind(after.id.as_str());
        }
        let rows = query.fetch_all(&self.db.reader).await?;
        rows.iter().map(harness_from_row).collect()
    }

    /// Replaces a harness's name, base and environment. `StoreError::NotFound` when the
    /// harness is not in the scope; `StoreError::NoSuchEnvironment` when it is but the
    /// environment is not, and then nothing changes.
    pub async fn update_harness(
        &self,
        id: &HarnessId,
        fields: HarnessFields,
    ) -> Result<Harness, StoreError> {
        let sql = format!(
            "UPDATE harnesses SET name = $1, base = $2, environment_id = $3, updated_at_ms = $4 \
             WHERE scope = $5 AND id = $6 AND EXISTS \
             (SELECT 1 FROM environments WHERE scope = $5 AND id = $3) \
             RETURNING {HARNESS_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&fields.name)
            .bind(&fields.base)
            .bind(fields.environment_id.as_str())
            .bind(now_ms())
            .bind(fields.scope.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.db.writer)
            .await?;
        match row {
            Some(row) => harness_from_row(&row),
            None => {
                // Which half failed: an unknown harness is reported before its environment.
                self.get_harness(&fields.scope, id).await?;
                Err(StoreError::NoSuchEnvironment)
            }
        }
    }

    /// Deletes a harness; nothing else refers to it in the catalog.
    pub async fn delete_harness(&self, scope: &Scope, id: &HarnessId) -> Result<(), StoreError> {
        let deleted = sqlx::query("DELETE FROM harnesses WHERE scope = $1 AND id = $2")
            .bind(scope.as_str())
            .bind(id.as_str())
            .execute(&self.db.writer)
            .await?;
        if deleted.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }
}

fn harness_from_row(row: &AnyRow) -> Result<Harness, StoreError> {
    let id: String = row.try_get("id")?;
    let scope: String = row.try_get("scope")?;
    let environment: String = row.try_get("environment_id")?;
    Ok(Harness {
        id: HarnessId::parse(&id)
            .ok_or_else(|| StoreError::Corrupt(format!("harness id {id:?}")))?,
        scope: Scope::parse(&scope).map_err(|_| StoreError::Corrupt(format!("scope of {id}")))?,
        name: row.try_get("name")?,
        base: row.try_get("base")?,
        environment_id: EnvironmentId::parse(&environment)
            .ok_or_else(|| StoreError::Corrupt(format!("environment of {id}: {environment:?}")))?,
        created_at_ms: row.try_get("created_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
    })
}
