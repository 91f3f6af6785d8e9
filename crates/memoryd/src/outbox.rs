//! memoryd's outbox, `<home>/memory/outbox/`: every turn loopd hands over is durable here before
//! it is answered `turn_filed`, and stays until a store has filed it.
//!
//! It is the one durable queue (`bxcore::queue`): one file per turn, keyed by its session and
//! turn, so a turn handed over twice (loopd resends after a crash between `turn_filed` and its
//! own delete) is one record, not two; bounded by `[limits] max_outbox`; a record that does not
//! parse set aside as `*.damaged` and logged, never filed by a guess and never lost.

use std::fs;
use std::io;
use std::path::Path;

use bxcore::queue::{Anchors, Entry, Queue, QueueError};
use bxcore::{SessionId, Timestamp, TurnRecord};
use serde::Deserialize;

/// The runbook entry of a record that could not be written.
pub const UNWRITABLE_ANCHOR: &str = "memoryd-outbox-unwritable";
/// The runbook entry of a record that cannot be read back.
pub const DAMAGED_ANCHOR: &str = "memoryd-outbox-damaged";
/// The runbook entry of an outbox at its bound.
pub const FULL_ANCHOR: &str = "memoryd-outbox-full";

/// The outbox.
#[derive(Debug)]
pub struct Outbox {
    queue: Queue<TurnRecord>,
}

/// A record's key: its session and turn (a session id never holds a dot, so it splits one way).
fn key(session: &SessionId, turn: u64) -> String {
    format!("{session}.{turn:020}")
}

/// A record of the older layout: `<session>.<turn>.json`, the turn and when memoryd took it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Older {
    received: Timestamp,
    record: TurnRecord,
}

impl Outbox {
    /// Open the outbox in `dir`, holding at most `max` records. Stale temp files from a crash
    /// are removed: their record was never acknowledged. Records of the older layout are carried
    /// over with the time they were taken.
    pub fn open(dir: &Path, max: usize) -> io::Result<Outbox> {
        let anchors = Anchors {
            unwritable: UNWRITABLE_ANCHOR,
            damaged: DAMAGED_ANCHOR,
            full: FULL_ANCHOR,
        };
        let queue = Queue::open(dir, max, anchors, bxharden::log::with_pointer)?;
        let outbox = Outbox { queue };
        outbox.carry_over()?;
        Ok(outbox)
    }

    fn carry_over(&self) -> io::Result<()> {
        let dir = self.queue.dir().to_path_buf();
        let mut older = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let Some((session, turn)) = name
                .strip_suffix(".json")
                .and_then(|stem| stem.split_once('.'))
            else {
                continue;
            };
            // The current layout's names begin with a 20-digit number; the older one's with a
            // session id and end with a 20-digit turn.
            let current = session.len() == 20 && session.bytes().all(|b| b.is_ascii_digit());
            if current || turn.len() != 20 || !turn.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let path = dir.join(&name);
            match serde_json::from_slice::<Older>(&fs::read(&path)?) {
                Ok(o) => older.push((o.received, path, o.record)),
                Err(e) => {
                    let aside = path.with_extension("damaged");
                    fs::rename(&path, &aside)?;
                    bxharden::runbook!(
                        DAMAGED_ANCHOR,
                        "{}: the outbox record does not parse ({e}); it was moved to {}",
                        path.display(),
                        aside.display()
                    );
                }
            }
        }
        older.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        for (received, path, record) in older {
            self.queue
                .put_at(&key(&record.session, record.turn), &record, received)
                .map_err(io::Error::other)?;
            fs::remove_file(&path)?;
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        self.queue.dir()
    }

    /// How many records wait.
    pub fn depth(&self) -> usize {
        self.queue.depth()
    }

    /// Whether `entry` still waits (it was not forgotten meanwhile).
    pub fn holds(&self, entry: &Entry<TurnRecord>) -> bool {
        self.queue.holds(&entry.key)
    }

    /// Make `record` durable (once: a record already waiting is left as it is).
    pub fn put(&self, record: &TurnRecord) -> Result<(), QueueError> {
        self.queue
            .put(&key(&record.session, record.turn), record)
            .map(drop)
    }

    /// The waiting records, oldest first (a damaged one set aside and logged).
    pub fn pending(&self) -> Result<Vec<Entry<TurnRecord>>, QueueError> {
        self.queue.pending()
    }

    /// The `max` oldest waiting turns (a round of the filer).
    pub fn oldest(&self, max: usize) -> Result<Vec<Entry<TurnRecord>>, QueueError> {
        self.queue.oldest(max)
    }

    /// Remove a record a store has filed.
    pub fn done(&self, entry: &Entry<TurnRecord>) -> io::Result<()> {
        self.queue.done(entry)
    }

    /// Remove every waiting record of `session` (the owner forgot it); how many.
    pub fn forget(&self, session: &SessionId) -> io::Result<u64> {
        let prefix = format!("{session}.");
        self.queue.remove_where(|k| k.starts_with(&prefix))
    }

    /// Wait until a record is added or `timeout` passes.
    pub fn wait(&self, timeout: std::time::Duration) {
        self.queue.wait(timeout)
    }
}
