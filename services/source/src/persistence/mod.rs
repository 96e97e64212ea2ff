//! Every query the source service makes, and nothing else touches its database.
//!
//! What is durable here and why: the index of each environment's source (path → kind,
//! digest, size, executable bit) is what owners edited or imported, and what the next build
//! snapshots; the bytes live in the blob store under their digests. Every change is one
//! transaction that first bumps the environment's generation, which serializes the writers of
//! one environment, so the file-versus-directory rules and the statistics never race. An
//! import is one transaction too: it lands whole or not at all.
//!
//! Each change also moves its scope's stored bytes (`ledger`) in the same transaction, and is
//! refused there when it would pass the scope's stored-bytes quota. A source's scope is
//! recorded the first time a request names it ([`Index::bind_scope`]).

mod ledger;

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
                include_str!("../../migrations/sqlite/0001_source.sql"),
            ),
            (
                2,
                "stored bytes per scope",
                include_str!("../../migrations/common/0002_stored_bytes.sql"),
            ),
            (
                3,
                "garbage collection",
                include_str!("../../migrations/sqlite/0003_collection.sql"),
            ),
            (
                4,
                "symlinks and git origins",
                include_str!("../../migrations/sqlite/0004_links_and_origins.sql"),
            ),
            (
                5,
                "git origin details",
                include_str!("../../migrations/common/0005_origin_details.sql"),
            ),
        ],
        Backend::Postgres => &[
            (
                1,
                "source",
                include_str!("../../migrations/postgres/0001_source.sql"),
            ),
            (
                2,
                "stored bytes per scope",
                include_str!("../../migrations/common/0002_stored_bytes.sql"),
            ),
            (
                3,
                "garbage collection",
                include_str!("../../migrations/postgres/0003_collection.sql"),
            ),
            (
                4,
                "symlinks and git origins",
                include_str!("../../migrations/postgres/0004_links_and_origins.sql"),
            ),
            (
                5,
                "git origin details",
                include_str!("../../migrations/common/0005_origin_details.sql"),
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
    /// A symbolic link whose target stays inside the root (see `links`): kept as a link,
    /// never followed on any disk.
    Symlink,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Directory => "dir",
            Kind::Symlink => "symlink",
        }
    }

    fn parse(text: &str) -> Option<Kind> {
        match text {
            "file" => Some(Kind::File),
            "dir" => Some(Kind::Directory),
            "symlink" => Some(Kind::Symlink),
            _ => None,
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
    /// A symlink's target, as written in the archive or repository.
    pub target: Option<String>,
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
            target: None,
        }
    }

    /// A symlink entry.
    pub fn symlink(path: SourcePath, target: String) -> Self {
        IndexEntry {
            path,
            kind: Kind::Symlink,
            digest: None,
            size: 0,
            executable: false,
            target: Some(target),
        }
    }
}

/// Where a source last came from by git (see [`Index::origin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The commit's full id (40 hex digits, 64 for SHA-256 repositories).
    pub commit: String,
    /// The branch, tag or commit the import asked for; empty for the default branch.
    pub reference: String,
    /// `git describe --tags --always --match '*[0-9]*'` of the commit: `v1.2.3`,
    /// `v1.2.3-4-gabc1234`, or the abbreviated commit when no such tag reaches it.
    pub describe: String,
    /// A pushed checkout had uncommitted changes to tracked files.
    pub dirty: bool,
    /// A git import could not fetch the history or tags `describe` needs.
    pub history_incomplete: bool,
    /// When the origin was recorded, seconds since the Unix epoch (0: before it was kept).
    pub recorded_at: i64,
    /// Commits reachable from the commit; 0 when not known.
    pub commits: u64,
}

/// What landing an import does to the source's git origin.
enum OriginChange<'a> {
    Keep,
    Forget,
    Set(&'a Origin),
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
    /// The change would write at or through a symlink, which the files API never does: the
    /// path names something other than a file or directory (UHP §3's `environment_invalid`).
    #[error("{path}: {reason}")]
    Link {
        /// The path at fault.
        path: String,
        /// Which link is in the way.
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
    /// The change would take its scope past its stored-bytes quota; nothing changed.
    #[error("the scope's stored bytes would pass its quota: {used} of {limit} used, {adding} more")]
    QuotaExceeded {
        /// The scope's limit.
        limit: u64,
        /// What the scope holds without the change.
        used: u64,
        /// What the change would add.
        adding: u64,
    },
    /// A request named a scope other than the one the source belongs to.
    #[error("environment {environment} belongs to another scope")]
    OtherScope {
        /// The environment.
        environment: String,
    },
    /// The work's holds against garbage collection lapsed before its rows could be committed
    /// (it stalled longer than `gc.hold_seconds`): its blobs may be gone, so nothing is
    /// committed.
    #[error(
        "this write took longer than its holds against garbage collection last (gc.hold_seconds) and was not committed; retry it"
    )]
    HoldsLapsed,
    /// A conditional write's precondition did not hold; nothing changed.
    #[error("{path}: the write's precondition does not hold")]
    PreconditionFailed {
        /// The file.
        path: String,
        /// The file's digest now; `None` when no file is there.
        current: Option<Digest>,
        /// What the write asked for that does not hold.
        failed: FailedCondition,
    },
}

/// Which half of a [`WriteCondition`] refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedCondition {
    /// `if_match`: the file is not one of the versions named (or is absent).
    Match,
    /// `if_none_match`: the file is one of the versions named (or, for any, exists).
    NoneMatch,
}

/// A set of file versions: any existing file, or those with one of these digests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DigestSet {
    /// Any existing file.
    pub any: bool,
    /// Content digests, as `sha256:<hex>` text (a tag a client made up simply matches none).
    pub digests: Vec<String>,
}

impl DigestSet {
    fn contains(&self, current: Option<&Digest>) -> bool {
        match current {
            None => false,
            Some(digest) => self.any || self.digests.contains(&digest.to_string()),
        }
    }
}

/// What a conditional write asks of the file it would replace (HTTP `If-Match` and
/// `If-None-Match`); the default asks nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteCondition {
    /// The file must exist and be in this set.
    pub if_match: Option<DigestSet>,
    /// The file must not be in this set.
    pub if_none_match: Option<DigestSet>,
}

impl WriteCondition {
    /// Checks the condition against the file's current digest (`None`: no file at the path;
    /// a directory or link there is no file either).
    pub fn check(&self, current: Option<&Digest>) -> Result<(), FailedCondition> {
        if let Some(set) = &self.if_match
            && !set.contains(current)
        {
            return Err(FailedCondition::Match);
        }
        if let Some(set) = &self.if_none_match
            && set.contains(current)
        {
            return Err(FailedCondition::NoneMatch);
        }
        Ok(())
    }
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
    /// Every scope's limits; only stored bytes are enforced here.
    quotas: std::sync::Arc<plinth_kit::quota::Quotas>,
}

const COLUMNS: &str = "path, kind, digest, size, executable, target";

impl Index {
    /// Connects.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, IndexError> {
        Ok(Index {
            db: Database::connect(url, max_connections).await?,
            quotas: std::sync::Arc::default(),
        })
    }

    /// These limits from now on (the defaults until set).
    pub fn with_quotas(mut self, quotas: plinth_kit::quota::Quotas) -> Self {
        self.quotas = std::sync::Arc::new(quotas);
        self
    }

    fn stored_bytes_limit(&self, scope: &str) -> Option<u64> {
        Some(
            self.quotas
                .limit(scope, plinth_kit::quota::Quota::StoredBytes),
        )
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

    /// Gives the disk what deleted rows held (see `Database::compact`).
    pub async fn compact(&self) -> Result<(), IndexError> {
        Ok(self.db.compact().await?)
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
        self.write_file_checked(
            environment,
            path,
            digest,
            size,
            executable,
            held_by,
            &WriteCondition::default(),
        )
        .await
    }

    /// [`Index::write_file_held`] only if `condition` holds for the file it replaces, checked
    /// in the same transaction as the write (which `begin_change` serialises against every
    /// other change of the source), so a write that came between a client's read and this
    /// one is never overwritten unseen: `PreconditionFailed`, and nothing changes.
    #[allow(clippy::too_many_arguments)]
    pub async fn write_file_checked(
        &self,
        environment: &str,
        path: &SourcePath,
        digest: Digest,
        size: u64,
        executable: Option<bool>,
        held_by: Option<&WorkId>,
        condition: &WriteCondition,
    ) -> Result<IndexEntry, IndexError> {
        let (mut tx, scope) = self.begin_change(environment).await?;
        collection::holds_alive(&mut tx, held_by).await?;
        let existing = entries_at(&mut tx, environment, path).await?;
        let current = existing
            .get(path.as_str())
            .filter(|entry| entry.kind == Kind::File)
            .and_then(|entry| entry.digest.as_ref());
        if let Err(failed) = condition.check(current) {
            return Err(IndexError::PreconditionFailed {
                path: path.to_string(),
                current: current.copied(),
                failed,
            });
        }
        check_parents_are_directories(path, &existing)?;
        let new_size = i64::try_from(size).unwrap_or(i64::MAX);
        let mut holders = ledger::Holders::new();
        ledger::hold(&mut holders, &digest.to_string(), new_size, 1);
        if let Some(IndexEntry {
            digest: Some(replaced),
            size: replaced_size,
            ..
        }) = existing.get(path.as_str())
        {
            let replaced_size = i64::try_from(*replaced_size).unwrap_or(i64::MAX);
            ledger::hold(&mut holders, &replaced.to_string(), replaced_size, -1);
        }
        let (executable, delta) = match existing.get(path.as_str()) {
            Some(entry) if entry.kind == Kind::Directory => {
                return Err(IndexError::Conflict {
                    path: path.to_string(),
                    reason: "is a directory; delete it first to put a file there".to_owned(),
                });
            }
            // Writing through a link is never done; replacing one silently would surprise.
            Some(entry) if entry.kind == Kind::Symlink => {
                return Err(IndexError::Link {
                    path: path.to_string(),
                    reason: format!(
                        "is a symlink ({}); delete it first to put a file there",
                        crate::links::NOT_SERVED
                    ),
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
            target: None,
        };
        rows.push(entry.clone());
        let rows: Vec<NewRow<'_>> = rows.iter().map(NewRow::from).collect();
        upsert(&mut tx, environment, &rows).await?;
        if let Some(scope) = &scope {
            ledger::apply(&mut tx, scope, &holders, self.stored_bytes_limit(scope)).await?;
        }
        finish_change(tx, environment, Some(delta)).await?;
        Ok(entry)
    }

    /// Makes a directory and its parents; an existing directory is fine.
    pub async fn make_directory(
        &self,
        environment: &str,
        path: &SourcePath,
    ) -> Result<IndexEntry, IndexError> {
        let (mut tx, _) = self.begin_change(environment).await?;
        let existing = entries_at(&mut tx, environment, path).await?;
        check_parents_are_directories(path, &existing)?;
        if let Some(entry) = existing.get(path.as_str())
            && entry.kind != Kind::Directory
        {
            return Err(if entry.kind == Kind::Symlink {
                IndexError::Link {
                    path: path.to_string(),
                    reason: "is a symlink; delete it first to make a directory there".to_owned(),
                }
            } else {
                IndexError::Conflict {
                    path: path.to_string(),
                    reason: "is a file; delete it first to make a directory there".to_owned(),
                }
            });
        }
        let rows: Vec<IndexEntry> = path
            .ancestors()
            .chain(std::iter::once(path.clone()))
            .filter(|p| !existing.contains_key(p.as_str()))
            .map(IndexEntry::directory)
            .collect();
        let rows: Vec<NewRow<'_>> = rows.iter().map(NewRow::from).collect();
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
        let (mut tx, scope) = self.begin_change(environment).await?;
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
        let mut links = 0u64;
        let mut bytes = 0i64;
        for row in &counts {
            let kind: String = row.try_get("kind")?;
            let n: i64 = row.try_get("n")?;
            let n = u64::try_from(n).unwrap_or(0);
            match Kind::parse(&kind) {
                Some(Kind::File) => {
                    files = n;
                    // SUM is NUMERIC on PostgreSQL, which the Any driver cannot read: the
                    // query casts it to BIGINT on both backends.
                    bytes = row.try_get("bytes")?;
                }
                Some(Kind::Directory) => directories = n,
                Some(Kind::Symlink) => links = n,
                None => return Err(IndexError::Corrupt(format!("kind {kind:?}"))),
            }
        }
        if files + directories + links == 0 {
            return Err(IndexError::NotFound(path.to_string()));
        }
        if let Some(scope) = &scope {
            let held =
                ledger::source_holders(&mut tx, environment, Some((path.as_str(), &low, &high)))
                    .await?;
            let released = ledger::difference(&held, &ledger::Holders::new());
            ledger::apply(&mut tx, scope, &released, None).await?;
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
    /// its holds have lapsed (see [`Index::write_file_held`]). An archive import that
    /// replaces the source forgets its git origin (the files no longer come from that
    /// commit); one that lands over it keeps it.
    pub async fn apply_import_held(
        &self,
        environment: &str,
        replace: bool,
        entries: &[IndexEntry],
        held_by: Option<&WorkId>,
    ) -> Result<(), IndexError> {
        let origin = if replace {
            OriginChange::Forget
        } else {
            OriginChange::Keep
        };
        self.land_import(environment, replace, entries, held_by, origin)
            .await
    }

    /// [`Index::apply_import_held`] for files from git (a git import, or an archive of a
    /// checkout that names its origin): records where they came from, in the same transaction
    /// (the last one wins).
    pub async fn apply_git_import_held(
        &self,
        environment: &str,
        replace: bool,
        entries: &[IndexEntry],
        held_by: Option<&WorkId>,
        origin: &Origin,
    ) -> Result<(), IndexError> {
        self.land_import(
            environment,
            replace,
            entries,
            held_by,
            OriginChange::Set(origin),
        )
        .await
    }

    /// Where the source last came from by git, if it did.
    pub async fn origin(&self, environment: &str) -> Result<Option<Origin>, IndexError> {
        let row = sqlx::query(
            "SELECT commit_id, reference, describe, dirty, history_incomplete, recorded_at, \
             commits FROM source_origins WHERE environment_id = $1",
        )
        .bind(environment)
        .fetch_optional(&self.db.reader)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Origin {
            commit: row.try_get("commit_id")?,
            reference: row.try_get("reference")?,
            describe: row.try_get("describe")?,
            dirty: row.try_get::<i64, _>("dirty")? != 0,
            history_incomplete: row.try_get::<i64, _>("history_incomplete")? != 0,
            recorded_at: row.try_get("recorded_at")?,
            commits: u64::try_from(row.try_get::<i64, _>("commits")?).unwrap_or(0),
        }))
    }

    async fn land_import(
        &self,
        environment: &str,
        replace: bool,
        entries: &[IndexEntry],
        held_by: Option<&WorkId>,
        origin: OriginChange<'_>,
    ) -> Result<(), IndexError> {
        let (mut tx, scope) = self.begin_change(environment).await?;
        collection::holds_alive(&mut tx, held_by).await?;
        let held_before = match &scope {
            Some(_) => Some(ledger::source_holders(&mut tx, environment, None).await?),
            None => None,
        };
        let mut existing: Vec<(String, Kind)> = Vec::new();
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
                let kind = Kind::parse(&kind)
                    .ok_or_else(|| IndexError::Corrupt(format!("{path}: kind {kind:?}")))?;
                existing.push((path, kind));
            }
        }
        // What each path is, in the source and in the import: borrowed from the rows read and
        // the entries given, never copied (an import of 200,000 long paths, and their
        // directories, would otherwise be held several times over).
        let mut state: HashMap<&str, Kind> = existing
            .iter()
            .map(|(path, kind)| (path.as_str(), *kind))
            .collect();
        let mut rows: Vec<NewRow<'_>> = Vec::with_capacity(entries.len());
        for entry in entries {
            let path = entry.path.as_str();
            for ancestor in path.match_indices('/').map(|(at, _)| &path[..at]) {
                match state.get(ancestor) {
                    Some(Kind::File) => {
                        return Err(IndexError::Conflict {
                            path: entry.path.to_string(),
                            reason: format!("{ancestor} is a file, not a directory"),
                        });
                    }
                    // Nothing is ever put through a link.
                    Some(Kind::Symlink) => {
                        return Err(IndexError::Link {
                            path: entry.path.to_string(),
                            reason: format!("{ancestor} is a symlink, not a directory"),
                        });
                    }
                    Some(Kind::Directory) => {}
                    None => {
                        state.insert(ancestor, Kind::Directory);
                        rows.push(NewRow::directory(ancestor));
                    }
                }
            }
            match (state.get(path), entry.kind) {
                (Some(Kind::Directory), Kind::File | Kind::Symlink) => {
                    return Err(IndexError::Conflict {
                        path: entry.path.to_string(),
                        reason:
                            "is a directory in the source; the import has a file or symlink there"
                                .to_owned(),
                    });
                }
                (Some(Kind::File | Kind::Symlink), Kind::Directory) => {
                    return Err(IndexError::Conflict {
                        path: entry.path.to_string(),
                        reason:
                            "is a file or symlink in the source; the import has a directory there"
                                .to_owned(),
                    });
                }
                (Some(Kind::Directory), Kind::Directory) => continue,
                _ => {}
            }
            state.insert(path, entry.kind);
            rows.push(NewRow::from(entry));
        }
        upsert(&mut tx, environment, &rows).await?;
        if let (Some(scope), Some(before)) = (&scope, &held_before) {
            let after = ledger::source_holders(&mut tx, environment, None).await?;
            let change = ledger::difference(before, &after);
            ledger::apply(&mut tx, scope, &change, self.stored_bytes_limit(scope)).await?;
        }
        match origin {
            OriginChange::Keep => {}
            OriginChange::Forget => {
                sqlx::query("DELETE FROM source_origins WHERE environment_id = $1")
                    .bind(environment)
                    .execute(&mut *tx)
                    .await?;
            }
            OriginChange::Set(origin) => {
                sqlx::query(
                    "INSERT INTO source_origins (environment_id, commit_id, reference, describe, \
                     dirty, history_incomplete, recorded_at, commits) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (environment_id) DO UPDATE \
                     SET commit_id = excluded.commit_id, reference = excluded.reference, \
                     describe = excluded.describe, dirty = excluded.dirty, \
                     history_incomplete = excluded.history_incomplete, \
                     recorded_at = excluded.recorded_at, commits = excluded.commits",
                )
                .bind(environment)
                .bind(&origin.commit)
                .bind(&origin.reference)
                .bind(&origin.describe)
                .bind(i64::from(origin.dirty))
                .bind(i64::from(origin.history_incomplete))
                .bind(origin.recorded_at)
                .bind(i64::try_from(origin.commits).unwrap_or(i64::MAX))
                .execute(&mut *tx)
                .await?;
            }
        }
        finish_change(tx, environment, None).await?;
        Ok(())
    }

    /// Forgets a source, and the layers recorded for its builds: its scope holds their blobs
    /// no more.
    pub async fn drop_environment(&self, environment: &str) -> Result<(), IndexError> {
        let (mut tx, scope) = self.begin_change(environment).await?;
        if let Some(scope) = &scope {
            let held = ledger::source_holders(&mut tx, environment, None).await?;
            let mut released = ledger::difference(&held, &ledger::Holders::new());
            let layers = sqlx::query(
                "SELECT DISTINCT layer_tree FROM source_layers WHERE environment_id = $1",
            )
            .bind(environment)
            .fetch_all(&mut *tx)
            .await?;
            let mut trees = Vec::new();
            for row in &layers {
                let tree: String = row.try_get("layer_tree")?;
                let count: i64 = sqlx::query(
                    "SELECT COUNT(*) AS n FROM source_layers WHERE environment_id = $1 AND layer_tree = $2",
                )
                .bind(environment)
                .bind(&tree)
                .fetch_one(&mut *tx)
                .await?
                .try_get("n")?;
                for (digest, (size, _)) in ledger::layer_holders(&mut tx, &tree, 1).await? {
                    ledger::hold(&mut released, &digest, size, -count);
                }
                trees.push(tree);
            }
            ledger::apply(&mut tx, scope, &released, None).await?;
            sqlx::query("DELETE FROM source_layers WHERE environment_id = $1")
                .bind(environment)
                .execute(&mut *tx)
                .await?;
            for tree in &trees {
                forget_unheld_tree(&mut tx, tree).await?;
            }
        }
        sqlx::query("DELETE FROM source_entries WHERE environment_id = $1")
            .bind(environment)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM source_origins WHERE environment_id = $1")
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
    /// Answers the source's scope too, when its files are counted in that scope's stored
    /// bytes (see [`Index::bind_scope`]): the change must then move them.
    async fn begin_change(
        &self,
        environment: &str,
    ) -> Result<(Transaction<'static, Any>, Option<String>), IndexError> {
        let mut tx = self.db.begin_write().await?;
        let row = sqlx::query(
            "INSERT INTO source_environments (environment_id) VALUES ($1) \
             ON CONFLICT (environment_id) DO UPDATE \
             SET generation = source_environments.generation + 1 \
             RETURNING scope, counted",
        )
        .bind(environment)
        .fetch_one(&mut *tx)
        .await?;
        let scope: String = row.try_get("scope")?;
        let counted: i64 = row.try_get("counted")?;
        Ok((tx, (counted != 0 && !scope.is_empty()).then_some(scope)))
    }

    /// Records that the source of `environment` belongs to `scope` (the gateway names it with
    /// every change), and counts its files in the scope's stored bytes from now on: at once
    /// for a source an earlier version wrote, whatever the quota (its bytes are there
    /// already). Cheap when already done: one read. `IndexError::OtherScope` when the source
    /// belongs to another scope.
    pub async fn bind_scope(&self, environment: &str, scope: &str) -> Result<(), IndexError> {
        let bound =
            sqlx::query("SELECT scope, counted FROM source_environments WHERE environment_id = $1")
                .bind(environment)
                .fetch_optional(&self.db.reader)
                .await?;
        if let Some(row) = &bound {
            let known: String = row.try_get("scope")?;
            let counted: i64 = row.try_get("counted")?;
            if known == scope && counted != 0 {
                return Ok(());
            }
            if !known.is_empty() && known != scope {
                return Err(IndexError::OtherScope {
                    environment: environment.to_owned(),
                });
            }
        }
        let (mut tx, _) = self.begin_change(environment).await?;
        let row = sqlx::query(
            "UPDATE source_environments SET scope = $1 WHERE environment_id = $2 \
             AND (scope = '' OR scope = $1) RETURNING counted",
        )
        .bind(scope)
        .bind(environment)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Err(IndexError::OtherScope {
                environment: environment.to_owned(),
            });
        };
        let counted: i64 = row.try_get("counted")?;
        if counted == 0 {
            let held = ledger::source_holders(&mut tx, environment, None).await?;
            let adopted = ledger::difference(&ledger::Holders::new(), &held);
            ledger::apply(&mut tx, scope, &adopted, None).await?;
            sqlx::query("UPDATE source_environments SET counted = 1 WHERE environment_id = $1")
                .bind(environment)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The bytes of the distinct blobs `scope` holds in its sources and recorded layers.
    pub async fn stored_bytes(&self, scope: &str) -> Result<u64, IndexError> {
        let row = sqlx::query("SELECT bytes FROM scope_stored_bytes WHERE scope = $1")
            .bind(scope)
            .fetch_optional(&self.db.reader)
            .await?;
        let bytes: i64 = match row {
            Some(row) => row.try_get("bytes")?,
            None => 0,
        };
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    /// The stored-bytes limit of `scope`.
    pub fn stored_bytes_quota(&self, scope: &str) -> u64 {
        self.quotas
            .limit(scope, plinth_kit::quota::Quota::StoredBytes)
    }

    /// Counts a build's layer (its distinct file blobs, `blobs`: digest → size) in `scope`'s
    /// stored bytes, for version `version` of `environment`, recorded by build attempt
    /// `attempt`. A later attempt's record replaces an earlier one's; an earlier attempt's
    /// is ignored (answers false). Refused with `IndexError::QuotaExceeded` when the blobs
    /// the scope holds nowhere else would take it past its quota; nothing is recorded then.
    pub async fn record_layer(
        &self,
        scope: &str,
        environment: &str,
        version: u32,
        attempt: u32,
        layer_tree: &str,
        blobs: &BTreeMap<String, u64>,
    ) -> Result<bool, IndexError> {
        self.bind_scope(environment, scope).await?;
        let (mut tx, _) = self.begin_change(environment).await?;
        let earlier = sqlx::query(
            "SELECT attempt, layer_tree, scope FROM source_layers \
             WHERE environment_id = $1 AND version = $2",
        )
        .bind(environment)
        .bind(i64::from(version))
        .fetch_optional(&mut *tx)
        .await?;
        let mut change = ledger::Holders::new();
        if let Some(row) = &earlier {
            let earlier_attempt: i64 = row.try_get("attempt")?;
            let earlier_tree: String = row.try_get("layer_tree")?;
            if earlier_attempt > i64::from(attempt)
                || (earlier_attempt == i64::from(attempt) && earlier_tree == layer_tree)
            {
                return Ok(earlier_attempt == i64::from(attempt));
            }
            change = ledger::layer_holders(&mut tx, &earlier_tree, -1).await?;
        }
        let known = sqlx::query("SELECT 1 AS known FROM layer_blobs WHERE layer_tree = $1 LIMIT 1")
            .bind(layer_tree)
            .fetch_optional(&mut *tx)
            .await?;
        if known.is_none() {
            let blobs: Vec<(&String, &u64)> = blobs.iter().collect();
            for batch in blobs.chunks(INSERT_BATCH) {
                let mut sql =
                    String::from("INSERT INTO layer_blobs (layer_tree, digest, size) VALUES ");
                for i in 0..batch.len() {
                    if i > 0 {
                        sql.push_str(", ");
                    }
                    sql.push_str(&format!("(${}, ${}, ${})", i * 3 + 1, i * 3 + 2, i * 3 + 3));
                }
                sql.push_str(" ON CONFLICT (layer_tree, digest) DO NOTHING");
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (digest, size) in batch {
                    query = query
                        .bind(layer_tree)
                        .bind(digest.as_str())
                        .bind(i64::try_from(**size).unwrap_or(i64::MAX));
                }
                query.execute(&mut *tx).await?;
            }
        }
        for (digest, (size, n)) in ledger::layer_holders(&mut tx, layer_tree, 1).await? {
            ledger::hold(&mut change, &digest, size, n);
        }
        ledger::apply(&mut tx, scope, &change, self.stored_bytes_limit(scope)).await?;
        sqlx::query(
            "INSERT INTO source_layers (environment_id, version, attempt, scope, layer_tree) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (environment_id, version) DO UPDATE \
             SET attempt = excluded.attempt, scope = excluded.scope, \
             layer_tree = excluded.layer_tree",
        )
        .bind(environment)
        .bind(i64::from(version))
        .bind(i64::from(attempt))
        .bind(scope)
        .bind(layer_tree)
        .execute(&mut *tx)
        .await?;
        if let Some(row) = &earlier {
            let earlier_tree: String = row.try_get("layer_tree")?;
            if earlier_tree != layer_tree {
                forget_unheld_tree(&mut tx, &earlier_tree).await?;
            }
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Forgets the layer recorded for `version` of `environment` by build attempt `attempt`
    /// (a build whose version was not published, or a version removed): its scope holds its
    /// blobs no more. Answers whether there was one.
    pub async fn forget_layer(
        &self,
        environment: &str,
        version: u32,
        attempt: Option<u32>,
    ) -> Result<bool, IndexError> {
        let (mut tx, _) = self.begin_change(environment).await?;
        let row = sqlx::query(
            "SELECT attempt, layer_tree, scope FROM source_layers \
             WHERE environment_id = $1 AND version = $2",
        )
        .bind(environment)
        .bind(i64::from(version))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(false) };
        let recorded_attempt: i64 = row.try_get("attempt")?;
        if attempt.is_some_and(|attempt| i64::from(attempt) != recorded_attempt) {
            return Ok(false);
        }
        let tree: String = row.try_get("layer_tree")?;
        let scope: String = row.try_get("scope")?;
        let released = ledger::layer_holders(&mut tx, &tree, -1).await?;
        ledger::apply(&mut tx, &scope, &released, None).await?;
        sqlx::query("DELETE FROM source_layers WHERE environment_id = $1 AND version = $2")
            .bind(environment)
            .bind(i64::from(version))
            .execute(&mut *tx)
            .await?;
        forget_unheld_tree(&mut tx, &tree).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// A layer a builder recorded (see [`Index::record_layer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedLayer {
    /// The environment.
    pub environment: String,
    /// Its version.
    pub version: u32,
    /// The attempt that recorded it.
    pub attempt: u32,
    /// The layer's tree.
    pub layer_tree: String,
}

impl Index {
    /// Every layer recorded now: garbage collection forgets those whose version the catalog
    /// no longer keeps.
    pub async fn recorded_layers(&self) -> Result<Vec<RecordedLayer>, IndexError> {
        let rows = sqlx::query(
            "SELECT environment_id, version, attempt, layer_tree FROM source_layers \
             ORDER BY environment_id, version",
        )
        .fetch_all(&self.db.reader)
        .await?;
        let mut layers = Vec::with_capacity(rows.len());
        for row in &rows {
            let version: i64 = row.try_get("version")?;
            let attempt: i64 = row.try_get("attempt")?;
            layers.push(RecordedLayer {
                environment: row.try_get("environment_id")?,
                version: u32::try_from(version).unwrap_or(u32::MAX),
                attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
                layer_tree: row.try_get("layer_tree")?,
            });
        }
        Ok(layers)
    }
}

/// Drops a layer tree's blob list once no recorded layer names it.
async fn forget_unheld_tree(
    tx: &mut Transaction<'static, Any>,
    layer_tree: &str,
) -> Result<(), IndexError> {
    sqlx::query(
        "DELETE FROM layer_blobs WHERE layer_tree = $1 \
         AND NOT EXISTS (SELECT 1 FROM source_layers WHERE layer_tree = $1)",
    )
    .bind(layer_tree)
    .execute(&mut **tx)
    .await?;
    Ok(())
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
            && entry.kind != Kind::Directory
        {
            let path = path.to_string();
            return Err(if entry.kind == Kind::Symlink {
                IndexError::Link {
                    path,
                    reason: format!(
                        "{ancestor} is a symlink, not a directory ({})",
                        crate::links::NOT_SERVED
                    ),
                }
            } else {
                IndexError::Conflict {
                    path,
                    reason: format!("{ancestor} is a file, not a directory"),
                }
            });
        }
    }
    Ok(())
}

/// The byte range holding a directory's subtree: `[dir/, dir0)` (`0` follows `/`).
fn subtree_range(path: &SourcePath) -> (String, String) {
    (format!("{path}/"), format!("{path}0"))
}

/// An entry to insert, borrowing its path.
struct NewRow<'a> {
    path: &'a str,
    kind: Kind,
    digest: Option<Digest>,
    size: u64,
    executable: bool,
    target: &'a str,
}

impl<'a> NewRow<'a> {
    fn directory(path: &'a str) -> Self {
        NewRow {
            path,
            kind: Kind::Directory,
            digest: None,
            size: 0,
            executable: false,
            target: "",
        }
    }
}

impl<'a> From<&'a IndexEntry> for NewRow<'a> {
    fn from(entry: &'a IndexEntry) -> Self {
        NewRow {
            path: entry.path.as_str(),
            kind: entry.kind,
            digest: entry.digest,
            size: entry.size,
            executable: entry.executable,
            target: entry.target.as_deref().unwrap_or(""),
        }
    }
}

async fn upsert(
    tx: &mut Transaction<'static, Any>,
    environment: &str,
    rows: &[NewRow<'_>],
) -> Result<(), IndexError> {
    for batch in rows.chunks(INSERT_BATCH) {
        let mut sql = String::from(
            "INSERT INTO source_entries (environment_id, path, kind, digest, size, executable, target) VALUES ",
        );
        for i in 0..batch.len() {
            let base = i * 7;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!(
                "(${}, ${}, ${}, ${}, ${}, ${}, ${})",
                base + 1,
                base + 2,
                base + 3,
                base + 4,
                base + 5,
                base + 6,
                base + 7
            ));
        }
        sql.push_str(
            " ON CONFLICT (environment_id, path) DO UPDATE SET kind = excluded.kind, \
             digest = excluded.digest, size = excluded.size, executable = excluded.executable, \
             target = excluded.target",
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for row in batch {
            query = query
                .bind(environment)
                .bind(row.path)
                .bind(row.kind.as_str())
                .bind(
                    row.digest
                        .map(|digest| digest.to_string())
                        .unwrap_or_default(),
                )
                .bind(i64::try_from(row.size).unwrap_or(i64::MAX))
                .bind(i64::from(row.executable))
                .bind(row.target);
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
    let target: String = row.try_get("target")?;
    let path = SourcePath::parse(&path).map_err(|error| IndexError::Corrupt(error.to_string()))?;
    let kind =
        Kind::parse(&kind).ok_or_else(|| IndexError::Corrupt(format!("{path}: kind {kind:?}")))?;
    let digest = match kind {
        Kind::File => Some(
            digest
                .parse()
                .map_err(|_| IndexError::Corrupt(format!("{path}: digest {digest:?}")))?,
        ),
        Kind::Directory | Kind::Symlink => None,
    };
    let target = (kind == Kind::Symlink).then_some(target);
    let size =
        u64::try_from(size).map_err(|_| IndexError::Corrupt(format!("{path}: size {size}")))?;
    Ok(IndexEntry {
        path,
        kind,
        digest,
        size,
        executable: executable != 0,
        target,
    })
}
