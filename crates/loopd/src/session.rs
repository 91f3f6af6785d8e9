//! Session logs: `<home>/loop/sessions/<id>.jsonl`, one JSON record per line, append-only.
//!
//! The log is the session: nothing about a session lives anywhere else, so a restarted loopd
//! picks up exactly where the last one stopped. Each record is appended with one `write` of a
//! whole line, so a crash can leave at most one torn line, at the end: that line is cut off (and
//! said so). A damaged line anywhere else is refused, never skipped, because a session read back
//! without some of its records would tell the model something that did not happen.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use bxcore::runbook::pointer;
use bxcore::{
    CallId, ChatMessage, ErrorCode, Outcome, SessionId, Timestamp, ToolCall, TurnKey, Usage,
};
use serde::{Deserialize, Serialize};

/// The runbook entry for a torn last record that was cut off.
pub const TORN_TAIL_ANCHOR: &str = "session-log-torn-tail";

/// What a model is told about a tool call whose result never came back (loopd stopped while it
/// ran): providers refuse a conversation with an unanswered tool call.
pub const INTERRUPTED: &str = "the call was interrupted: loopd stopped before its result came back";

/// One line of a session log, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    /// The first line, and only there: the session, its slot and its baseline.
    Start {
        session: SessionId,
        slot: String,
        system: String,
        created: Timestamp,
    },
    /// A turn starts with the owner's text; a channel's turn with the key of the owner's message
    /// it is (`channel_turn`), so that message is never a second turn.
    User {
        turn: u64,
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<TurnKey>,
    },
    /// What the owner's memory recalled for the turn, just before its user text: shown to the
    /// model as a system message. `memories` names the turns it holds, so no later turn of the
    /// session is given them again.
    Recall {
        turn: u64,
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        memories: Vec<Recalled>,
    },
    /// What the model said, and the tools it asked for.
    Assistant {
        text: String,
        tool_calls: Vec<ToolCall>,
    },
    /// A tool call's outcome and what the model was shown.
    Tool {
        call: CallId,
        tool: String,
        outcome: Outcome,
        text: String,
    },
    /// The turn's end, fsync'd: its usage and, for a turn that failed, the error code it ended
    /// with.
    TurnEnd {
        turn: u64,
        usage: Usage,
        at: Timestamp,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorCode>,
    },
}

/// One remembered turn a recall brought into a session: which session's, which turn.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recalled {
    pub session: SessionId,
    pub turn: u64,
}

/// Why a session could not be created, opened or written.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// `resume: false` for a session whose log exists.
    #[error("the session {0} exists already: resume it or pick another name")]
    Exists(SessionId),
    /// `resume: true` for a session with no log.
    #[error("there is no session {0}: start it with resume false")]
    NotFound(SessionId),
    /// A line other than a torn last one does not parse (lines counted from 1).
    #[error("{}:{line}: {why}", path.display())]
    Torn {
        path: PathBuf,
        line: usize,
        why: String,
    },
    /// Reading or writing the log failed.
    #[error("{}: {}", .0.display(), .1)]
    Io(PathBuf, #[source] io::Error),
}

/// The runbook entry of a session log that does not parse.
pub const DAMAGED_ANCHOR: &str = "session-log-damaged";
/// The runbook entry of a session log that cannot be read or written.
pub const UNWRITABLE_ANCHOR: &str = "session-log-unwritable";

impl SessionError {
    /// The runbook entry of damage or an outage; none for the refusals a channel is told about
    /// (exists, not found), which name what to do themselves.
    pub fn anchor(&self) -> Option<&'static str> {
        match self {
            SessionError::Torn { .. } => Some(DAMAGED_ANCHOR),
            SessionError::Io(..) => Some(UNWRITABLE_ANCHOR),
            SessionError::Exists(_) | SessionError::NotFound(_) => None,
        }
    }
}

/// An open session log, and the conversation it holds.
#[derive(Debug)]
pub struct Session {
    id: SessionId,
    path: PathBuf,
    file: File,
    slot: String,
    messages: Vec<ChatMessage>,
    /// Calls asked for whose result is not in the log yet.
    unanswered: Vec<CallId>,
    next_call: u64,
    turns: u64,
    records: u64,
    bytes: u64,
    /// The remembered turns recall has brought into the session so far.
    recalled: std::collections::HashSet<Recalled>,
    /// The keys of the channel's messages that were turns here (one per turn at most).
    keys: std::collections::HashSet<TurnKey>,
}

/// `<dir>/<id>.jsonl`.
pub fn log_path(dir: &Path, id: &SessionId) -> PathBuf {
    dir.join(format!("{id}.jsonl"))
}

/// The session's log as loopd's monitor opens it for the session's worker, which can open no
/// file in the sessions' directory itself. With `create` it is made (0600, its directory
/// fsync'd) when absent; without, it must exist. An empty log is a session not begun: its
/// start record was never written, or was taken back.
pub fn open_log(dir: &Path, id: &SessionId, create: bool) -> Result<File, SessionError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = log_path(dir, id);
    let io = |e| SessionError::Io(path.clone(), e);
    let mut how = OpenOptions::new();
    how.read(true).append(true).mode(0o600);
    if create {
        match how.clone().create_new(true).open(&path) {
            Ok(f) => {
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| SessionError::Io(dir.to_path_buf(), e))?;
                return Ok(f);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
    }
    match how.open(&path) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(SessionError::NotFound(id.clone())),
        Err(e) => Err(io(e)),
    }
}

/// Whether the log holds the session's start: a log that does not is no session yet.
pub fn begun(file: &File, path: &Path) -> Result<bool, SessionError> {
    file.metadata()
        .map(|m| m.len() > 0)
        .map_err(|e| SessionError::Io(path.to_path_buf(), e))
}

impl Session {
    /// Create the session in `dir`: [`open_log`], then [`Session::begin`].
    pub fn create(
        dir: &Path,
        id: &SessionId,
        slot: &str,
        system: &str,
    ) -> Result<Session, SessionError> {
        let file = open_log(dir, id, true)?;
        Session::begin(file, log_path(dir, id), id, slot, system)
    }

    /// Open the session in `dir`: [`open_log`], then [`Session::resume`].
    pub fn open(dir: &Path, id: &SessionId, log: &dyn Fn(&str)) -> Result<Session, SessionError> {
        let file = open_log(dir, id, false)?;
        Session::resume(file, log_path(dir, id), id, log)
    }

    /// Begin the session in its empty log `file` (at `path`): its first record, fsync'd. A log
    /// that holds a session already is `Exists`.
    pub fn begin(
        file: File,
        path: PathBuf,
        id: &SessionId,
        slot: &str,
        system: &str,
    ) -> Result<Session, SessionError> {
        if begun(&file, &path)? {
            return Err(SessionError::Exists(id.clone()));
        }
        let mut s = Session {
            id: id.clone(),
            path,
            file,
            slot: slot.to_string(),
            messages: Vec::new(),
            unanswered: Vec::new(),
            next_call: 1,
            turns: 0,
            records: 0,
            bytes: 0,
            recalled: Default::default(),
            keys: Default::default(),
        };
        let started = s
            .append(&Record::Start {
                session: id.clone(),
                slot: slot.to_string(),
                system: system.to_string(),
                created: Timestamp::now(),
            })
            .and_then(|()| s.sync());
        if let Err(e) = started {
            // A log without its whole start record could never be opened: take it back to
            // empty, so the session can be begun again once the fault is fixed.
            let _ = s.file.set_len(0);
            return Err(e);
        }
        Ok(s)
    }

    /// Read the session's log `file` (at `path`) whole, from its start. A torn last line is cut
    /// off and `log` is told once; any other damage is `SessionError::Torn`; an empty log is
    /// `NotFound`.
    pub fn resume(
        mut file: File,
        path: PathBuf,
        id: &SessionId,
        log: &dyn Fn(&str),
    ) -> Result<Session, SessionError> {
        use std::io::Seek;
        if !begun(&file, &path)? {
            return Err(SessionError::NotFound(id.clone()));
        }
        let mut data = Vec::new();
        file.seek(io::SeekFrom::Start(0))
            .and_then(|_| file.read_to_end(&mut data))
            .map_err(|e| SessionError::Io(path.clone(), e))?;
        let whole = match data.iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None => 0,
        };
        if whole < data.len() {
            file.set_len(whole as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| SessionError::Io(path.clone(), e))?;
            log(&format!(
                "loopd: {}: a torn last record was cut off; {}",
                path.display(),
                pointer(TORN_TAIL_ANCHOR)
            ));
        }
        let mut s = Session {
            id: id.clone(),
            path,
            file,
            slot: String::new(),
            messages: Vec::new(),
            unanswered: Vec::new(),
            next_call: 1,
            turns: 0,
            records: 0,
            bytes: 0,
            recalled: Default::default(),
            keys: Default::default(),
        };
        for (i, line) in data[..whole].split_inclusive(|&b| b == b'\n').enumerate() {
            let n = i + 1;
            let line = &line[..line.len() - 1];
            let torn = |why: String| SessionError::Torn {
                path: s.path.clone(),
                line: n,
                why,
            };
            let record: Record = serde_json::from_slice(line)
                .map_err(|e| torn(format!("the record does not parse: {e}")))?;
            match (&record, n) {
                (Record::Start { session, slot, .. }, 1) => {
                    if session != id {
                        return Err(torn(format!(
                            "the log starts the session {session}, not {id}"
                        )));
                    }
                    s.slot = slot.clone();
                }
                (Record::Start { .. }, _) => {
                    return Err(torn("a second start record".to_string()));
                }
                (_, 1) => {
                    return Err(torn(
                        "the first record is not the session's start".to_string(),
                    ));
                }
                _ => {}
            }
            s.take(&record, line.len() as u64 + 1);
        }
        if s.records == 0 {
            return Err(SessionError::Torn {
                path: s.path.clone(),
                line: 1,
                why: "the log is empty: it has no start record".to_string(),
            });
        }
        Ok(s)
    }

    /// Append one record with one `write` of its whole line. Not fsync'd: see `sync`.
    pub fn append(&mut self, record: &Record) -> Result<(), SessionError> {
        let mut line = serde_json::to_vec(record)
            .map_err(|e| SessionError::Io(self.path.clone(), io::Error::other(e)))?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .map_err(|e| SessionError::Io(self.path.clone(), e))?;
        self.take(record, line.len() as u64);
        Ok(())
    }

    /// Make everything appended so far durable.
    pub fn sync(&mut self) -> Result<(), SessionError> {
        self.file
            .sync_data()
            .map_err(|e| SessionError::Io(self.path.clone(), e))
    }

    /// Fold one record into the conversation.
    fn take(&mut self, record: &Record, len: u64) {
        self.records += 1;
        self.bytes += len;
        match record {
            Record::Start { system, .. } => self.messages.push(ChatMessage::System {
                text: system.clone(),
            }),
            Record::User { turn, text, key } => {
                self.answer_interrupted();
                if let Some(key) = key {
                    self.keys.insert(key.clone());
                }
                self.turns = self.turns.max(*turn);
                self.messages.push(ChatMessage::User { text: text.clone() });
            }
            Record::Recall { text, memories, .. } => {
                self.answer_interrupted();
                self.recalled.extend(memories.iter().cloned());
                self.messages
                    .push(ChatMessage::System { text: text.clone() });
            }
            Record::Assistant { text, tool_calls } => {
                self.answer_interrupted();
                for c in tool_calls {
                    self.next_call = self.next_call.max(c.call.0.saturating_add(1));
                    self.unanswered.push(c.call);
                }
                self.messages.push(ChatMessage::Assistant {
                    text: text.clone(),
                    tool_calls: tool_calls.clone(),
                });
            }
            Record::Tool { call, text, .. } => {
                self.next_call = self.next_call.max(call.0.saturating_add(1));
                self.unanswered.retain(|c| c != call);
                self.messages.push(ChatMessage::Tool {
                    call: *call,
                    text: text.clone(),
                });
            }
            Record::TurnEnd { turn, .. } => {
                self.answer_interrupted();
                self.turns = self.turns.max(*turn);
            }
        }
    }

    /// Calls left unanswered by a turn that stopped are shown to the model as interrupted.
    fn answer_interrupted(&mut self) {
        for call in std::mem::take(&mut self.unanswered) {
            self.messages.push(ChatMessage::Tool {
                call,
                text: INTERRUPTED.to_string(),
            });
        }
    }

    pub fn id(&self) -> &SessionId {
        &self.id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The inferproxy slot the session was created with.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// The conversation so far, as the model is shown it.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// The next unused call id: one more than the largest in the log.
    pub fn next_call(&self) -> CallId {
        CallId(self.next_call)
    }

    /// The highest turn number in the log (0 for a new session).
    pub fn turns(&self) -> u64 {
        self.turns
    }

    /// How many records the log holds.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The log's size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a recall brought `turn` of `session` into this session already.
    pub fn has_recalled(&self, session: &SessionId, turn: u64) -> bool {
        self.recalled.contains(&Recalled {
            session: session.clone(),
            turn,
        })
    }

    /// Whether the channel's message `key` was a turn of this session already.
    pub fn has_key(&self, key: &TurnKey) -> bool {
        self.keys.contains(key)
    }

    /// The session's size as tokens, estimated as bytes / 4.
    pub fn estimated_tokens(&self) -> u64 {
        self.bytes / 4
    }
}
