//! The one durable queue: records handed on at least once, in the order they were put, and never
//! lost. loopd's memory outbox (finished turns on their way to memoryd) and memoryd's outbox
//! (turns on their way to a store) are each one.
//!
//! One file per record, `<seq>.<key>.json`, written durably (`crate::durable`: temporary file,
//! fsync, rename, fsync the directory), so a crash leaves a whole record or none. `seq` orders
//! the records; `key` names what the record is (`<session>.<turn>`), so a record put twice (a
//! resend after a crash between the answer and the delete) is one file, not two. The queue is
//! bounded: a put past `max` is refused with [`QueueError::Full`], never dropped in silence. A
//! stale temporary file is an unacknowledged write: removed at open. A record that does not parse
//! is set aside as `*.damaged` and logged, never handed on by a guess and never lost.
//!
//! Each daemon names its own runbook entries ([`Anchors`]), so a line in the journal says whose
//! queue it is.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::marker::PhantomData;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::runbook::Anchored;
use crate::{ErrorCode, Timestamp};

/// The runbook entries of one daemon's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchors {
    /// A record that could not be written.
    pub unwritable: &'static str,
    /// A record that cannot be read back.
    pub damaged: &'static str,
    /// A queue at its bound.
    pub full: &'static str,
}

/// Where a queue says what it set aside: a daemon's logger, which adds the daemon's name and the
/// anchor's pointer (`bxharden::log::with_pointer`).
pub type Log = fn(anchor: &str, what: &str);

/// One record on disk: what was put, and when.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Held<T> {
    received: Timestamp,
    record: T,
}

/// A record waiting, with its place in the queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<T> {
    pub seq: u64,
    pub key: String,
    pub path: PathBuf,
    /// When it was put.
    pub received: Timestamp,
    pub record: T,
}

/// Why a record was not taken, or the queue could not be read.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("cannot write {key} to the queue {}: {error}", dir.display())]
    Write {
        anchor: &'static str,
        dir: PathBuf,
        key: String,
        error: io::Error,
    },
    #[error("the queue {} holds {held} records not yet handed on, its limit", dir.display())]
    Full {
        anchor: &'static str,
        dir: PathBuf,
        held: usize,
    },
    #[error("cannot read the queue {}: {error}", dir.display())]
    Read {
        anchor: &'static str,
        dir: PathBuf,
        error: io::Error,
    },
}

impl Anchored for QueueError {
    fn anchor(&self) -> &str {
        match self {
            QueueError::Write { anchor, .. }
            | QueueError::Full { anchor, .. }
            | QueueError::Read { anchor, .. } => anchor,
        }
    }
    fn code(&self) -> ErrorCode {
        match self {
            QueueError::Full { .. } => ErrorCode::Unavailable,
            QueueError::Write { .. } | QueueError::Read { .. } => ErrorCode::Internal,
        }
    }
}

/// What the queue knows without reading a record: the names on disk.
#[derive(Debug)]
struct Index {
    next: u64,
    /// key → seq of every record waiting.
    keys: BTreeMap<String, u64>,
}

/// A durable queue of `T` in one directory.
#[derive(Debug)]
pub struct Queue<T> {
    dir: PathBuf,
    max: usize,
    anchors: Anchors,
    log: Log,
    /// Held while a record is written or removed, so a count, a key and a write do not race.
    index: Mutex<Index>,
    /// Wakes the one that hands records on when one is put.
    added: Condvar,
    fresh: Mutex<bool>,
    records: PhantomData<fn() -> T>,
}

/// `00000000000000000042.s1.00000000000000000007.json` → (42, `s1.00000000000000000007`).
fn parse_name(name: &str) -> Option<(u64, &str)> {
    let stem = name.strip_suffix(".json")?;
    let (seq, key) = stem.split_once('.')?;
    if seq.len() != 20 || !seq.bytes().all(|b| b.is_ascii_digit()) || !valid_key(key) {
        return None;
    }
    Some((seq.parse().ok()?, key))
}

/// A key names a file: 1 to 128 of `A-Z a-z 0-9 _ - .`, not beginning with a dot.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

impl<T: Serialize + DeserializeOwned> Queue<T> {
    /// Open the queue in `dir` (made 0700 if absent), holding at most `max` records, its lines
    /// written with `log` under `anchors`. Stale temporary files from a crash are removed: their
    /// record was never acknowledged.
    pub fn open(dir: &Path, max: usize, anchors: Anchors, log: Log) -> io::Result<Queue<T>> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut index = Index {
            next: 1,
            keys: BTreeMap::new(),
        };
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                fs::remove_file(dir.join(name.as_ref()))?;
            } else if let Some((seq, key)) = parse_name(&name) {
                index.next = index.next.max(seq + 1);
                index.keys.insert(key.to_string(), seq);
            }
        }
        Ok(Queue {
            dir: dir.to_path_buf(),
            max,
            anchors,
            log,
            index: Mutex::new(index),
            added: Condvar::new(),
            fresh: Mutex::new(false),
            records: PhantomData,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many records wait.
    pub fn depth(&self) -> usize {
        self.lock().keys.len()
    }

    /// Whether a record of `key` waits.
    pub fn holds(&self, key: &str) -> bool {
        self.lock().keys.contains_key(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, seq: u64, key: &str) -> PathBuf {
        self.dir.join(format!("{seq:020}.{key}.json"))
    }

    /// Make `record` durable under `key`, after every record put before it: `true` when it was
    /// written, `false` when a record of `key` already waits (it is left as it is).
    pub fn put(&self, key: &str, record: &T) -> Result<bool, QueueError> {
        self.put_at(key, record, Timestamp::now())
    }

    /// [`put`](Self::put), saying when the record was first taken (a record carried over from
    /// an older layout keeps its time).
    pub fn put_at(&self, key: &str, record: &T, received: Timestamp) -> Result<bool, QueueError> {
        let werr = |error: io::Error| QueueError::Write {
            anchor: self.anchors.unwritable,
            dir: self.dir.clone(),
            key: key.to_string(),
            error,
        };
        if !valid_key(key) {
            return Err(werr(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a key is 1 to 128 of A-Z a-z 0-9 _ - . and does not begin with a dot",
            )));
        }
        let mut index = self.lock();
        if index.keys.contains_key(key) {
            return Ok(false);
        }
        if index.keys.len() >= self.max {
            return Err(QueueError::Full {
                anchor: self.anchors.full,
                dir: self.dir.clone(),
                held: index.keys.len(),
            });
        }
        let held = Held { received, record };
        let body = serde_json::to_vec(&held).map_err(|e| werr(io::Error::other(e)))?;
        let seq = index.next;
        crate::durable::replace(&self.path(seq, key), &body).map_err(|e| werr(e.into()))?;
        index.next = seq + 1;
        index.keys.insert(key.to_string(), seq);
        drop(index);
        *self.fresh.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.added.notify_all();
        Ok(true)
    }

    /// The waiting records, oldest first. A file that does not parse is renamed `*.damaged`
    /// (kept for the owner, never handed on) and logged.
    pub fn pending(&self) -> Result<Vec<Entry<T>>, QueueError> {
        self.oldest(usize::MAX)
    }

    /// The `max` oldest waiting records, read: what a consumer takes in one round, so that
    /// what it holds in memory is bounded by the round and not by the queue's depth.
    pub fn oldest(&self, max: usize) -> Result<Vec<Entry<T>>, QueueError> {
        let waiting: Vec<(u64, String)> = {
            let index = self.lock();
            let mut w: Vec<(u64, String)> =
                index.keys.iter().map(|(k, s)| (*s, k.clone())).collect();
            w.sort();
            w.truncate(max);
            w
        };
        let mut out = Vec::with_capacity(waiting.len());
        for (seq, key) in waiting {
            let path = self.path(seq, &key);
            let parsed = fs::read(&path).and_then(|b| {
                serde_json::from_slice::<Held<T>>(&b)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            });
            match parsed {
                Ok(held) => out.push(Entry {
                    seq,
                    key,
                    path,
                    received: held.received,
                    record: held.record,
                }),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    self.set_aside(&path, &key, &format!("it does not parse ({e})"))?;
                }
                // Removed since the index was read (done, or forgotten).
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(QueueError::Read {
                        anchor: self.anchors.unwritable,
                        dir: self.dir.clone(),
                        error,
                    });
                }
            }
        }
        Ok(out)
    }

    fn set_aside(&self, path: &Path, key: &str, why: &str) -> Result<(), QueueError> {
        let aside = path.with_extension("damaged");
        let mut index = self.lock();
        fs::rename(path, &aside).map_err(|error| QueueError::Read {
            anchor: self.anchors.damaged,
            dir: self.dir.clone(),
            error,
        })?;
        index.keys.remove(key);
        drop(index);
        let what = format!(
            "{}: the queued record cannot be handed on: {why}; it was moved to {}",
            path.display(),
            aside.display(),
        );
        (self.log)(self.anchors.damaged, &what);
        Ok(())
    }

    /// Remove a record that was handed on. One already gone is no error.
    pub fn done(&self, entry: &Entry<T>) -> io::Result<()> {
        let mut index = self.lock();
        match fs::remove_file(&entry.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if index.keys.get(&entry.key) == Some(&entry.seq) {
            index.keys.remove(&entry.key);
        }
        drop(index);
        File::open(&self.dir)?.sync_all()
    }

    /// Remove every waiting record whose key `forget` picks (the owner forgot a session); how
    /// many.
    pub fn remove_where(&self, forget: impl Fn(&str) -> bool) -> io::Result<u64> {
        let mut index = self.lock();
        let gone: Vec<(String, u64)> = index
            .keys
            .iter()
            .filter(|(k, _)| forget(k))
            .map(|(k, s)| (k.clone(), *s))
            .collect();
        for (key, seq) in &gone {
            match fs::remove_file(self.path(*seq, key)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            index.keys.remove(key);
        }
        drop(index);
        if !gone.is_empty() {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(gone.len() as u64)
    }

    /// Wait until a record is put or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        let fresh = self.fresh.lock().unwrap_or_else(|p| p.into_inner());
        let (mut fresh, _) = self
            .added
            .wait_timeout_while(fresh, timeout, |f| !*f)
            .unwrap_or_else(|p| p.into_inner());
        *fresh = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANCHORS: Anchors = Anchors {
        unwritable: "q-unwritable",
        damaged: "q-damaged",
        full: "q-full",
    };

    fn quiet(_: &str, _: &str) {}

    fn open(dir: &Path, max: usize) -> Queue<String> {
        Queue::open(dir, max, ANCHORS, quiet).unwrap()
    }

    #[test]
    fn records_come_back_in_the_order_they_were_put_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(dir.path(), 10);
        for (k, v) in [("b.2", "two"), ("a.1", "one"), ("c.3", "three")] {
            assert!(q.put(k, &v.to_string()).unwrap());
        }
        let q = open(dir.path(), 10);
        let got: Vec<String> = q.pending().unwrap().into_iter().map(|e| e.record).collect();
        assert_eq!(got, ["two", "one", "three"]);
        // The next record goes after them.
        q.put("d.4", &"four".to_string()).unwrap();
        let last = q.pending().unwrap().pop().unwrap();
        assert_eq!((last.key.as_str(), last.record.as_str()), ("d.4", "four"));
    }

    #[test]
    fn a_key_put_twice_is_one_record() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(dir.path(), 10);
        assert!(q.put("s.1", &"first".to_string()).unwrap());
        assert!(!q.put("s.1", &"again".to_string()).unwrap());
        let all = q.pending().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].record, "first");
    }

    #[test]
    fn a_full_queue_refuses_with_its_anchor_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(dir.path(), 2);
        q.put("a", &"1".to_string()).unwrap();
        q.put("b", &"2".to_string()).unwrap();
        let e = q.put("c", &"3".to_string()).unwrap_err();
        assert_eq!(e.anchor(), "q-full");
        assert_eq!(e.code(), ErrorCode::Unavailable);
        assert_eq!(q.depth(), 2);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
        // Handing one on makes room.
        let first = q.pending().unwrap().remove(0);
        q.done(&first).unwrap();
        assert!(q.put("c", &"3".to_string()).unwrap());
    }

    #[test]
    fn a_bad_key_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(dir.path(), 2);
        for key in ["", ".hidden", "a/b", "../x", "sp ace", &"k".repeat(129)] {
            let e = q.put(key, &"x".to_string()).unwrap_err();
            assert_eq!(e.anchor(), "q-unwritable", "{key:?}");
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_record_that_does_not_parse_is_set_aside_and_logged_and_the_rest_go_on() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static LINES: AtomicUsize = AtomicUsize::new(0);
        fn counted(anchor: &str, line: &str) {
            assert_eq!(anchor, "q-damaged");
            assert!(line.contains("it does not parse"), "{line}");
            LINES.fetch_add(1, Ordering::SeqCst);
        }
        let dir = tempfile::tempdir().unwrap();
        let q: Queue<String> = Queue::open(dir.path(), 10, ANCHORS, counted).unwrap();
        q.put("a", &"1".to_string()).unwrap();
        q.put("b", &"2".to_string()).unwrap();
        let torn = q.pending().unwrap().remove(0).path;
        fs::write(&torn, b"{\"received\":").unwrap();
        let left: Vec<String> = q.pending().unwrap().into_iter().map(|e| e.record).collect();
        assert_eq!(left, ["2"]);
        assert!(torn.with_extension("damaged").exists());
        assert_eq!(LINES.load(Ordering::SeqCst), 1);
        assert_eq!(q.depth(), 1);
    }

    #[test]
    fn a_stale_temporary_file_is_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".00000000000000000001.a.json.tmp"), b"half").unwrap();
        let q = open(dir.path(), 10);
        assert_eq!(q.depth(), 0);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn remove_where_forgets_the_keys_it_picks() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(dir.path(), 10);
        for k in ["s1.1", "s2.1", "s1.2"] {
            q.put(k, &k.to_string()).unwrap();
        }
        assert_eq!(q.remove_where(|k| k.starts_with("s1.")).unwrap(), 2);
        let left: Vec<String> = q.pending().unwrap().into_iter().map(|e| e.key).collect();
        assert_eq!(left, ["s2.1"]);
        assert!(!q.holds("s1.1"));
    }
}
