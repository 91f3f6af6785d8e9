//! The memory hand-off: each finished turn goes to memoryd as a `turn_record`, through a durable
//! outbox in `<home>/loop/outbox/`.
//!
//! A turn is written to the outbox (the one durable queue, `bxcore::queue`: bounded by `[memory]
//! max_outbox`, each record fsync'd before it counts) before its channel hears `turn_done`, and a background thread sends the outbox in order,
//! deleting each record only when memoryd answers `turn_filed` for it. memoryd being down, slow
//! or refusing never blocks or fails a turn, and loses nothing: records wait, retried with
//! backoff. A record is sent at least once; memoryd files idempotently, so a resend after a
//! crash between `turn_filed` and the delete never duplicates a memory.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Duration;

use bxcore::queue::{Anchors, Entry, Queue, QueueError};
use bxcore::{Message, TurnRecord, client};
use bxharden::log::notice;

/// The runbook entry for memoryd being unreachable.
pub const MEMORY_ANCHOR: &str = "memory-unavailable";
/// The runbook entry for a finished turn that could not be written to the outbox.
pub const OUTBOX_UNWRITABLE_ANCHOR: &str = "loopd-outbox-unwritable";
/// The runbook entry for an outbox record that cannot be read.
pub const DAMAGED_ANCHOR: &str = "loopd-outbox-damaged";
/// The runbook entry for an outbox at its bound.
pub const FULL_ANCHOR: &str = "loopd-outbox-full";

/// The first wait after a failed send; it doubles up to `MAX_BACKOFF`.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The most turns one round of the sender reads, so what it holds in memory is bounded by the
/// round, not by how many turns wait.
pub const ROUND: usize = 8;
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// loopd's queue of finished turns on their way to memoryd (`bxcore::queue`).
#[derive(Debug)]
pub struct Outbox {
    queue: Queue<TurnRecord>,
}

/// A record's key: its session and turn, so a turn is queued once.
pub fn key(record: &TurnRecord) -> String {
    format!("{}.{:020}", record.session, record.turn)
}

impl Outbox {
    /// Open (making it 0700 if absent) the outbox in `dir`, holding at most `max` turns. Stale
    /// temp files from a crash are removed: their record was never acknowledged to anyone. A
    /// record of the older layout (`<seq>.json`, the bare turn) is carried over in its order.
    pub fn open(dir: &Path, max: usize) -> io::Result<Outbox> {
        let anchors = Anchors {
            unwritable: OUTBOX_UNWRITABLE_ANCHOR,
            damaged: DAMAGED_ANCHOR,
            full: FULL_ANCHOR,
        };
        let queue = Queue::open(dir, max, anchors, bxharden::log::with_pointer)?;
        let outbox = Outbox { queue };
        outbox.carry_over()?;
        Ok(outbox)
    }

    /// Records of the older layout, `<20 digits>.json` holding the bare turn, put in their order.
    fn carry_over(&self) -> io::Result<()> {
        let dir = self.queue.dir();
        let mut old: Vec<(u64, std::path::PathBuf)> = Vec::new();
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(n) = name
                .strip_suffix(".json")
                .filter(|d| d.len() == 20 && d.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|d| d.parse::<u64>().ok())
            {
                old.push((n, dir.join(name.as_ref())));
            }
        }
        old.sort();
        for (_, path) in old {
            match serde_json::from_slice::<TurnRecord>(&fs::read(&path)?) {
                Ok(record) => {
                    self.queue
                        .put(&key(&record), &record)
                        .map_err(io::Error::other)?;
                    fs::remove_file(&path)?;
                }
                Err(e) => {
                    let aside = path.with_extension("damaged");
                    fs::rename(&path, &aside)?;
                    bxharden::runbook!(
                        DAMAGED_ANCHOR,
                        "{}: the outbox record does not parse ({e}); it was moved to {} and will not be sent",
                        path.display(),
                        aside.display()
                    );
                }
            }
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        self.queue.dir()
    }

    /// Write one finished turn durably, after every turn written before it.
    pub fn put(&self, record: &TurnRecord) -> Result<(), QueueError> {
        self.queue.put(&key(record), record).map(drop)
    }

    /// The waiting turns, oldest first (a damaged record set aside and logged).
    pub fn pending(&self) -> Result<Vec<Entry<TurnRecord>>, QueueError> {
        self.queue.pending()
    }

    /// Remove a turn memoryd has filed.
    pub fn done(&self, entry: &Entry<TurnRecord>) -> io::Result<()> {
        self.queue.done(entry)
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
            let mut full = false;
            let failed = match self.queue.oldest(ROUND) {
                Ok(entries) => {
                    full = entries.len() == ROUND;
                    self.deliver(&entries, socket, timeout)
                }
                Err(e) => Some(e.to_string()),
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
                    // A full round may have left more behind it: the next round at once.
                    if !full {
                        self.queue.wait(Duration::from_secs(60));
                    }
                }
                Some(why) => {
                    if !down {
                        bxharden::runbook!(
                            MEMORY_ANCHOR,
                            "memory is unavailable: {why}; finished turns wait in {} and are retried",
                            self.dir().display()
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
    fn deliver(
        &self,
        entries: &[Entry<TurnRecord>],
        socket: &Path,
        timeout: Duration,
    ) -> Option<String> {
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
