//! Every query the source service makes, and nothing else touches its database.
//!
//! What is durable here and why: the index of each environment's source (path → kind,
//! digest, size, executable bit) is what owners edited or imported, and what the next build
//! snapshots; the bytes live in the blob store under their digests. Every change is one
//! transaction that first bumps the environment's generation, which serializes the writers of
//! one environment, so the file-versus-directory rules and the statistics never race. An
//! import is one transaction too: it lands whole or not at all.

use std::collections::{BTreeMap, HashMap};

use plinth_blobs::Digest;
use plinth_kit::database::{Backend, Database, DatabaseError, MigrationFile};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use crate::paths::SourcePath;

mod collection;

pub use collection::{Held, WorkId};

fn migrations(backend: Backend) -> &'static [MigrationFile] {
    match backend {
        Backend::Sqlite => &[
            (
                1,
                "source",
                include_str!("../migrations/sqlite/0001_source.sql"),
            ),
            (
                3,
                "garbage collection",
                include_str!("../migrations/sqlite/0003_collection.sql"),
            ),
        ],
        Backend::Postgres => &[
            (
                1,
                "source",
                include_str!("../migrations/postgres/0001_source.sql"),
            ),
            (
                3,
                "garbage collection",
                include_str!("../migrations/postgres/0003_collection.sql"),
            ),
        ],
    }
}

/// Rows per multi-row INSERT: well under both backends' parameter limits.
const INSERT_BATCH: usize = 500;

/// What an index entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Directory => "dir",
        }
    }
}

/// One index entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// Its path.
    pub path: SourcePath,
    /// File or directory.
    pub kind: Kind,
    /// A file's digest.
    pub digest: Option<Digest>,
    /// A file's bytes.
    pub size: u64,
    /// A file's executable bit.
    pub executable: bool,
}

impl IndexEntry {
    /// A directory entry.
    pub fn directory(path: SourcePath) -> Self {
        IndexEntry {
            path,
            kind: Kind::Directory,
            digest: None,
            size: 0,
            executable: false,
        }
    }
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// No such path.
    #[error("{0} does not exist")]
    NotFound(String),
    /// The change would turn a file into a directory or the reverse.
    #[error("{path}: {reason}")]
    Conflict {
        /// The path at fault.
        path: String,
        /// What is in the way.
        reason: String,
    },
    /// The database could not be opened or migrated.
    #[error(transparent)]
    Open(#[from] DatabaseError),
    /// The database refused or failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored row breaks an invariant.
    #[error("stored index row is corrupt: {0}")]
    Corrupt(String),
    /// The work's holds against garbage collection lapsed before its rows could be committed
    /// (it stalled longer than `gc.hold_seconds`): its blobs may be gone, so nothing is
    /// committed.
    #[error(
        "this write took longer than its holds against garbage collection last (gc.hold_seconds) and was not committed; retry it"
    )]
    HoldsLapsed,
}

/// Files and bytes of one source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Regular files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The source index.
#[derive(Clone)]
pub struct Index {
    db: Database,
}

const COLUMNS: &str = "path, kind, digest, size, executable";

impl Index {
    /// Connects.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, IndexError> {
        Ok(Index {
            db: Database::connect(url, max_connections).await?,
        })
    }

    /// Applies the migrations this build knows.
    pub async fn migrate(&self) -> Result<(), IndexError> {
        self.db
            .migrate("_plinth_source_migrations", migrations(self.db.backend))
            .await?;
        Ok(())
    }

    /// Answers when the database does.
    pub async fn ping(&self) -> Result<(), IndexError> {
        Ok(self.db.ping().await?)
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.db.close().await;
    }

    /// Every entry of a source, sorted by path.
    pub async fn list(&self, environment: &str) -> Result<Vec<IndexEntry>, IndexError> {
        let sql =
            format!("SELECT {COLUMNS} FROM source_entries WHERE environment_id = $1 ORDER BY path");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(environment)
            .fetch_all(&self.db.reader)
            .await?;
        rows.iter().map(entry_from_row).collect()
    }

    /// One entry.
    pub async fn get(
        &self,
        environment: &str,
        path: &SourcePath,
    ) -> Result<Option<IndexEntry>, IndexError> {
        let sql =
            format!("SELECT {COLUMNS} FROM source_entries WHERE environment_id = $1 AND path = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(environment)
            .bind(path.as_str())
            .fetch_optional(&self.db.reader)
            .await?;
        row.as_ref().map(entry_from_row).transpose()
    }

    /// Files and bytes of each environment that has any.
    pub async fn stats(
        &self,
        environments: &[String],
    ) -> Result<HashMap<String, Stats>, IndexError> {
        let mut stats = HashMap::new();
        for batch in environments.chunks(INSERT_BATCH) {
            let placeholders: Vec<String> = (1..=batch.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT environment_id, files_count, files_bytes FROM source_environments \
                 WHERE environment_id IN ({})",
                placeholders.join(", ")
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for environment in batch {
                query = query.bind(environment.as_str());
            }
            for row in query.fetch_all(&self.db.reader).await? {
                let environment: String = row.try_get("environment_id")?;
                let files: i64 = row.try_get("files_count")?;
                let bytes: i64 = row.try_get("files_bytes")?;
                stats.insert(
                    environment,
                    Stats {
                        files: u64::try_from(files).unwrap_or(0),
                        bytes: u64::try_from(bytes).unwrap_or(0),
                    },
                );
            }
        }
        Ok(stats)
    }

    /// Writes a file, making its parent directories. `executable: None` keeps an existing
    /// file's bit.
    pub async fn write_file(
        &self,
        environment: &str,
        path: &SourcePath,
        digest: Digest,
        size: u64,
        executable: Option<bool>,
    ) -> Result<IndexEntry, IndexError> {
        self.write_file_held(environment, path, digest, size, executable, None)
            .await
    }

    /// [`Index::write_file`] for work that held the blob (see `collection`): refused with
    /// `HoldsLapsed`, in the same transaction, when the work's holds have lapsed, since a
    /// collection may then have taken the blob.
    pub async fn write_file_held(
        &self,
        environment: &str,
        path: &SourcePath,
        digest: Digest,
        size: u64,
        executable: Option<bool>,
        held_by: Option<&WorkId>,
    ) -> Result<IndexEntry, IndexError> {
        let mut tx = self.begin_change(environment).await?;
        collection::holds_alive(&mut tx, held_by).await?;
        let existing = entries_at(&mut tx, environment, path).await?;
        check_parents_are_directories(path, &existing)?;
        let new_size = i64::try_from(size).unwrap_or(i64::MAX);
        let (executable, delta) = match existing.get(path.as_str()) {
            Some(entry) if entry.kind == Kind::Directory => {
                return Err(IndexError::Conflict {
                    path: path.to_string(),
                    reason: "is a directory; delete it first to put a file there".to_owned(),
                });
            }
            Some(entry) => (
                executable.unwrap_or(entry.executable),
                Delta {
                    files: 0,
                    bytes: new_size - i64::try_from(entry.size).unwrap_or(i64::MAX),
                },
            ),
            None => (
                executable.unwrap_or(false),
                Delta {
                    files: 1,
                    bytes: new_size,
                },
            ),
        };
        let mut rows: Vec<IndexEntry> = path
            .ancestors()
            .filter(|ancestor| !existing.contains_key(ancestor.as_str()))
            .map(IndexEntry::directory)
            .collect();
        let entry = IndexEntry {
            path: path.clone(),
            kind: Kind::File,
            digest: Some(digest),
            size,
            executable,
        };
        rows.push(entry.clone());
        upsert(&mut tx, environment, &rows).await?;
        finish_change(tx, environment, Some(delta)).await?;
        Ok(entry)
    }

    /// Makes a directory and its parents; an existing directory is fine.
    pub async fn make_directory(
        &self,
        environment: &str,
        path: &SourcePath,
    ) -> Result<IndexEntry, IndexError> {
        let mut tx = self.begin_change(environment).await?;
        let existing = entries_at(&mut tx, environment, path).await?;
        check_parents_are_directories(path, &existing)?;
        if let Some(entry) = existing.get(path.as_str())
            && entry.kind == Kind::File
        {
            return Err(IndexError::Conflict {
                path: path.to_string(),
                reason: "is a file; delete it first to make a directory there".to_owned(),
            });
        }
        let rows: Vec<IndexEntry> = path
            .ancestors()
            .chain(std::iter::once(path.clone()))
            .filter(|p| !existing.contains_key(p.as_str()))
            .map(IndexEntry::directory)
            .collect();
        upsert(&mut tx, environment, &rows).await?;
        finish_change(tx, environment, Some(Delta::default())).await?;
        Ok(IndexEntry::directory(path.clone()))
    }

    /// Removes a file, or a directory and its subtree. Returns (files, directories) removed.
    pub async fn delete(
        &self,
        environment: &str,
        path: &SourcePath,
    ) -> Result<(u64, u64), IndexError> {
        let mut tx = self.begin_change(environment).await?;
        let (low, high) = subtree_range(path);
        let counts = sqlx::query(
            "SELECT kind, COUNT(*) AS n, CAST(COALESCE(SUM(size), 0) AS BIGINT) AS bytes FROM source_entries \
             WHERE environment_id = $1 AND (path = $2 OR (path >= $3 AND path < $4)) GROUP BY kind",
        )
        .bind(environment)
        .bind(path.as_str())
        .bind(&low)
        .bind(&high)
        .fetch_all(&mut *tx)
        .await?;
        let mut files = 0u64;
        let mut directories = 0u64;
        let mut bytes = 0i64;
        for row in &counts {
            let kind: String = row.try_get("kind")?;
            let n: i64 = row.try_get("n")?;
            let n = u64::try_from(n).unwrap_or(0);
            if kind == "file" {
                files = n;
                // SUM is NUMERIC on PostgreSQL, which the Any driver cannot read: the query
                // casts it to BIGINT on both backends.
                bytes = row.try_get("bytes")?;
            } else {
                directories = n;
            }
        }
        if files + directories == 0 {
            return Err(IndexError::NotFound(path.to_string()));
        }
        sqlx::query(
            "DELETE FROM source_entries WHERE environment_id = $1 \
             AND (path = $2 OR (path >= $3 AND path < $4))",
        )
        .bind(environment)
        .bind(path.as_str())
        .bind(&low)
        .bind(&high)
        .execute(&mut *tx)
        .await?;
        let delta = Delta {
            files: -i64::try_from(files).unwrap_or(i64::MAX),
            bytes: -bytes,
        };
        finish_change(tx, environment, Some(delta)).await?;
        Ok((files, directories))
    }

    /// Lands an import in one transaction: `replace` clears the source first; otherwise the
    /// entries land over what is there, and one that would turn a file into a directory or
    /// the reverse refuses the whole import.
    pub async fn apply_import(
        &self,
        environment: &str,
        replace: bool,
        entries: &[IndexEntry],
    ) -> Result<(), IndexError> {
        self.apply_import_held(environment, replace, entries, None)
            .await
    }

    /// [`Index::apply_import`] for work that held the blobs: refused with `HoldsLapsed` when
    /// its holds have lapsed (see [`Index::write_file_held`]).
    pub async fn apply_import_held(
        &self,
        environment: &str,
        replace: bool,
        entries: &[IndexEntry],
        held_by: Option<&WorkId>,
    ) -> Result<(), IndexError> {
        let mut tx = self.begin_change(environment).await?;
        collection::holds_alive(&mut tx, held_by).await?;
        let mut state: BTreeMap<String, Kind> = BTreeMap::new();
        if replace {
            sqlx::query("DELETE FROM source_entries WHERE environment_id = $1")
                .bind(environment)
                .execute(&mut *tx)
                .await?;
        } else {
            let rows =
                sqlx::query("SELECT path, kind FROM source_entries WHERE environment_id = $1")
                    .bind(environment)
                    .fetch_all(&mut *tx)
                    .await?;
            for row in &rows {
                let path: String = row.try_get("path")?;
                let kind: String = row.try_get("kind")?;
                state.insert(
                    path,
                    if kind == "file" {
                        Kind::File
                    } else {
                        Kind::Directory
                    },
                );
            }
        }
        let mut rows: Vec<IndexEntry> = Vec::with_capacity(entries.len());
        for entry in entries {
            for ancestor in entry.path.ancestors() {
                match state.get(ancestor.as_str()) {
                    Some(Kind::File) => {
                        return Err(IndexError::Conflict {
                            path: entry.path.to_string(),
                            reason: format!("{ancestor} is a file, not a directory"),
                        });
                    }
                    Some(Kind::Directory) => {}
                    None => {
                        state.insert(ancestor.as_str().to_owned(), Kind::Directory);
                        rows.push(IndexEntry::directory(ancestor));
                    }
                }
            }
            match (state.get(entry.path.as_str()), entry.kind) {
                (Some(Kind::Directory), Kind::File) => {
                    return Err(IndexError::Conflict {
                        path: entry.path.to_string(),
                        reason: "is a directory in the source; the import has a file there"
                            .to_owned(),
                    });
                }
                (Some(Kind::File), Kind::Directory) => {
                    return Err(IndexError::Conflict {
                        path: entry.path.to_string(),
                        reason: "is a file in the source; the import has a directory there"
                            .to_owned(),
                    });
                }
                (Some(Kind::Directory), Kind::Directory) => continue,
                _ => {}
            }
            state.insert(entry.path.as_str().to_owned(), entry.kind);
            rows.push(entry.clone());
        }
        upsert(&mut tx, environment, &rows).await?;
        finish_change(tx, environment, None).await?;
        Ok(())
    }

    /// Forgets a source.
    pub async fn drop_environment(&self, environment: &str) -> Result<(), IndexError> {
        let mut tx = self.db.begin_write().await?;
        sqlx::query("DELETE FROM source_entries WHERE environment_id = $1")
            .bind(environment)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM source_environments WHERE environment_id = $1")
            .bind(environment)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Opens a write transaction holding the environment's row, so writers of one environment
    /// take turns.
    async fn begin_change(
        &self,
        environment: &str,
    ) -> Result<Transaction<'static, Any>, IndexError> {
        let mut tx = self.db.begin_write().await?;
        sqlx::query(
            "INSERT INTO source_environments (environment_id) VALUES ($1) \
             ON CONFLICT (environment_id) DO UPDATE \
             SET generation = source_environments.generation + 1",
        )
        .bind(environment)
        .execute(&mut *tx)
        .await?;
        Ok(tx)
    }
}

/// How a change moved an environment's file statistics.
#[derive(Debug, Default, Clone, Copy)]
struct Delta {
    files: i64,
    bytes: i64,
}

/// Updates the statistics inside the change, then commits. A known delta costs O(1), so a
/// large source does not slow every write; `None` (imports) recounts.
async fn finish_change(
    mut tx: Transaction<'static, Any>,
    environment: &str,
    delta: Option<Delta>,
) -> Result<(), IndexError> {
    match delta {
        Some(delta) if delta.files == 0 && delta.bytes == 0 => {}
        Some(delta) => {
            sqlx::query(
                "UPDATE source_environments SET files_count = files_count + $1, \
                 files_bytes = files_bytes + $2 WHERE environment_id = $3",
            )
            .bind(delta.files)
            .bind(delta.bytes)
            .bind(environment)
            .execute(&mut *tx)
            .await?;
        }
        None => {
            sqlx::query(
                "UPDATE source_environments SET \
                 files_count = (SELECT COUNT(*) FROM source_entries WHERE environment_id = $1 AND kind = 'file'), \
                 files_bytes = (SELECT COALESCE(SUM(size), 0) FROM source_entries WHERE environment_id = $1 AND kind = 'file') \
                 WHERE environment_id = $1",
            )
            .bind(environment)
            .execute(&mut *tx)
            .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// The entries at `path` and at each of its ancestors.
async fn entries_at(
    tx: &mut Transaction<'static, Any>,
    environment: &str,
    path: &SourcePath,
) -> Result<HashMap<String, IndexEntry>, IndexError> {
    let mut found = HashMap::new();
    for candidate in path.ancestors().chain(std::iter::once(path.clone())) {
        let sql =
            format!("SELECT {COLUMNS} FROM source_entries WHERE environment_id = $1 AND path = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(environment)
            .bind(candidate.as_str())
            .fetch_optional(&mut **tx)
            .await?;
        if let Some(row) = row {
            let entry = entry_from_row(&row)?;
            found.insert(candidate.as_str().to_owned(), entry);
        }
    }
    Ok(found)
}

fn check_parents_are_directories(
    path: &SourcePath,
    existing: &HashMap<String, IndexEntry>,
) -> Result<(), IndexError> {
    for ancestor in path.ancestors() {
        if let Some(entry) = existing.get(ancestor.as_str())
            && entry.kind == Kind::File
        {
            return Err(IndexError::Conflict {
                path: path.to_string(),
                reason: format!("{ancestor} is a file, not a directory"),
            });
        }
    }
    Ok(())
}

/// The byte range holding a directory's subtree: `[dir/, dir0)` (`0` follows `/`).
fn subtree_range(path: &SourcePath) -> (String, String) {
    (format!("{path}/"), format!("{path}0"))
}

async fn upsert(
    tx: &mut Transaction<'static, Any>,
    environment: &str,
    rows: &[IndexEntry],
) -> Result<(), IndexError> {
    for batch in rows.chunks(INSERT_BATCH) {
        let mut sql = String::from(
            "INSERT INTO source_entries (environment_id, path, kind, digest, size, executable) VALUES ",
        );
        for i in 0..batch.len() {
            let base = i * 6;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!(
                "(${}, ${}, ${}, ${}, ${}, ${})",
                base + 1,
                base + 2,
                base + 3,
                base + 4,
                base + 5,
                base + 6
            ));
        }
        sql.push_str(
            " ON CONFLICT (environment_id, path) DO UPDATE SET kind = excluded.kind, \
             digest = excluded.digest, size = excluded.size, executable = excluded.executable",
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for row in batch {
            query = query
                .bind(environment)
                .bind(row.path.as_str())
                .bind(row.kind.as_str())
                .bind(
                    row.digest
                        .map(|digest| digest.to_string())
                        .unwrap_or_default(),
                )
                .bind(i64::try_from(row.size).unwrap_or(i64::MAX))
                .bind(i64::from(row.executable));
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

fn entry_from_row(row: &AnyRow) -> Result<IndexEntry, IndexError> {
    let path: String = row.try_get("path")?;
    let kind: String = row.try_get("kind")?;
    let digest: String = row.try_get("digest")?;
    let size: i64 = row.try_get("size")?;
    let executable: i64 = row.try_get("executable")?;
    let path = SourcePath::parse(&path).map_err(|error| IndexError::Corrupt(error.to_string()))?;
    let kind = match kind.as_str() {
        "file" => Kind::File,
        "dir" => Kind::Directory,
        other => return Err(IndexError::Corrupt(format!("{path}: kind {other:?}"))),
    };
    let digest = match kind {
        Kind::File => Some(
            digest
                .parse()
                .map_err(|_| IndexError::Corrupt(format!("{path}: digest {digest:?}")))?,
        ),
        Kind::Directory => None,
    };
    let size =
        u64::try_from(size).map_err(|_| IndexError::Corrupt(format!("{path}: size {size}")))?;
    Ok(IndexEntry {
        path,
        kind,
        digest,
        size,
        executable: executable != 0,
    })
}
