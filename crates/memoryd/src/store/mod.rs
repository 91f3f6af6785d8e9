//! The store interface: where a decided turn goes, and how it is read back.
//!
//! memoryd files every turn through one [`Store`] per kind of memory: the embedded store
//! ([`local::LocalStore`], SQLite with FTS5 under `<home>/memory/local/`) always, and a remote
//! store (Honcho) when one is configured. [`Stores`] holds both and is the one place that decides
//! which store a route goes to, so the two rules that no store may break are kept once:
//!
//! - a turn routed `local`, or filed while its session was `secret`, goes to the local store
//!   only, never to a remote one (no secret text leaves the device);
//! - a recall for a session that is `secret` (or whose state is unknown) asks the local store
//!   only, since the query itself is the session's text.
//!
//! # What a store implements
//!
//! - [`Store::file`]: file one turn under its route, durably, before returning `Ok`.
//!   **Idempotent by `(session, turn)`**: memoryd files at least once (a crash between a
//!   store's `Ok` and the outbox delete files the turn again), so filing a turn the store holds
//!   already returns `Ok` and changes nothing. A remote store keeps the box session and turn in
//!   each message's metadata and looks before it writes. An `Err` leaves the turn in the
//!   outbox, retried with backoff.
//! - [`Store::recall`]: text from **main memory only** (never quarantine, never local), most
//!   relevant first, at most `max_tokens` (bytes / 4) in all. memoryd cuts the answer to the
//!   budget again, so a store may return a little more.
//! - [`Store::recent`]: the latest turns filed under one route (or every route), newest first.
//! - [`Store::search`]: the owner's search over every route, best match first.
//! - [`Store::forget`]: delete every turn of one box session. A store that deletes later (Honcho
//!   queues session deletion) hides the session from every answer at once and says so with
//!   [`Forgotten::queued`].
//! - [`Store::describe`]: one line for `bxctl status` and the startup notice (never a key).
//!
//! Every method is blocking and bounded in time by the store itself (a remote store has its own
//! request timeout); memoryd calls it from its filer thread and from connection threads at once,
//! so a store is `Send + Sync`. Errors are [`StoreError`]: which store, what failed, and whether
//! retrying can help.

pub mod honcho;
pub mod local;

use bxcore::{DataClass, Label, Memory, MemoryRoute, SessionId, Timestamp, TurnRecord};

pub use self::honcho::HonchoStore;
pub use local::{Bounds, LocalStore};

/// The runbook entry of a store that cannot file or answer.
pub const STORE_ANCHOR: &str = "memory-store-failed";

/// One turn, decided: what to file, where, and the session's state that decided it.
#[derive(Debug, Clone, Copy)]
pub struct Filing<'a> {
    pub record: &'a TurnRecord,
    pub route: MemoryRoute,
    pub state: Label,
    /// When memoryd acknowledged the record (`turn_filed`): the turn's time in every answer.
    pub received: Timestamp,
}

/// What a `forget` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Turns deleted, or hidden and queued for deletion.
    pub turns: u64,
    /// The store deletes them later; they are hidden from every answer now.
    pub queued: bool,
}

/// Why a store did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or did not answer in time: retry later.
    #[error("the {store} store is unavailable: {why}")]
    Unavailable { store: &'static str, why: String },
    /// The store answered, but its data or answer is not what it must be (a damaged file, a
    /// malformed reply): the owner must look.
    #[error("the {store} store failed: {why}")]
    Failed { store: &'static str, why: String },
    /// The Honcho store: the client's own error, which knows its runbook entry
    /// (`honcho-unavailable`, `honcho-auth`, ...).
    #[error("the Honcho store: {0}")]
    Honcho(#[from] ::honcho::Error),
    /// The embedded store is at `[limits] max_store_bytes`: the turn waits in the outbox.
    #[error(
        "the {store} store holds {used} bytes, at its bound of {max} ([limits] \
         max_store_bytes); the turn waits in the outbox"
    )]
    Full {
        store: &'static str,
        used: u64,
        max: u64,
    },
}

/// The runbook entry of a store at its bound.
pub const FULL_ANCHOR: &str = "memory-store-full";

impl bxcore::runbook::Anchored for StoreError {
    fn anchor(&self) -> &str {
        match self {
            StoreError::Honcho(e) => e.anchor(),
            StoreError::Full { .. } => FULL_ANCHOR,
            _ => STORE_ANCHOR,
        }
    }
    fn code(&self) -> bxcore::ErrorCode {
        bxcore::ErrorCode::Unavailable
    }
}

/// A place turns are filed into and read back from. See the module documentation for the
/// contract of each method.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// One line: what and where (never a key).
    fn describe(&self) -> String;
    /// File one turn durably; `Ok` for a turn filed before (idempotent by `(session, turn)`).
    fn file(&self, filing: &Filing<'_>) -> Result<(), StoreError>;
    /// Main memory only, most relevant to `query` first, about `max_tokens` in all.
    fn recall(&self, query: &str, max_tokens: u32) -> Result<Vec<Memory>, StoreError>;
    /// The latest `limit` turns of `route` (every route: `None`), newest first.
    fn recent(&self, route: Option<MemoryRoute>, limit: usize) -> Result<Vec<Memory>, StoreError>;
    /// The `limit` best matches of `query` over every route.
    fn search(&self, query: &str, limit: usize) -> Result<Vec<Memory>, StoreError>;
    /// Delete (or hide and queue the deletion of) every turn of `session`.
    fn forget(&self, session: &SessionId) -> Result<Forgotten, StoreError>;
    /// Whether the store answers now, asked with a question that changes nothing (for
    /// `bxctl status`): what answered.
    fn probe(&self) -> Result<String, StoreError> {
        Ok(self.describe())
    }
}

/// The stores of one memoryd: the local one always, a remote one when configured.
#[derive(Debug)]
pub struct Stores {
    local: Box<dyn Store>,
    remote: Option<Box<dyn Store>>,
}

impl Stores {
    /// The local store alone: every route files into it.
    pub fn local(local: Box<dyn Store>) -> Stores {
        Stores {
            local,
            remote: None,
        }
    }

    /// The local store for `local` routes and secret sessions, `remote` for the rest.
    pub fn with_remote(local: Box<dyn Store>, remote: Box<dyn Store>) -> Stores {
        Stores {
            local,
            remote: Some(remote),
        }
    }

    /// The store a filing goes to: local for the `local` route and for any secret session,
    /// whatever the route says; the remote one (if any) for the rest.
    fn for_filing(&self, filing: &Filing<'_>) -> &dyn Store {
        match (&self.remote, filing.route, filing.state.class) {
            (_, MemoryRoute::Local, _) | (_, _, DataClass::Secret) | (None, _, _) => &*self.local,
            (Some(remote), _, _) => &**remote,
        }
    }

    /// One line for status: the local store, and the remote one if any.
    pub fn describe(&self) -> String {
        match &self.remote {
            None => self.local.describe(),
            Some(r) => format!("{}; local turns in {}", r.describe(), self.local.describe()),
        }
    }

    pub fn file(&self, filing: &Filing<'_>) -> Result<(), StoreError> {
        self.for_filing(filing).file(filing)
    }

    /// The remote store's health, when one is configured: it is asked now.
    pub fn probe_remote(&self) -> Option<bxcore::RemoteHealth> {
        use bxcore::runbook::Anchored;
        self.remote.as_ref().map(|r| match r.probe() {
            Ok(what) => bxcore::RemoteHealth {
                reachable: true,
                detail: format!("{what} answers"),
            },
            Err(e) => bxcore::RemoteHealth {
                reachable: false,
                detail: e.pointed().to_string(),
            },
        })
    }

    /// Recall for `session` in `state` (`None`: unknown, treated as secret): main memory only,
    /// and never the session's own turns, which its context holds already.
    pub fn recall(
        &self,
        session: &SessionId,
        state: Option<Label>,
        query: &str,
        max_tokens: u32,
    ) -> Result<Vec<Memory>, StoreError> {
        let secret = state.is_none_or(|s| s.class == DataClass::Secret);
        let store: &dyn Store = match (&self.remote, secret) {
            (Some(remote), false) => &**remote,
            _ => &*self.local,
        };
        let mut memories = store.recall(query, max_tokens)?;
        memories.retain(|m| m.route == MemoryRoute::Main && m.session != *session);
        Ok(within_tokens(memories, max_tokens))
    }

    pub fn recent(
        &self,
        route: Option<MemoryRoute>,
        limit: usize,
    ) -> Result<Vec<Memory>, StoreError> {
        let mut all = self.local.recent(route, limit)?;
        if let Some(remote) = &self.remote {
            if route != Some(MemoryRoute::Local) {
                all.extend(remote.recent(route, limit)?);
            }
        }
        all.sort_by(|a, b| {
            b.filed
                .cmp(&a.filed)
                .then_with(|| b.session.as_str().cmp(a.session.as_str()))
                .then(b.turn.cmp(&a.turn))
        });
        all.truncate(limit);
        Ok(all)
    }

    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<Memory>, StoreError> {
        let mut all = self.local.search(query, limit)?;
        if let Some(remote) = &self.remote {
            all.extend(remote.search(query, limit)?);
        }
        all.truncate(limit);
        Ok(all)
    }

    pub fn forget(&self, session: &SessionId) -> Result<Forgotten, StoreError> {
        let mut done = self.local.forget(session)?;
        if let Some(remote) = &self.remote {
            let r = remote.forget(session)?;
            done.turns += r.turns;
            done.queued |= r.queued;
        }
        Ok(done)
    }
}

/// The memories, in order, that fit in `max_tokens` (bytes / 4); the one that crosses the
/// budget is cut at a character boundary, and the rest are left out.
pub fn within_tokens(memories: Vec<Memory>, max_tokens: u32) -> Vec<Memory> {
    let mut left = max_tokens as usize * 4;
    let mut out = Vec::new();
    for mut m in memories {
        if left == 0 {
            break;
        }
        if m.text.len() > left {
            let mut cut = left;
            while !m.text.is_char_boundary(cut) {
                cut -= 1;
            }
            m.text.truncate(cut);
        }
        left -= m.text.len();
        if !m.text.is_empty() {
            out.push(m);
        }
    }
    out
}

/// The words of `text` a full-text query looks for: runs of letters and digits, lowercased,
/// at most `max` of them, duplicates dropped. Empty when the text has none.
pub fn words(text: &str, max: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let w = w.to_lowercase();
        if !out.contains(&w) {
            out.push(w);
            if out.len() == max {
                break;
            }
        }
    }
    out
}

/// The text a turn is remembered by: its user and assistant messages, one per line, each named
/// by its role (tool calls and results are left out: what the owner and the model said is the
/// memory; what a tool returned is in the session log).
pub fn turn_text(record: &TurnRecord) -> String {
    let mut out = String::new();
    for m in &record.messages {
        let (who, text) = match m {
            bxcore::ChatMessage::User { text } => ("user", text),
            bxcore::ChatMessage::Assistant { text, .. } => ("assistant", text),
            _ => continue,
        };
        if text.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(who);
        out.push_str(": ");
        out.push_str(text);
    }
    out
}
