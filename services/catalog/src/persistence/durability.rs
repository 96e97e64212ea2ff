//! How a ledger write (`super::ledger`: a claim, an answer, a read's record) reaches the
//! disk, and when its caller may rely on it.
//!
//! On SQLite every other write of the catalog commits with `synchronous = FULL`: the commit
//! syncs the write-ahead log while it holds the one writer. A ledger write is one of three:
//!
//! - [`Durable::BeforeAnswer`]: committed the same way, on disk before its caller is
//!   answered. Everything with an effect is claimed so (a Brain operation's claim, a Novo
//!   call's key, the admission of a signed call with no key): nothing runs before its claim
//!   would survive a loss of power, so nothing runs twice.
//! - [`Durable::SyncedByClaim`]: committed with `synchronous = NORMAL` and synced by the
//!   claim its caller makes next (a keyed Novo call's admission): the log is synced in
//!   order, so that claim's sync covers it, and until then nothing ran.
//! - [`Durable::Committed`]: committed with `synchronous = NORMAL` (its frames are written to
//!   the log: visible to every reader at once, and kept across a restart or a kill of any
//!   process, the catalog's included), then synced outside the writer, the sync starting as
//!   its caller is answered; one sync covers every commit before it, so concurrent callers
//!   share syncs, and any later synced commit covers it too. Only a loss of power (or of
//!   the kernel) in that fraction of a millisecond can take it; what that costs is said
//!   where each write chooses it, and is never a second run.
//!
//!
//! A claim made by [`Store::synced_script`] is `BeforeAnswer` too, but with other claims
//! waiting for the writer it commits relaxed and waits for a sync outside the writer, which
//! those callers share (group commit). On PostgreSQL every ledger write commits as any other
//! (its own commit shares one WAL flush among concurrent commits).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use plinth_kit::database::Backend;
use sqlx::any::AnyRow;
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, Executor, Row};

use super::ledger::{Value, bind};
use super::{Store, StoreError};

/// When a ledger write must be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Durable {
    /// Before its caller is answered: a claim of something with an effect.
    BeforeAnswer,
    /// Committed before its caller is answered, synced just after (see the module's notes):
    /// an answer stored for redeliveries once its claim, synced, stands, or a read's record.
    Committed,
    /// Committed before its caller is answered, and synced by the synced claim its caller
    /// makes next, before anything runs (a keyed Novo call's admission): the log is synced
    /// in order, so that claim's sync covers it, and losing it before then loses nothing.
    SyncedByClaim,
}

/// Which commits are synced (SQLite). Each relaxed commit takes a ticket; a sync covers
/// every ticket taken before it started. One sync runs at a time, for everyone waiting.
#[derive(Debug)]
pub(super) struct Flusher {
    /// Tickets taken: relaxed commits made.
    committed: AtomicU64,
    /// Held by the one sync in flight.
    turn: tokio::sync::Mutex<()>,
    /// The highest ticket known synced.
    synced: tokio::sync::watch::Sender<u64>,
    /// Synced scripts waiting for the writer.
    queued: AtomicUsize,
    /// The write-ahead log's path (`None`: an in-memory database, nothing to sync).
    wal: tokio::sync::OnceCell<Option<PathBuf>>,
}

impl Default for Flusher {
    fn default() -> Self {
        Flusher {
            committed: AtomicU64::new(0),
            turn: tokio::sync::Mutex::new(()),
            synced: tokio::sync::watch::Sender::new(0),
            queued: AtomicUsize::new(0),
            wal: tokio::sync::OnceCell::new(),
        }
    }
}

/// One ledger write in progress: a transaction on the writer, committed by
/// [`LedgerWrite::commit`]. Dropped before that (an error, or its caller gone), its
/// connection is closed rather than given back, which rolls the transaction back and takes
/// the relaxed `synchronous` with it.
pub(super) struct LedgerWrite {
    connection: PoolConnection<Any>,
    backend: Backend,
    durable: Durable,
    flusher: Arc<Flusher>,
    wal: Option<PathBuf>,
    done: bool,
}

impl Drop for LedgerWrite {
    fn drop(&mut self) {
        if !self.done {
            self.connection.close_on_drop();
        }
    }
}

impl std::ops::Deref for LedgerWrite {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        &self.connection
    }
}

impl std::ops::DerefMut for LedgerWrite {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        &mut self.connection
    }
}

impl Store {
    /// Begins a ledger write made durable as `durable` says (see the module's notes).
    pub(super) async fn begin_ledger_write(
        &self,
        durable: Durable,
    ) -> Result<LedgerWrite, StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        // Found before the transaction, so nothing after its commit can fail but the sync.
        let wal = match self.db.backend {
            Backend::Sqlite => self.flusher.wal_path(&mut connection).await?,
            Backend::Postgres => None,
        };
        let mut write = LedgerWrite {
            connection,
            backend: self.db.backend,
            durable,
            flusher: self.flusher.clone(),
            wal,
            done: false,
        };
        match write.backend {
            Backend::Sqlite => {
                // Changed only outside a transaction; put back by `commit`, or the
                // connection is closed. A write that must be on disk before its answer
                // commits as every other write does: one caller alone waits less for the
                // writer's own sync than for a commit, a thread hop and a sync of the log.
                // One trip to the database's thread for both (each costs as much as a
                // statement's work here).
                write
                    .connection
                    .execute(if durable == Durable::BeforeAnswer {
                        "BEGIN IMMEDIATE"
                    } else {
                        "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE"
                    })
                    .await?;
            }
            Backend::Postgres => {
                write.connection.execute("BEGIN").await?;
            }
        }
        Ok(write)
    }
}

impl Store {
    /// SQLite only: [`Store::begin_ledger_write`] and `sql` (statements numbered as one list
    /// of `values`) in one trip to the database's thread, answering every row they return in
    /// order. Each trip costs about as much as the statements' own work here (a write of a
    /// Brain receipt was five trips, ~0.5 ms, where its SQL takes ~0.05 ms).
    pub(super) async fn begin_ledger_script(
        &self,
        durable: Durable,
        sql: &str,
        values: &[Value<'_>],
    ) -> Result<(LedgerWrite, Vec<AnyRow>), StoreError> {
        let mut connection = self.db.writer.acquire().await?;
        let wal = self.flusher.wal_path(&mut connection).await?;
        let mut write = LedgerWrite {
            connection,
            backend: self.db.backend,
            durable,
            flusher: self.flusher.clone(),
            wal,
            done: false,
        };
        let begin = if durable == Durable::BeforeAnswer {
            "BEGIN IMMEDIATE;"
        } else {
            "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE;"
        };
        let script = format!("{begin} {sql}");
        let rows = bind(sqlx::query(sqlx::AssertSqlSafe(script)), values)
            .fetch_all(&mut *write.connection)
            .await?;
        Ok((write, rows))
    }
}

impl LedgerWrite {
    /// Commits; answers once the write is as durable as it was begun for.
    pub(super) async fn commit(self) -> Result<(), StoreError> {
        self.commit_script("", &[]).await
    }

    /// SQLite (or an empty `sql`): runs `sql` and commits, in one trip, then as
    /// [`LedgerWrite::commit`].
    pub(super) async fn commit_script(
        mut self,
        sql: &str,
        values: &[Value<'_>],
    ) -> Result<(), StoreError> {
        if self.backend == Backend::Postgres || self.durable == Durable::BeforeAnswer {
            // Synced by its own commit.
            let script = format!("{sql} COMMIT");
            bind(sqlx::query(sqlx::AssertSqlSafe(script)), values)
                .execute(&mut *self.connection)
                .await?;
            self.done = true;
            return Ok(());
        }
        // The writer is set back to `synchronous = FULL` in the same trip; if the commit
        // fails, that is not run and the connection, left relaxed, is closed on drop.
        let script = format!("{sql} COMMIT; PRAGMA synchronous = FULL");
        bind(sqlx::query(sqlx::AssertSqlSafe(script)), values)
            .execute(&mut *self.connection)
            .await?;
        self.done = true;
        if self.durable == Durable::SyncedByClaim {
            return Ok(());
        }
        let ticket = self.flusher.committed.fetch_add(1, Ordering::SeqCst) + 1;
        let flusher = self.flusher.clone();
        let wal = self.wal.take();
        drop(self);
        let Some(wal) = wal else {
            return Ok(());
        };
        // Its sync starts now; the caller is answered without waiting for it.
        plinth_kit::tasks::spawn(async move {
            if let Err(error) = flusher.sync(ticket, &wal).await {
                tracing::error!(%error, "the catalog's write-ahead log could not be synced; the next synced write makes the writes before it durable");
            }
        });
        Ok(())
    }
}

impl Store {
    /// SQLite only: `sql`'s statements, each its own transaction, in one trip to the
    /// database's thread, on disk before this answers: a claim made this way is synced
    /// before its caller runs anything. With other callers queued for the writer, it is
    /// committed without holding the writer through a sync and synced outside it, one sync
    /// for every caller waiting, where synced commits queued one after another behind the
    /// writer.
    pub(super) async fn synced_script(
        &self,
        sql: &str,
        values: &[Value<'_>],
    ) -> Result<Vec<AnyRow>, StoreError> {
        let waiting = Queued::join(&self.flusher.queued);
        let acquired = self.db.writer.acquire().await;
        // Whether other synced scripts wait for the writer behind this one.
        let behind = waiting.leave() > 0;
        let mut connection = acquired?;
        if !behind {
            // Alone, the writer's own sync is the cheaper way (no thread hop, no second
            // open of the log): committed with `synchronous = FULL` as every other write.
            return Ok(bind(sqlx::query(sqlx::AssertSqlSafe(sql)), values)
                .fetch_all(&mut *connection)
                .await?);
        }
        let wal = self.flusher.wal_path(&mut connection).await?;
        let script = format!("PRAGMA synchronous = NORMAL; {sql}; PRAGMA synchronous = FULL");
        let ran = bind(sqlx::query(sqlx::AssertSqlSafe(script)), values)
            .fetch_all(&mut *connection)
            .await;
        let rows = match ran {
            Ok(rows) => rows,
            Err(error) => {
                // Which statement failed is not known: the writer may be left relaxed, so it
                // is closed rather than given back.
                connection.close_on_drop();
                return Err(error.into());
            }
        };
        drop(connection);
        let ticket = self.flusher.committed.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(wal) = wal {
            self.flusher.sync(ticket, &wal).await?;
        }
        Ok(rows)
    }
}

/// One caller counted in [`Flusher`]'s `queued` until it has the writer, or until its future
/// is dropped while it waits (a cancelled call must not count as waiting ever after).
struct Queued<'a> {
    queued: &'a AtomicUsize,
    left: bool,
}

impl<'a> Queued<'a> {
    fn join(queued: &'a AtomicUsize) -> Self {
        queued.fetch_add(1, Ordering::SeqCst);
        Queued {
            queued,
            left: false,
        }
    }

    /// Stops counting this caller; answers how many others are still waiting.
    fn leave(mut self) -> usize {
        self.left = true;
        self.queued.fetch_sub(1, Ordering::SeqCst).saturating_sub(1)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.left {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl LedgerWrite {
    /// Rolls back, giving the writer back as every other write finds it.
    pub(super) async fn rollback(mut self) -> Result<(), StoreError> {
        let script = match (self.backend, self.durable) {
            (Backend::Sqlite, Durable::Committed | Durable::SyncedByClaim) => {
                "ROLLBACK; PRAGMA synchronous = FULL"
            }
            _ => "ROLLBACK",
        };
        self.connection.execute(script).await?;
        self.done = true;
        Ok(())
    }
}

impl Flusher {
    /// The write-ahead log of the database `connection` is on, found once.
    async fn wal_path(
        &self,
        connection: &mut AnyConnection,
    ) -> Result<Option<PathBuf>, StoreError> {
        let path = self
            .wal
            .get_or_try_init(|| async {
                let rows = connection.fetch_all("PRAGMA database_list").await?;
                let file = rows
                    .iter()
                    .find(|row| row.try_get::<String, _>("name").is_ok_and(|n| n == "main"))
                    .and_then(|row| row.try_get::<String, _>("file").ok())
                    .filter(|file| !file.is_empty());
                Ok::<_, StoreError>(file.map(|file| PathBuf::from(format!("{file}-wal"))))
            })
            .await?;
        Ok(path.clone())
    }

    /// Returns once `ticket`'s commit is synced: at once if a sync covered it, else after
    /// one sync at a time (group commit): a caller waits for the sync in flight, and if that
    /// did not cover it, the first to get the turn syncs every commit made by then, for
    /// every caller waiting.
    async fn sync(&self, ticket: u64, wal: &std::path::Path) -> Result<(), StoreError> {
        if *self.synced.borrow() >= ticket {
            return Ok(());
        }
        let _turn = self.turn.lock().await;
        if *self.synced.borrow() >= ticket {
            return Ok(());
        }
        let covers = self.committed.load(Ordering::SeqCst);
        let wal = wal.to_owned();
        let done = tokio::task::spawn_blocking(move || {
            match std::fs::OpenOptions::new().write(true).open(&wal) {
                Ok(file) => file.sync_data(),
                // No log: it was checkpointed into the database (synced) and removed.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(error) => Err(error),
            }
        })
        .await
        .map_err(|error| sqlx::Error::Io(std::io::Error::other(error)))?;
        done.map_err(sqlx::Error::Io)?;
        self.synced.send_if_modified(|synced| {
            let moved = covers > *synced;
            *synced = (*synced).max(covers);
            moved
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("catalog.db").display());
        let key = crate::SealKey::from_bytes(&[9; 32]).expect("key");
        let store = Store::connect(&url, 2, key).await.expect("connect");
        store.migrate().await.expect("migrate");
        (dir, store)
    }

    async fn synchronous(connection: &mut AnyConnection) -> i64 {
        connection
            .fetch_one("PRAGMA synchronous")
            .await
            .expect("pragma")
            .try_get::<i64, _>(0)
            .expect("a number")
    }

    /// A relaxed write commits with `synchronous = NORMAL` (1) and leaves the one writer as
    /// every other write finds it, `FULL` (2), whether it committed or was dropped midway;
    /// what it committed is seen by another connection at once, and is synced soon after.
    #[tokio::test]
    async fn a_relaxed_write_gives_the_writer_back_synchronous_full() {
        let (_dir, store) = store().await;
        let mut write = store
            .begin_ledger_write(Durable::Committed)
            .await
            .expect("begin");
        assert_eq!(synchronous(&mut write).await, 1);
        write
            .execute("CREATE TABLE relaxed (n INTEGER)")
            .await
            .expect("create");
        write
            .execute("INSERT INTO relaxed (n) VALUES (7)")
            .await
            .expect("insert");
        write.commit().await.expect("commit");
        let mut writer = store.db.writer.acquire().await.expect("writer");
        assert_eq!(synchronous(&mut writer).await, 2);
        drop(writer);
        let seen = store
            .db
            .reader
            .acquire()
            .await
            .expect("reader")
            .fetch_one("SELECT n FROM relaxed")
            .await
            .expect("select")
            .try_get::<i64, _>(0)
            .expect("n");
        assert_eq!(seen, 7);
        let mut synced = store.flusher.synced.subscribe();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            synced.wait_for(|synced| *synced >= 1),
        )
        .await
        .expect("synced within seconds")
        .expect("the flusher lives");

        // Dropped before its commit: rolled back, and the relaxed connection is not reused.
        let mut write = store
            .begin_ledger_write(Durable::Committed)
            .await
            .expect("begin");
        write
            .execute("INSERT INTO relaxed (n) VALUES (8)")
            .await
            .expect("insert");
        drop(write);
        let mut writer = store.db.writer.acquire().await.expect("writer");
        assert_eq!(synchronous(&mut writer).await, 2);
        let count = writer
            .fetch_one("SELECT COUNT(*) FROM relaxed")
            .await
            .expect("count")
            .try_get::<i64, _>(0)
            .expect("count");
        assert_eq!(count, 1);
    }

    /// A write its caller's next, synced, claim covers is relaxed too, and gives the writer
    /// back as it found it; no sync of its own is started.
    #[tokio::test]
    async fn a_write_synced_by_the_next_claim_is_relaxed_and_starts_no_sync() {
        let (_dir, store) = store().await;
        let mut write = store
            .begin_ledger_write(Durable::SyncedByClaim)
            .await
            .expect("begin");
        assert_eq!(synchronous(&mut write).await, 1);
        write.commit().await.expect("commit");
        let mut writer = store.db.writer.acquire().await.expect("writer");
        assert_eq!(synchronous(&mut writer).await, 2);
        assert_eq!(store.flusher.committed.load(Ordering::SeqCst), 0);
    }

    /// A synced script answers once its commit is synced, gives the writer back as every
    /// other write finds it, and a script that fails midway does not leave it relaxed.
    #[tokio::test]
    async fn a_synced_script_is_on_disk_when_it_answers_and_never_leaves_the_writer_relaxed() {
        let (_dir, store) = store().await;
        let mut writer = store.db.writer.acquire().await.expect("writer");
        writer
            .execute("CREATE TABLE claims (n INTEGER PRIMARY KEY)")
            .await
            .expect("create");
        drop(writer);
        let rows = store
            .synced_script(
                "INSERT INTO claims (n) VALUES ($1); SELECT changes() AS claimed",
                &[Value::Int(1)],
            )
            .await
            .expect("claim");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].try_get::<i64, _>("claimed").expect("claimed"), 1);
        // Alone: the writer's own synchronous commit, no ticket.
        assert_eq!(store.flusher.committed.load(Ordering::SeqCst), 0);

        // Behind another (as if one were queued): relaxed, then synced before it answers.
        store.flusher.queued.fetch_add(1, Ordering::SeqCst);
        let rows = store
            .synced_script(
                "INSERT INTO claims (n) VALUES ($1); SELECT changes() AS claimed",
                &[Value::Int(3)],
            )
            .await
            .expect("claim");
        store.flusher.queued.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(rows[0].try_get::<i64, _>("claimed").expect("claimed"), 1);
        let ticket = store.flusher.committed.load(Ordering::SeqCst);
        assert_eq!(ticket, 1);
        assert!(
            *store.flusher.synced.borrow() >= ticket,
            "synced before it answered"
        );
        let mut writer = store.db.writer.acquire().await.expect("writer");
        assert_eq!(synchronous(&mut writer).await, 2);
        drop(writer);

        // The second statement fails (the row is there): the connection is not given back.
        store.flusher.queued.fetch_add(1, Ordering::SeqCst);
        let failed = store
            .synced_script(
                "INSERT INTO claims (n) VALUES ($1); INSERT INTO claims (n) VALUES ($1)",
                &[Value::Int(2)],
            )
            .await;
        assert!(failed.is_err());
        let mut writer = store.db.writer.acquire().await.expect("writer");
        assert_eq!(synchronous(&mut writer).await, 2);
    }

    /// A caller dropped while it waits for the writer stops counting as waiting.
    #[tokio::test]
    async fn a_cancelled_wait_for_the_writer_is_not_counted_ever_after() {
        let (_dir, store) = store().await;
        let held = store.db.writer.acquire().await.expect("writer");
        let waiting = store.synced_script("SELECT 1", &[]);
        let cut = tokio::time::timeout(std::time::Duration::from_millis(50), waiting).await;
        assert!(cut.is_err(), "it waited for the writer");
        drop(held);
        assert_eq!(store.flusher.queued.load(Ordering::SeqCst), 0);
        let left = Queued::join(&store.flusher.queued);
        let other = Queued::join(&store.flusher.queued);
        assert_eq!(left.leave(), 1);
        drop(other);
        assert_eq!(store.flusher.queued.load(Ordering::SeqCst), 0);
    }

    /// A write that must be on disk before its answer is never relaxed.
    #[tokio::test]
    async fn a_write_synced_before_its_answer_commits_synchronous_full() {
        let (_dir, store) = store().await;
        let mut write = store
            .begin_ledger_write(Durable::BeforeAnswer)
            .await
            .expect("begin");
        assert_eq!(synchronous(&mut write).await, 2);
        write.commit().await.expect("commit");
    }
}
