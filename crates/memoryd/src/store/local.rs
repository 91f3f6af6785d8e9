//! The embedded store: SQLite with FTS5, one file, `<home>/memory/local/memory.sqlite3`.
//!
//! Why SQLite (through `rusqlite`, compiled in with its `bundled` build): it is crash-safe by
//! its journal (a commit that returned is on disk, `synchronous = FULL`; a torn commit rolls
//! back when the file is next opened), searchable by FTS5 with a ranking (`bm25`) recall needs,
//! and one file the owner can back up or inspect with the `sqlite3` tool. Bundled, the device
//! needs no system library and every box runs the same SQLite. Its cost is about a megabyte of
//! code and what its page cache holds: the cache is capped at 256 KiB here and temporary tables
//! stay in memory (no temp files outside memoryd's directory, which Landlock would refuse), so
//! memoryd stays within the 5 MB idle target (`docs/performance.md` has the measurement).
//!
//! Every route is one column of one table when no remote store is configured; with one, only
//! `local` turns and secret sessions' turns are filed here. `forget` deletes with
//! `secure_delete` on (and FTS5's own `secure-delete`, so the index drops the words too), so a
//! forgotten turn's text is overwritten in the file, not just unlinked.
//!
//! The store is bounded three ways ([`Bounds`]): its pages in use (a turn past that waits in the
//! outbox, `memory-store-full`), each session's text (a turn past it is let go and what the
//! session holds is kept, `memory-session-full`: one session cannot fill the store alone, and no
//! turn, whoever sends it, can push the owner's older ones out), and, when the owner sets it,
//! the age of a turn (older turns are pruned as `forget` deletes, `memory-pruned`).

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bxcore::{DataClass, Memory, MemoryRoute, SessionId, Timestamp};
use rusqlite::{Connection, OptionalExtension, params};

use super::{Filing, Forgotten, Store, StoreError, turn_text, words};

/// The database's file name in the local store's directory.
pub const FILE: &str = "memory.sqlite3";
/// The schema this build writes (`PRAGMA user_version`): 2 adds each session's byte count.
pub const SCHEMA_VERSION: i64 = 2;
/// The most words of a query searched for.
pub const MAX_QUERY_WORDS: usize = 32;
/// The most turns one recall considers before cutting to its token budget.
pub const RECALL_TURNS: usize = 8;

const NAME: &str = "local";

/// A day, in milliseconds.
pub const DAY_MS: u64 = 24 * 60 * 60 * 1000;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    turn INTEGER NOT NULL,
    route TEXT NOT NULL CHECK (route IN ('main', 'quarantine', 'local')),
    class TEXT NOT NULL CHECK (class IN ('public', 'private', 'secret')),
    untrusted INTEGER NOT NULL CHECK (untrusted IN (0, 1)),
    filed INTEGER NOT NULL,
    text TEXT NOT NULL,
    UNIQUE (session, turn)
) STRICT;
CREATE INDEX IF NOT EXISTS turns_by_route ON turns (route, filed);
CREATE INDEX IF NOT EXISTS turns_by_filed ON turns (filed);
CREATE VIRTUAL TABLE IF NOT EXISTS turns_fts USING fts5(
    text, content = 'turns', content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2'
);
INSERT INTO turns_fts (turns_fts, rank) VALUES ('secure-delete', 1);
CREATE TRIGGER IF NOT EXISTS turns_added AFTER INSERT ON turns BEGIN
    INSERT INTO turns_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS turns_deleted AFTER DELETE ON turns BEGIN
    INSERT INTO turns_fts (turns_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TABLE IF NOT EXISTS session_bytes (
    session TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS session_bytes_added AFTER INSERT ON turns BEGIN
    INSERT INTO session_bytes (session, bytes) VALUES (new.session, length(CAST(new.text AS BLOB)))
    ON CONFLICT (session) DO UPDATE SET bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER IF NOT EXISTS session_bytes_deleted AFTER DELETE ON turns BEGIN
    UPDATE session_bytes SET bytes = bytes - length(CAST(old.text AS BLOB))
    WHERE session = old.session;
    DELETE FROM session_bytes WHERE session = old.session AND bytes <= 0;
END;
";

/// Version 1 had no byte counts: they are counted once, from the turns, when it is opened.
const COUNT_SESSIONS: &str = "
DELETE FROM session_bytes;
INSERT INTO session_bytes (session, bytes)
    SELECT session, SUM(length(CAST(text AS BLOB))) FROM turns GROUP BY session;
";

const COLUMNS: &str = "t.session, t.turn, t.route, t.class, t.untrusted, t.filed, t.text";

/// The runbook entry of turns pruned by a bound.
pub const PRUNED_ANCHOR: &str = "memory-pruned";

/// What the embedded store may hold (`[limits]` of memoryd.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `max_store_bytes`: the file's pages in use.
    pub max_bytes: u64,
    /// `max_session_bytes`: the text one session's turns hold.
    pub max_session_bytes: u64,
    /// `keep_days`, as milliseconds: a turn filed longer ago is pruned; `None` keeps every turn.
    pub keep_ms: Option<u64>,
}

/// The embedded store.
#[derive(Debug)]
pub struct LocalStore {
    path: PathBuf,
    db: Mutex<Connection>,
    bounds: Bounds,
    /// The sessions whose bound was logged.
    told: Mutex<std::collections::HashSet<SessionId>>,
}

/// The runbook entry of a session at its bound.
pub const SESSION_FULL_ANCHOR: &str = "memory-session-full";

/// How many sessions at their bound are remembered as told, so a flood of them is one line
/// each, not one per turn.
const SESSIONS_TOLD: usize = 1024;

fn failed(why: impl std::fmt::Display) -> StoreError {
    StoreError::Failed {
        store: NAME,
        why: why.to_string(),
    }
}

impl LocalStore {
    /// Open (creating it, 0600, if absent) the store in `dir`, which must exist.
    pub fn open(dir: &Path, bounds: Bounds) -> Result<LocalStore, StoreError> {
        let path = dir.join(FILE);
        let at = |e: &dyn std::fmt::Display| failed(format!("{}: {e}", path.display()));
        // Made here so it is the owner's only; SQLite gives its journal the same mode.
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| at(&e))?;
        let db = Connection::open(&path).map_err(|e| at(&e))?;
        let setup = || -> rusqlite::Result<i64> {
            db.pragma_update(None, "synchronous", "FULL")?;
            db.pragma_update(None, "cache_size", -256)?;
            db.pragma_update(None, "temp_store", "MEMORY")?;
            db.pragma_update(None, "secure_delete", "ON")?;
            db.pragma_update(None, "foreign_keys", "ON")?;
            let version: i64 = db.pragma_query_value(None, "user_version", |r| r.get(0))?;
            Ok(version)
        };
        let version = setup().map_err(|e| at(&e))?;
        if version > SCHEMA_VERSION {
            return Err(at(&format!(
                "the store's schema is version {version}, newer than this memoryd's ({SCHEMA_VERSION})"
            )));
        }
        db.execute_batch(SCHEMA).map_err(|e| at(&e))?;
        if version < SCHEMA_VERSION {
            db.execute_batch(COUNT_SESSIONS).map_err(|e| at(&e))?;
        }
        db.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|e| at(&e))?;
        // The pages the set-up read are not kept for a daemon that may idle for hours; the
        // first query reads what it needs (docs/performance.md).
        db.release_memory().map_err(|e| at(&e))?;
        let store = LocalStore {
            path,
            db: Mutex::new(db),
            bounds,
            told: Mutex::default(),
        };
        // Turns that aged past `keep_days` while memoryd was stopped go now.
        let aged = store.with(|db| store.prune_aged(db, Timestamp::now()))?;
        store.log_pruned(aged);
        Ok(store)
    }

    /// Delete the turns filed before `now - keep_days`; how many.
    fn prune_aged(&self, db: &Connection, now: Timestamp) -> rusqlite::Result<usize> {
        let Some(keep) = self.bounds.keep_ms else {
            return Ok(0);
        };
        let before = i64::try_from(now.unix_millis().saturating_sub(keep)).unwrap_or(i64::MAX);
        db.execute("DELETE FROM turns WHERE filed < ?1", [before])
    }

    /// The bytes of text `session`'s turns hold, as the triggers keep count: one row read,
    /// however large the session.
    fn session_bytes(db: &Connection, session: &str) -> rusqlite::Result<u64> {
        let held: Option<i64> = db
            .query_row(
                "SELECT bytes FROM session_bytes WHERE session = ?1",
                [session],
                |r| r.get(0),
            )
            .optional()?;
        Ok(held.and_then(|h| u64::try_from(h).ok()).unwrap_or(0))
    }

    /// Say once per session (of the last [`SESSIONS_TOLD`]) that it is at its bound.
    fn tell_session_full(&self, session: &SessionId, held: u64, adding: u64) {
        let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        if told.contains(session) {
            return;
        }
        if told.len() >= SESSIONS_TOLD {
            told.clear();
        }
        told.insert(session.clone());
        bxharden::runbook!(
            SESSION_FULL_ANCHOR,
            "session {session} holds {held} bytes of text in the embedded store, and its next \
             turn ({adding} bytes) would pass [limits] max_session_bytes = {}: its later turns \
             are not remembered, and what it holds is kept",
            self.bounds.max_session_bytes
        );
    }

    /// One line for the turns the age rule pruned, if any.
    fn log_pruned(&self, aged: usize) {
        if aged > 0 {
            bxharden::runbook!(
                PRUNED_ANCHOR,
                "pruned {aged} turns from the embedded store, filed longer ago than [limits] \
                 keep_days = {}",
                self.bounds.keep_ms.unwrap_or(0) / DAY_MS
            );
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut db).map_err(|e| failed(format!("{}: {e}", self.path.display())))
    }

    fn query(&self, sql: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<Memory>, StoreError> {
        let rows = self.with(|db| {
            let mut stmt = db.prepare_cached(sql)?;
            let rows = stmt.query_map(args, |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, String>(6)?,
                ))
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        rows.into_iter()
            .map(|(session, turn, route, class, untrusted, filed, text)| {
                let bad =
                    |what: &str| failed(format!("{}: a row with {what}", self.path.display()));
                Ok(Memory {
                    session: SessionId::new(session).map_err(|_| bad("a bad session id"))?,
                    turn: u64::try_from(turn).map_err(|_| bad("a negative turn"))?,
                    route: MemoryRoute::from_name(&route).ok_or_else(|| bad("an unknown route"))?,
                    class: match class.as_str() {
                        "public" => DataClass::Public,
                        "private" => DataClass::Private,
                        "secret" => DataClass::Secret,
                        _ => return Err(bad("an unknown class")),
                    },
                    untrusted: untrusted != 0,
                    filed: Timestamp(u64::try_from(filed).unwrap_or(0)),
                    text,
                })
            })
            .collect()
    }

    /// How many turns the store holds, by route (for the benchmark and tests).
    pub fn count(&self, route: MemoryRoute) -> Result<u64, StoreError> {
        self.with(|db| {
            db.query_row(
                "SELECT count(*) FROM turns WHERE route = ?1",
                [route.name()],
                |r| r.get::<_, i64>(0),
            )
        })
        .map(|n| u64::try_from(n).unwrap_or(0))
    }
}

/// An FTS5 query for any of `words`: each a quoted string, so no word is read as syntax.
fn match_any(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(" OR ")
}

impl Store for LocalStore {
    fn describe(&self) -> String {
        format!("the embedded store {}", self.path.display())
    }

    fn file(&self, filing: &Filing<'_>) -> Result<(), StoreError> {
        let r = filing.record;
        let text = turn_text(r);
        let turn = i64::try_from(r.turn).unwrap_or(i64::MAX);
        // The age rule first; then the session's bound, which keeps what the session holds and
        // lets the new turn go: no turn can delete an older one, whoever sends it.
        let (aged, held) = self.with(|db| {
            let aged = self.prune_aged(db, Timestamp::now())?;
            Ok((aged, Self::session_bytes(db, r.session.as_str())?))
        })?;
        self.log_pruned(aged);
        if held.saturating_add(text.len() as u64) > self.bounds.max_session_bytes {
            self.tell_session_full(&r.session, held, text.len() as u64);
            return Ok(());
        }
        let used = self.with(|db| {
            let pages: i64 = db.pragma_query_value(None, "page_count", |r| r.get(0))?;
            let free: i64 = db.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
            let size: i64 = db.pragma_query_value(None, "page_size", |r| r.get(0))?;
            Ok(u64::try_from((pages - free).max(0) * size).unwrap_or(u64::MAX))
        })?;
        if used.saturating_add(text.len() as u64) > self.bounds.max_bytes {
            return Err(StoreError::Full {
                store: NAME,
                used,
                max: self.bounds.max_bytes,
            });
        }
        self.with(|db| {
            db.execute(
                "INSERT INTO turns (session, turn, route, class, untrusted, filed, text)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (session, turn) DO NOTHING",
                params![
                    r.session.as_str(),
                    turn,
                    filing.route.name(),
                    filing.state.class.as_str(),
                    i64::from(filing.state.untrusted),
                    i64::try_from(filing.received.unix_millis()).unwrap_or(i64::MAX),
                    text,
                ],
            )
            .map(drop)
        })
    }

    fn recall(&self, query: &str, _max_tokens: u32) -> Result<Vec<Memory>, StoreError> {
        let words = words(query, MAX_QUERY_WORDS);
        if words.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {COLUMNS} FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid
             WHERE turns_fts MATCH ?1 AND t.route = 'main'
             ORDER BY bm25(turns_fts), t.filed DESC LIMIT ?2"
        );
        self.query(&sql, &[&match_any(&words), &(RECALL_TURNS as i64)])
    }

    fn recent(&self, route: Option<MemoryRoute>, limit: usize) -> Result<Vec<Memory>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        match route {
            Some(route) => self.query(
                &format!(
                    "SELECT {COLUMNS} FROM turns t WHERE t.route = ?1
                     ORDER BY t.filed DESC, t.id DESC LIMIT ?2"
                ),
                &[&route.name(), &limit],
            ),
            None => self.query(
                &format!("SELECT {COLUMNS} FROM turns t ORDER BY t.filed DESC, t.id DESC LIMIT ?1"),
                &[&limit],
            ),
        }
    }

    fn search(&self, query: &str, limit: usize) -> Result<Vec<Memory>, StoreError> {
        let words = words(query, MAX_QUERY_WORDS);
        if words.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {COLUMNS} FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid
             WHERE turns_fts MATCH ?1 ORDER BY bm25(turns_fts), t.filed DESC LIMIT ?2"
        );
        self.query(
            &sql,
            &[
                &match_any(&words),
                &i64::try_from(limit).unwrap_or(i64::MAX),
            ],
        )
    }

    fn forget(&self, session: &SessionId) -> Result<Forgotten, StoreError> {
        let turns = self.with(|db| {
            let tx = db.transaction()?;
            let n = tx.execute("DELETE FROM turns WHERE session = ?1", [session.as_str()])?;
            tx.commit()?;
            Ok(n)
        })?;
        Ok(Forgotten {
            turns: turns as u64,
            queued: false,
        })
    }
}

/// Whether `dir` holds a store file (for `bxctl status` on a box that never filed a turn).
pub fn exists(dir: &Path) -> bool {
    dir.join(FILE).exists()
}
