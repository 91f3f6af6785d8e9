//! The memory hand-off: each finished turn goes to memoryd as a `turn_record`, through a durable
//! outbox in `<home>/loop/outbox/`.
//!
//! A turn is written to the outbox (durably, `bxcore::durable`: temp file, fsync, rename, fsync)
//! before its channel hears `turn_done`, and a background thread sends the outbox in order,
//! deleting each record only when memoryd answers `turn_filed` for it. memoryd being down, slow
//! or refusing never blocks or fails a turn, and loses nothing: records wait, retried with
//! backoff. A record is sent at least once; memoryd files idempotently, so a resend after a
//! crash between `turn_filed` and the delete never duplicates a memory.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use bxcore::client;
use bxcore::{Message, TurnRecord};
use bxharden::log::notice;

/// The runbook entry for memoryd being unreachable.
pub const MEMORY_ANCHOR: &str = "memory-unavailable";
/// The runbook entry for a finished turn that could not be written to the outbox.
pub const OUTBOX_UNWRITABLE_ANCHOR: &str = "memory-outbox-unwritable";
/// The runbook entry for an outbox record that cannot be read.
pub const DAMAGED_ANCHOR: &str = "memory-outbox-damaged";

/// The first wait after a failed send; it doubles up to `MAX_BACKOFF`.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The outbox directory and the sequence its records are numbered in.
#[derive(Debug)]
pub struct Outbox {
    dir: PathBuf,
    /// The next record's number; held while a record is written, so numbers follow turn order.
    next: Mutex<u64>,
    /// Wakes the sender when a record is added.
    added: Condvar,
    fresh: Mutex<bool>,
}

/// One waiting record.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub path: PathBuf,
    pub record: TurnRecord,
}

impl Outbox {
    /// Open (making it 0700 if absent) the outbox in `dir`. Stale temp files from a crash are
    /// removed: their record was never acknowledged to anyone.
    pub fn open(dir: &Path) -> io::Result<Outbox> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut last = 0;
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                fs::remove_file(dir.join(name.as_ref()))?;
            } else if let Some(n) = seq_of(&name) {
                last = last.max(n);
            }
        }
        Ok(Outbox {
            dir: dir.to_path_buf(),
            next: Mutex::new(last + 1),
            added: Condvar::new(),
            fresh: Mutex::new(false),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Write one record durably, after every record written before it.
    pub fn put(&self, record: &TurnRecord) -> io::Result<PathBuf> {
        let body = serde_json::to_vec(record).map_err(io::Error::other)?;
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let n = *next;
        let path = self.dir.join(format!("{n:020}.json"));
        bxcore::durable::replace(&path, &body)?;
        *next = n + 1;
        drop(next);
        *self.fresh.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.added.notify_all();
        Ok(path)
    }

    /// The waiting records, oldest first. A file that does not parse is renamed `*.damaged`
    /// (kept for the owner, never resent) and logged.
    pub fn pending(&self) -> io::Result<Vec<Entry>> {
        let mut numbered = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            if let Some(n) = seq_of(&name.to_string_lossy()) {
                numbered.push((n, self.dir.join(&name)));
            }
        }
        numbered.sort();
        let mut out = Vec::with_capacity(numbered.len());
        for (_, path) in numbered {
            let parsed = fs::read(&path).and_then(|b| {
                serde_json::from_slice::<TurnRecord>(&b)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            });
            match parsed {
                Ok(record) => out.push(Entry { path, record }),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    let aside = path.with_extension("damaged");
                    fs::rename(&path, &aside)?;
                    bxharden::runbook!(
                        DAMAGED_ANCHOR,
                        "{}: the outbox record does not parse ({e}); it was moved to {} and will not be sent",
                        path.display(),
                        aside.display()
                    );
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Remove a record memoryd has filed.
    pub fn done(&self, entry: &Entry) -> io::Result<()> {
        fs::remove_file(&entry.path)?;
        File::open(&self.dir)?.sync_all()
    }

    /// Wait until a record is added or `timeout` passes.
    fn wait(&self, timeout: Duration) {
        let fresh = self.fresh.lock().unwrap_or_else(|p| p.into_inner());
        let (mut fresh, _) = self
            .added
            .wait_timeout_while(fresh, timeout, |f| !*f)
            .unwrap_or_else(|p| p.into_inner());
        *fresh = false;
    }

    /// Send one record and wait for its `turn_filed`.
    pub fn send(socket: &Path, timeout: Duration, record: &TurnRecord) -> Result<(), String> {
        let want = (record.session.clone(), record.turn);
        match client::call(
            socket,
            timeout,
            record.turn,
            Message::TurnRecord(record.clone()),
            |_| {},
        ) {
            Ok(Message::TurnFiled(f)) if (f.session.clone(), f.turn) == want => Ok(()),
            Ok(Message::TurnFiled(f)) => Err(format!(
                "memoryd filed turn {} of {}, not turn {} of {}",
                f.turn, f.session, want.1, want.0
            )),
            Ok(other) => Err(format!("memoryd answered {}", other.kind())),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The sender: forever, send what waits, oldest first; on a failure, stop, wait with
    /// backoff and try the same record again. One line per outage, not one per attempt.
    pub fn run_sender(&self, socket: &Path, timeout: Duration) -> ! {
        let mut backoff = FIRST_BACKOFF;
        let mut down = false;
        loop {
            let failed = match self.pending() {
                Ok(entries) => self.deliver(&entries, socket, timeout),
                Err(e) => Some(format!(
                    "cannot read the outbox {}: {e}",
                    self.dir.display()
                )),
            };
            match failed {
                None => {
                    if down {
                        notice(&format!(
                            "memoryd on {} files turns again",
                            socket.display()
                        ));
                    }
                    down = false;
                    backoff = FIRST_BACKOFF;
                    self.wait(Duration::from_secs(60));
                }
                Some(why) => {
                    if !down {
                        bxharden::runbook!(
                            MEMORY_ANCHOR,
                            "memory is unavailable: {why}; finished turns wait in {} and are retried",
                            self.dir.display()
                        );
                    }
                    down = true;
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Send entries in order; the first failure stops the round (order is kept).
    fn deliver(&self, entries: &[Entry], socket: &Path, timeout: Duration) -> Option<String> {
        for e in entries {
            if let Err(why) = Outbox::send(socket, timeout, &e.record) {
                return Some(why);
            }
            if let Err(err) = self.done(e) {
                return Some(format!("cannot remove {}: {err}", e.path.display()));
            }
        }
        None
    }
}

/// `00000000000000000042.json` → 42.
fn seq_of(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    if digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().ok()
    } else {
        None
    }
}
