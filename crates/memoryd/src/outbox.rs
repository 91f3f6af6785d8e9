//! memoryd's outbox, `<home>/memory/outbox/`: every turn loopd hands over is durable here before
//! it is answered `turn_filed`, and stays until a store has filed it.
//!
//! One file per turn, `<session>.<turn>.json`, written durably (`bxcore::durable`: temp file,
//! fsync, rename, fsync the directory), so a crash leaves a whole record or none, and a turn handed over twice
//! (loopd resends after a crash between `turn_filed` and its own delete) is one file, not two.
//! A stale temp file is an unacknowledged write: removed at start. A record that does not parse
//! is set aside as `*.damaged` and logged, never filed by a guess and never lost.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use bxcore::runbook::Anchored;
use bxcore::{ErrorCode, SessionId, Timestamp, TurnRecord};
use serde::{Deserialize, Serialize};

/// The runbook entry of a record that could not be written.
pub const UNWRITABLE_ANCHOR: &str = "memoryd-outbox-unwritable";
/// The runbook entry of a record that cannot be read back.
pub const DAMAGED_ANCHOR: &str = "memoryd-outbox-damaged";
/// The runbook entry of an outbox at its bound.
pub const FULL_ANCHOR: &str = "memoryd-outbox-full";

/// One record on disk: the turn and when memoryd took it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Held {
    pub received: Timestamp,
    pub record: TurnRecord,
}

/// A record waiting, with its file.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub path: PathBuf,
    pub held: Held,
}

/// Why a record was not taken.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error("cannot write turn {turn} of {session} to the outbox {}: {error}", dir.display())]
    Write {
        dir: PathBuf,
        session: SessionId,
        turn: u64,
        error: io::Error,
    },
    #[error("the outbox {} holds {held} turns not yet filed, its limit ([limits] max_outbox)", dir.display())]
    Full { dir: PathBuf, held: usize },
}

impl Anchored for PutError {
    fn anchor(&self) -> &str {
        match self {
            PutError::Write { .. } => UNWRITABLE_ANCHOR,
            PutError::Full { .. } => FULL_ANCHOR,
        }
    }
    fn code(&self) -> ErrorCode {
        match self {
            PutError::Write { .. } => ErrorCode::Internal,
            PutError::Full { .. } => ErrorCode::Unavailable,
        }
    }
}

/// The outbox directory.
#[derive(Debug)]
pub struct Outbox {
    dir: PathBuf,
    max: usize,
    /// Held while a record is written or removed, so a count and a write do not race.
    lock: Mutex<()>,
    /// Wakes the filer when a record is added.
    added: Condvar,
    fresh: Mutex<bool>,
}

/// `<session>.<turn>.json`; a session id never holds a dot, so the name splits one way.
fn file_name(session: &SessionId, turn: u64) -> String {
    format!("{}.{turn:020}.json", session.as_str())
}

fn is_record(name: &str) -> bool {
    !name.starts_with('.') && name.ends_with(".json")
}

impl Outbox {
    /// Open the outbox in `dir` (which exists), holding at most `max` records. Stale temp files
    /// from a crash are removed: their record was never acknowledged.
    pub fn open(dir: &Path, max: usize) -> io::Result<Outbox> {
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                fs::remove_file(dir.join(name.as_ref()))?;
            }
        }
        Ok(Outbox {
            dir: dir.to_path_buf(),
            max,
            lock: Mutex::new(()),
            added: Condvar::new(),
            fresh: Mutex::new(false),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many records wait.
    pub fn depth(&self) -> io::Result<usize> {
        let mut n = 0;
        for entry in fs::read_dir(&self.dir)? {
            if is_record(&entry?.file_name().to_string_lossy()) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Make `record` durable (once: a record already waiting is left as it is).
    pub fn put(&self, record: &TurnRecord) -> Result<(), PutError> {
        let werr = |error: io::Error| PutError::Write {
            dir: self.dir.clone(),
            session: record.session.clone(),
            turn: record.turn,
            error,
        };
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let name = file_name(&record.session, record.turn);
        let path = self.dir.join(&name);
        if !path.exists() {
            let held = self.depth().map_err(werr)?;
            if held >= self.max {
                return Err(PutError::Full {
                    dir: self.dir.clone(),
                    held,
                });
            }
            let body = serde_json::to_vec(&Held {
                received: Timestamp::now(),
                record: record.clone(),
            })
            .map_err(|e| werr(io::Error::other(e)))?;
            bxcore::durable::replace(&path, &body).map_err(|e| werr(e.into()))?;
        }
        drop(_g);
        *self.fresh.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.added.notify_all();
        Ok(())
    }

    /// The waiting records, oldest first. A file that does not parse is renamed `*.damaged`
    /// (kept for the owner, never filed) and logged.
    pub fn pending(&self) -> io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if !is_record(&name) {
                continue;
            }
            let path = self.dir.join(name.as_ref());
            let parsed = fs::read(&path).and_then(|b| {
                serde_json::from_slice::<Held>(&b)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            });
            match parsed {
                Ok(held) if file_name(&held.record.session, held.record.turn) == name => {
                    out.push(Entry { path, held })
                }
                Ok(_) => self.set_aside(&path, "its turn is not the one its name says")?,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    self.set_aside(&path, &format!("it does not parse ({e})"))?
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| {
            a.held
                .received
                .cmp(&b.held.received)
                .then_with(|| a.path.cmp(&b.path))
        });
        Ok(out)
    }

    fn set_aside(&self, path: &Path, why: &str) -> io::Result<()> {
        let aside = path.with_extension("damaged");
        fs::rename(path, &aside)?;
        bxharden::runbook!(
            DAMAGED_ANCHOR,
            "{}: the outbox record cannot be filed: {why}; it was moved to {}",
            path.display(),
            aside.display()
        );
        Ok(())
    }

    /// Remove a record a store has filed.
    pub fn done(&self, entry: &Entry) -> io::Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        match fs::remove_file(&entry.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        File::open(&self.dir)?.sync_all()
    }

    /// Remove every waiting record of `session` (the owner forgot it); how many.
    pub fn forget(&self, session: &SessionId) -> io::Result<u64> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let prefix = format!("{}.", session.as_str());
        let mut n = 0;
        for entry in fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if is_record(&name) && name.starts_with(&prefix) {
                fs::remove_file(self.dir.join(name.as_ref()))?;
                n += 1;
            }
        }
        if n > 0 {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(n)
    }

    /// Wait until a record is added or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        let fresh = self.fresh.lock().unwrap_or_else(|p| p.into_inner());
        let (mut fresh, _) = self
            .added
            .wait_timeout_while(fresh, timeout, |f| !*f)
            .unwrap_or_else(|p| p.into_inner());
        *fresh = false;
    }
}
