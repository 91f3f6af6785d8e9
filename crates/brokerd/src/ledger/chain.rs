//! The audit chain, `<home>/broker/audit/chain.jsonl`: verified from the first record, a torn
//! tail cut off and recorded, and records appended with group commit.
//!
//! Each record's hash covers the previous record's hash, so a record changed, removed, inserted
//! or moved breaks the chain where it happened. A break is reported as one episode: from the
//! first record that does not follow, through the records that follow it only among themselves,
//! to the first that chains on again. The owner accepts one episode at a time, by its place and
//! the hash the chain resumes from, with an `accepted` record appended at the end.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};

use bxcore::runbook::Anchored;
use bxcore::{ApprovalId, SessionId, Timestamp, canonical};
use serde_json::{Value, json};

use super::line::{Entry, Parsed, Reader};
use super::record::{Draft, Event, GENESIS, Record};

/// The runbook anchor of a chain that does not verify.
pub const BROKEN_ANCHOR: &str = "audit-chain-broken";
/// The runbook anchor of a record that could not be written.
pub const WRITE_ANCHOR: &str = "audit-write-failed";
/// The runbook anchor of a chain file removed or replaced under brokerd.
pub const REPLACED_ANCHOR: &str = "audit-chain-replaced";
/// The journal gets a copy of the head every this many records (and at start and stop), so that
/// it holds copies the file does not.
pub const HEAD_EVERY: u64 = 1000;

/// One break: where the chain stops following, why, and the hash it resumes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Break {
    /// The `seq` the chain expected where it broke.
    pub at: u64,
    pub why: String,
    /// The hash the records after the break chain from: what an `accepted` record names.
    pub resumes: String,
    /// An `accepted` record covers it.
    pub accepted: bool,
}

/// A last line without its newline: a write a crash cut short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Torn {
    /// Where the line starts, in bytes.
    pub offset: u64,
    pub len: u64,
    /// sha256 of the cut bytes, so the record says what was cut without repeating it.
    pub sha256: String,
}

/// A pending approval the chain opened and never closed.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenApproval {
    pub approval: ApprovalId,
    pub draft: Draft,
}

/// What a scan of the chain found.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Whole records (lines) read.
    pub records: u64,
    /// The seq the next record takes.
    pub next_seq: u64,
    /// The last record's hash, or `GENESIS`.
    pub head: String,
    /// The length of the whole lines, in bytes.
    pub len: u64,
    pub torn: Option<Torn>,
    pub breaks: Vec<Break>,
    pub open: Vec<OpenApproval>,
    /// The `accepted` records met: `(at, accepts)`.
    pub accepted: Vec<(u64, String)>,
}

impl Scan {
    /// The first break no `accepted` record covers.
    pub fn first_unaccepted(&self) -> Option<&Break> {
        self.breaks.iter().find(|b| !b.accepted)
    }
}

/// How a scan may use the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Parse and hash on the calling thread only: at start, before the sandbox, when no other
    /// thread may exist (one that has just been joined can still be listed for a moment).
    One,
    /// Parse and hash over the cores (`audit verify`, while serving).
    Cores,
}

/// Scan `bytes`, the whole chain file. Never fails: what is wrong is in the result.
pub fn scan(bytes: &[u8], threads: Threads) -> Scan {
    let mut f = Follower {
        s: Scan {
            next_seq: 1,
            head: GENESIS.to_string(),
            ..Scan::default()
        },
        open: BTreeMap::new(),
        episode: None,
    };
    // Split into whole lines and a torn tail.
    let whole_len = match memchr::memrchr(b'\n', bytes) {
        Some(i) => i + 1,
        None => 0,
    };
    if whole_len < bytes.len() {
        let cut = &bytes[whole_len..];
        f.s.torn = Some(Torn {
            offset: whole_len as u64,
            len: cut.len() as u64,
            sha256: canonical::sha256_hex(cut),
        });
    }
    f.s.len = whole_len as u64;
    let cores = match threads {
        Threads::One => 1,
        Threads::Cores => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // Splitting into lines, parsing and hashing each is independent: done in blocks, over the
    // cores; following the links is sequential, on this thread, while the next blocks are
    // parsed.
    let mut blocks = Vec::new();
    let mut rest = &bytes[..whole_len];
    while !rest.is_empty() {
        let (block, after) = rest.split_at(line_end(rest, BLOCK));
        blocks.push(block);
        rest = after;
    }
    if cores < 2 || blocks.len() < 2 {
        for block in blocks {
            f.block(parse_lines(block));
        }
    } else {
        std::thread::scope(|scope| {
            // Worker `w` parses blocks `w`, `w + cores`, ... and hands each over in turn, at
            // most two ahead.
            let parsed: Vec<_> = (0..cores)
                .map(|w| {
                    let (tx, rx) = std::sync::mpsc::sync_channel(2);
                    let mine: Vec<&[u8]> = blocks.iter().skip(w).step_by(cores).copied().collect();
                    scope.spawn(move || {
                        for block in mine {
                            if tx.send(parse_lines(block)).is_err() {
                                break;
                            }
                        }
                    });
                    rx
                })
                .collect();
            for (i, &block) in blocks.iter().enumerate() {
                // Only a panic stops a worker (and the scope raises it again when it ends): its
                // blocks are then read here, so that no line goes unread meanwhile.
                let lines = parsed[i % cores]
                    .recv()
                    .unwrap_or_else(|_| parse_lines(block));
                f.block(lines);
            }
        });
    }
    let Follower {
        mut s,
        open,
        mut episode,
    } = f;
    if let Some(mut b) = episode.take() {
        b.resumes = s.head.clone();
        s.breaks.push(b);
    }
    for (at, accepts) in &s.accepted {
        if let Some(b) = s
            .breaks
            .iter_mut()
            .find(|b| !b.accepted && b.at == *at && b.resumes == *accepts)
        {
            b.accepted = true;
        }
    }
    s.open = open.into_values().collect();
    s
}

/// The scan so far, following the records in order.
struct Follower {
    s: Scan,
    open: BTreeMap<String, OpenApproval>,
    /// The break being followed: from the first line that does not follow to the first that
    /// chains on again.
    episode: Option<Break>,
}

impl Follower {
    fn block(&mut self, lines: Vec<Parsed<'_>>) {
        for parsed in lines {
            self.line(parsed);
        }
    }

    fn line(&mut self, parsed: Parsed<'_>) {
        let s = &mut self.s;
        s.records += 1;
        match link(parsed, &s.head, s.next_seq) {
            Ok(rec) => {
                if let Some(mut b) = self.episode.take() {
                    b.resumes = s.head.clone();
                    s.breaks.push(b);
                }
                s.next_seq = rec.seq + 1;
                s.head.clear();
                s.head.push_str(&rec.hash);
                follow(s, &mut self.open, rec);
            }
            Err((why, resync)) => {
                if self.episode.is_none() {
                    self.episode = Some(Break {
                        at: s.next_seq,
                        why,
                        resumes: String::new(),
                        accepted: false,
                    });
                }
                match resync {
                    Resync::At(seq, hash) => {
                        s.next_seq = seq.saturating_add(1);
                        s.head = hash;
                    }
                    // A line that does not parse: the next one is judged against a hash no
                    // record has (the line's own sha256), so it belongs to the same episode.
                    Resync::Unparsed(line_hash) => {
                        s.next_seq = s.next_seq.saturating_add(1);
                        s.head = line_hash;
                    }
                }
            }
        }
    }
}

/// Where the chain resumes after a line that does not follow.
enum Resync {
    /// After this record (its seq and hash).
    At(u64, String),
    /// After a line that is no record, whose sha256 this is.
    Unparsed(String),
}

/// Bytes of lines per block: about 2 700 records brokerd wrote, parsed and hashed by one
/// worker and handed over whole.
const BLOCK: usize = 1 << 20;

/// The end of the line that holds byte `at` of `bytes` (just past its newline), or the end of
/// `bytes`.
fn line_end(bytes: &[u8], at: usize) -> usize {
    if at >= bytes.len() {
        return bytes.len();
    }
    memchr::memchr(b'\n', &bytes[at..]).map_or(bytes.len(), |i| at + i + 1)
}

/// Parse each line of `part` (whole lines, each ending in a newline).
fn parse_lines(part: &[u8]) -> Vec<Parsed<'_>> {
    let reader = Reader::new();
    // Lines brokerd writes are 300 bytes or more: room for all of them, most of the time.
    let mut out = Vec::with_capacity(part.len() / 256 + 1);
    let mut rest = part;
    while let Some(i) = memchr::memchr(b'\n', rest) {
        out.push(reader.parse(&rest[..i]));
        rest = &rest[i + 1..];
    }
    out
}

/// One parsed line against the chain so far: the record, or why it does not follow and where
/// the chain resumes from it.
fn link<'a>(parsed: Parsed<'a>, head: &str, want_seq: u64) -> Result<Entry<'a>, (String, Resync)> {
    let (rec, own) = parsed.map_err(|(why, line_hash)| (why, Resync::Unparsed(line_hash)))?;
    let why = if !own {
        format!(
            "record {} does not match its hash (it was changed after it was written)",
            rec.seq
        )
    } else if rec.seq != want_seq {
        format!(
            "record {} is where record {want_seq} should be (a record is missing, added or moved)",
            rec.seq
        )
    } else if rec.prev != head {
        format!(
            "record {} does not follow the record before it (its prev is not that record's hash)",
            rec.seq
        )
    } else {
        return Ok(rec);
    };
    Err((why, Resync::At(rec.seq, rec.hash.into_owned())))
}

fn follow(s: &mut Scan, open: &mut BTreeMap<String, OpenApproval>, rec: Entry<'_>) {
    let approval = || {
        rec.marks
            .approval
            .as_deref()
            .and_then(|a| ApprovalId::new(a).ok())
    };
    match rec.event {
        Event::Pending => {
            if let Some(id) = approval() {
                open.insert(
                    id.as_str().to_string(),
                    OpenApproval {
                        approval: id,
                        draft: Draft {
                            // Valid: the reading refused any other.
                            session: rec.session.and_then(|s| SessionId::new(s).ok()),
                            call: rec.call,
                            tool: rec.tool.map(Cow::into_owned),
                            event: Event::Expired,
                            detail: Value::Null,
                        },
                    },
                );
            }
        }
        Event::Approved | Event::Expired | Event::Denied | Event::Withdrawn => {
            if let Some(id) = approval() {
                open.remove(id.as_str());
            }
        }
        Event::Accepted => {
            if let (Some(at), Some(accepts)) = (rec.marks.at, rec.marks.accepts) {
                s.accepted.push((at, accepts.into_owned()));
            }
        }
        _ => {}
    }
}

/// Why the chain cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// The file cannot be read, created, cut or written.
    #[error("the audit chain {} cannot be used: {}", .0.display(), .1)]
    Io(PathBuf, String),
    /// A break no `accepted` record covers.
    #[error("the audit chain is broken at {at}: {why}")]
    Broken { at: u64, why: String },
    /// `accept --at` names a place where the chain is not broken.
    #[error("{}", not_there(*asked, *first))]
    NotThere { asked: u64, first: Option<u64> },
}

fn not_there(asked: u64, first: Option<u64>) -> String {
    match first {
        Some(first) => format!(
            "the audit chain is not broken at {asked}; its first break is at {first}: run \
             `brokerd audit verify` and accept what it shows"
        ),
        None => format!(
            "the audit chain is not broken (at {asked} or anywhere): there is nothing to accept"
        ),
    }
}

impl Anchored for ChainError {
    fn anchor(&self) -> &str {
        match self {
            ChainError::Io(..) => WRITE_ANCHOR,
            ChainError::Broken { .. } | ChainError::NotThere { .. } => BROKEN_ANCHOR,
        }
    }
}

/// Read the whole chain file; a missing file is an empty chain.
pub fn read_file(path: &Path) -> Result<Vec<u8>, ChainError> {
    match std::fs::read(path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(ChainError::Io(
            path.to_path_buf(),
            format!("cannot read it: {e}"),
        )),
    }
}

/// Read `len` bytes of the chain file: the part a running broker has written whole.
pub fn read_prefix(path: &Path, len: u64) -> Result<Vec<u8>, ChainError> {
    let mut f = File::open(path)
        .map_err(|e| ChainError::Io(path.to_path_buf(), format!("cannot read it: {e}")))?;
    let mut out = Vec::new();
    (&mut f)
        .take(len)
        .read_to_end(&mut out)
        .map_err(|e| ChainError::Io(path.to_path_buf(), format!("cannot read it: {e}")))?;
    Ok(out)
}

/// What opening the chain for writing did, for the startup notice.
#[derive(Debug, Clone)]
pub struct Opened {
    pub torn: Option<Torn>,
    /// Breaks covered by `accepted` records.
    pub accepted: Vec<Break>,
    /// Approvals pending when the broker last stopped: now recorded as expired.
    pub expired: usize,
    pub records: u64,
    /// The head it found: the last record's seq (0 for an empty chain) and hash.
    pub found: (u64, String),
}

/// How `open` treats a break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBreak {
    /// Refuse: `ChainError::Broken`.
    Refuse,
    /// Accept the first uncovered break, which must be at this seq (`brokerd audit accept`).
    AcceptAt(u64),
}

/// Open the chain for appending: verify it, cut a torn tail (and record it), refuse a break (or
/// accept the one named), and record that approvals left pending are expired. The caller holds
/// the audit lock.
pub fn open(path: &Path, on_break: OnBreak) -> Result<(Audit, Opened), ChainError> {
    let io_err =
        |what: &str, e: io::Error| ChainError::Io(path.to_path_buf(), format!("{what}: {e}"));
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io_err("cannot open it", e))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| io_err("cannot read it", e))?;
    let s = scan(&bytes, Threads::One);
    let mut accept: Option<Break> = None;
    if let Some(b) = s.first_unaccepted() {
        match on_break {
            OnBreak::AcceptAt(at) if at == b.at => accept = Some(b.clone()),
            OnBreak::AcceptAt(asked) => {
                return Err(ChainError::NotThere {
                    asked,
                    first: Some(b.at),
                });
            }
            OnBreak::Refuse => {
                return Err(ChainError::Broken {
                    at: b.at,
                    why: b.why.clone(),
                });
            }
        }
        // One break is accepted at a time: the owner looks at each, and the next start names
        // the next.
    } else if let OnBreak::AcceptAt(asked) = on_break {
        return Err(ChainError::NotThere { asked, first: None });
    }
    if let Some(t) = &s.torn {
        file.set_len(t.offset)
            .map_err(|e| io_err("cannot cut off its torn tail", e))?;
        file.sync_all().map_err(|e| io_err("cannot fsync it", e))?;
        file.seek(SeekFrom::End(0))
            .map_err(|e| io_err("cannot seek", e))?;
    }
    let found = (s.next_seq.saturating_sub(1), s.head.clone());
    let sync_file = file.try_clone().map_err(|e| io_err("cannot clone it", e))?;
    let audit = Audit {
        path: path.to_path_buf(),
        inner: Mutex::new(Inner {
            file,
            next_seq: s.next_seq,
            head: s.head.clone(),
            len: s.len,
            written: s.next_seq.saturating_sub(1),
            synced: s.next_seq.saturating_sub(1),
            syncing: false,
            failed: None,
        }),
        synced_cv: Condvar::new(),
        sync_file,
    };
    let mut drafts = Vec::new();
    if let Some(t) = &s.torn {
        drafts.push(Draft::broker(
            Event::Recovered,
            json!({
                "why": "a torn tail is recovered: the last line had no newline (a write cut short by a crash) and was cut off",
                "offset": t.offset,
                "cut_bytes": t.len,
                "cut_sha256": t.sha256,
            }),
        ));
    }
    if let Some(b) = &accept {
        drafts.push(Draft::broker(
            Event::Accepted,
            json!({"at": b.at, "why": b.why, "accepts": b.resumes}),
        ));
    }
    for o in &s.open {
        let mut d = o.draft.clone();
        d.detail = json!({"approval": o.approval, "why": "expired at restart"});
        drafts.push(d);
    }
    if !drafts.is_empty() {
        audit
            .commit(drafts)
            .map_err(|e| ChainError::Io(path.to_path_buf(), e.to_string()))?;
    }
    let mut accepted: Vec<Break> = s.breaks.iter().filter(|b| b.accepted).cloned().collect();
    accepted.extend(accept);
    Ok((
        audit,
        Opened {
            torn: s.torn,
            accepted,
            expired: s.open.len(),
            records: s.records,
            found,
        },
    ))
}

/// A record could not be made durable. The chain refuses every later append: a record that may
/// be half on disk must not be followed by more.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the audit chain cannot be written: {0}")]
pub struct AuditError(pub String);

impl Anchored for AuditError {
    fn anchor(&self) -> &str {
        WRITE_ANCHOR
    }
}

#[derive(Debug)]
struct Inner {
    file: File,
    next_seq: u64,
    head: String,
    /// Bytes of whole records written.
    len: u64,
    /// The last seq written (not yet necessarily durable).
    written: u64,
    /// The last seq known durable.
    synced: u64,
    /// A thread is in `fdatasync` for everyone.
    syncing: bool,
    failed: Option<String>,
}

/// The open chain: appends with group commit. A thread appends its records (one `write`) and
/// then waits until a `fdatasync` that started after its write has finished; one thread syncs for
/// all that wait, so concurrent calls share fsyncs and none skips one.
#[derive(Debug)]
pub struct Audit {
    path: PathBuf,
    inner: Mutex<Inner>,
    synced_cv: Condvar,
    sync_file: File,
}

impl Audit {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append `drafts` in one write; the seq of the last. Not durable until `sync`.
    pub fn append(&self, drafts: Vec<Draft>) -> Result<u64, AuditError> {
        let mut g = self.lock();
        if let Some(why) = &g.failed {
            return Err(AuditError(why.clone()));
        }
        if let Some(why) = self.not_held(&g.file) {
            // Appending to a file nobody can see any more loses every record from here on.
            let (seq, head) = (g.next_seq.saturating_sub(1), g.head.clone());
            bxharden::runbook!(
                REPLACED_ANCHOR,
                "{why}; the records up to {seq}:{head} are in the file that was held; brokerd \
                 stops rather than write into a file nobody sees"
            );
            std::process::exit(1);
        }
        let now = Timestamp::now();
        let mut buf = String::new();
        let mut seq = g.next_seq;
        let mut head = g.head.clone();
        for d in drafts {
            let r = Record::seal(d, seq, &head, now);
            buf.push_str(&r.line());
            head = r.hash;
            seq += 1;
        }
        if let Err(e) = g.file.write_all(buf.as_bytes()) {
            let why = format!("a write to {} failed: {e}", self.path.display());
            g.failed = Some(why.clone());
            return Err(AuditError(why));
        }
        if (g.next_seq..seq).any(|s| s % HEAD_EVERY == 0) {
            log_head("every 1000 records", seq - 1, &head);
        }
        g.next_seq = seq;
        g.head = head;
        g.len += buf.len() as u64;
        g.written = seq - 1;
        Ok(seq - 1)
    }

    /// Why the path no longer names the file held open, if it does not: removed, or replaced
    /// (`sed -i` writes a new file and renames it over the old one).
    fn not_held(&self, file: &File) -> Option<String> {
        let held = match file.metadata() {
            Ok(m) => m,
            Err(e) => {
                return Some(format!(
                    "the audit chain held open cannot be looked at: {e}"
                ));
            }
        };
        match fs::metadata(&self.path) {
            Ok(m) if m.dev() == held.dev() && m.ino() == held.ino() => None,
            Ok(_) => Some(format!(
                "the audit chain {} was replaced by another file while brokerd held it",
                self.path.display()
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some(format!(
                "the audit chain {} was removed while brokerd held it",
                self.path.display()
            )),
            Err(e) => Some(format!(
                "the audit chain {} cannot be looked at: {e}",
                self.path.display()
            )),
        }
    }

    /// The head: the last record's seq and hash.
    pub fn head(&self) -> (u64, String) {
        let g = self.lock();
        (g.next_seq.saturating_sub(1), g.head.clone())
    }

    /// Wait until record `seq` is durable, syncing for every waiter when no sync is running.
    pub fn sync(&self, seq: u64) -> Result<(), AuditError> {
        let mut g = self.lock();
        loop {
            if let Some(why) = &g.failed {
                return Err(AuditError(why.clone()));
            }
            if g.synced >= seq {
                return Ok(());
            }
            if g.syncing {
                g = self.synced_cv.wait(g).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            g.syncing = true;
            let target = g.written;
            drop(g);
            let r = self.sync_file.sync_data();
            g = self.lock();
            g.syncing = false;
            match r {
                Ok(()) => g.synced = g.synced.max(target),
                Err(e) => {
                    g.failed = Some(format!("fdatasync of {} failed: {e}", self.path.display()))
                }
            }
            self.synced_cv.notify_all();
        }
    }

    /// Append and wait until durable.
    pub fn commit(&self, drafts: Vec<Draft>) -> Result<u64, AuditError> {
        let seq = self.append(drafts)?;
        self.sync(seq)?;
        Ok(seq)
    }

    /// The length of the whole records written so far: what a verify may read while appends go on.
    pub fn written_len(&self) -> u64 {
        self.lock().len
    }
}

/// Log the head to the journal: `audit chain head SEQ:HASH (why)`, a copy the owner can keep
/// and later check with `bxctl audit verify --head SEQ:HASH`.
pub fn log_head(why: &str, seq: u64, hash: &str) {
    bxharden::log::notice(&format!("audit chain head {seq}:{hash} ({why})"));
}

/// The hash of record `seq` in `bytes`, if the chain holds that record.
pub fn hash_at(bytes: &[u8], seq: u64) -> Option<String> {
    let needle = format!(",\"seq\":{seq},");
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| l.windows(needle.len()).any(|w| w == needle.as_bytes()))
        .filter_map(|l| serde_json::from_slice::<Record>(l).ok())
        .find(|r| r.seq == seq)
        .map(|r| r.hash)
}

/// `report`, and whether the chain still holds the head the owner kept (`seq:hash`): a chain cut
/// short or re-hashed after an edit verifies on its own, but not against a head kept elsewhere.
pub fn report_head(bytes: &[u8], seq: u64, hash: &str) -> Report {
    let mut r = report(bytes);
    match hash_at(bytes, seq) {
        Some(h) if h == hash => {
            r.detail = format!("{}; it holds the head {seq}:{hash}", r.detail);
        }
        Some(h) => {
            r.ok = false;
            r.detail = format!(
                "the chain does not hold the head {seq}:{hash}: its record {seq} has the hash \
                 {h}, so the chain was rewritten from there on; {}",
                bxcore::runbook::pointer(BROKEN_ANCHOR)
            );
        }
        None => {
            r.ok = false;
            r.detail = format!(
                "the chain does not hold the head {seq}:{hash}: it has no record {seq} (it has \
                 {} records), so records were removed from its end; {}",
                r.records,
                bxcore::runbook::pointer(BROKEN_ANCHOR)
            );
        }
    }
    r
}

/// The report `audit verify` gives: the records, the head, and the first unaccepted break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub records: u64,
    pub head: String,
    pub ok: bool,
    pub detail: String,
}

/// Verify `bytes` as a whole chain, for `audit verify` (nothing is changed).
pub fn report(bytes: &[u8]) -> Report {
    let s = scan(bytes, Threads::Cores);
    let mut notes = Vec::new();
    let accepted = s.breaks.iter().filter(|b| b.accepted).count();
    if accepted > 0 {
        notes.push(format!("{accepted} accepted break(s)"));
    }
    if let Some(t) = &s.torn {
        notes.push(format!(
            "a torn tail of {} bytes at offset {} (cut off and recorded at the next start)",
            t.len, t.offset
        ));
    }
    match s.first_unaccepted() {
        Some(b) => Report {
            records: s.records,
            head: s.head.clone(),
            ok: false,
            detail: ChainError::Broken {
                at: b.at,
                why: b.why.clone(),
            }
            .to_string(),
        },
        None => Report {
            records: s.records,
            head: s.head.clone(),
            ok: true,
            detail: if notes.is_empty() {
                "the chain verifies".to_string()
            } else {
                format!("the chain verifies; {}", notes.join("; "))
            },
        },
    }
}
