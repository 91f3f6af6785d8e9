//! The filer: memoryd's one background thread. It takes the outbox's records oldest first,
//! asks brokerd's state.sock for each session's `(class, untrusted)`, routes the turn by
//! `[[routes]]` and files it into its store; only then is the record removed.
//!
//! No turn is filed by a guess: a question brokerd does not answer (down, slow, an error frame,
//! a damaged state file) leaves the turn undecided in the outbox, logged once per outage with
//! the `broker-state-unavailable` pointer and retried with backoff; a store that fails likewise
//! (`memory-store-failed`). Records of one round are filed in order, and the first failure ends
//! the round, so a session's turns are filed in the order they were taken.
//!
//! The state asked is the session's state when the turn is filed, which is at least as strict as
//! its state when the turn ended (a session's taint and its untrusted mark only ever rise): a
//! delayed filing can only route a turn more carefully, never less.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::runbook::Anchored;
use bxcore::{Label, Message, SessionId, SessionQuery};

use crate::forgotten::Forgotten;
use crate::outbox::Outbox;
use crate::routes::Routes;
use crate::store::{Filing, StoreError, Stores};
use bxcore::TurnRecord;
use bxcore::queue::Entry;

/// The most records one round of the filer reads: at most `[limits] max_turn_bytes` each, so
/// the filer holds a bounded amount of memory however many turns wait.
pub const ROUND: usize = 16;

/// The runbook entry of a state question brokerd did not answer.
pub const STATE_ANCHOR: &str = "broker-state-unavailable";

/// Why brokerd gave no state.
#[derive(Debug, thiserror::Error)]
#[error("brokerd did not answer the state of session {session} on {}: {error}", socket.display())]
pub struct StateError {
    pub session: SessionId,
    pub socket: PathBuf,
    pub error: ClientError,
}

impl Anchored for StateError {
    fn anchor(&self) -> &str {
        STATE_ANCHOR
    }
    fn code(&self) -> bxcore::ErrorCode {
        bxcore::ErrorCode::Unavailable
    }
}

/// Ask brokerd on `socket` for `session`'s state, within `timeout`.
pub fn ask_state(
    socket: &Path,
    timeout: Duration,
    session: &SessionId,
) -> Result<Label, StateError> {
    let fail = |error| StateError {
        session: session.clone(),
        socket: socket.to_path_buf(),
        error,
    };
    let question = Message::SessionState(SessionQuery {
        session: session.clone(),
    });
    match client::call(socket, timeout, 1, question, |_| {}).map_err(fail)? {
        Message::SessionStateReply(reply) => Ok(reply),
        other => Err(fail(ClientError::Unexpected(other.kind()))),
    }
}

/// Why one record was not filed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot read or update the outbox {}: {error}", dir.display())]
    Outbox { dir: PathBuf, error: std::io::Error },
    #[error(transparent)]
    Queue(#[from] bxcore::queue::QueueError),
    #[error(transparent)]
    Forgotten(#[from] crate::forgotten::ForgottenError),
}

impl Anchored for FileError {
    fn anchor(&self) -> &str {
        match self {
            FileError::State(e) => e.anchor(),
            FileError::Store(e) => e.anchor(),
            FileError::Outbox { .. } => crate::outbox::UNWRITABLE_ANCHOR,
            FileError::Queue(e) => e.anchor(),
            FileError::Forgotten(e) => e.anchor(),
        }
    }
}

impl FileError {
    /// Which outage it is, so one line is logged per outage and not per attempt.
    fn outage(&self) -> &'static str {
        match self {
            FileError::State(_) => STATE_ANCHOR,
            FileError::Store(_) => crate::store::STORE_ANCHOR,
            FileError::Outbox { .. } | FileError::Queue(_) => crate::outbox::UNWRITABLE_ANCHOR,
            FileError::Forgotten(_) => crate::forgotten::FORGOTTEN_ANCHOR,
        }
    }
}

/// Everything the filer and the sockets share.
#[derive(Debug)]
pub struct Filer {
    pub outbox: Outbox,
    pub stores: Stores,
    pub routes: Routes,
    pub state_socket: PathBuf,
    pub state_timeout: Duration,
    /// Held while one record is filed and removed, and while a session is forgotten, so a
    /// forgotten session's turn cannot be filed again behind the owner's back.
    pub filing: Mutex<()>,
    /// The sessions the owner forgot, whose later turns are filed nowhere.
    pub forgotten: Forgotten,
    /// Why the oldest record waits, while it waits (for `bxctl status`).
    pub waiting: Mutex<Option<String>>,
}

impl Filer {
    /// File one record: ask, route, file, remove.
    pub fn file_one(&self, entry: &Entry<TurnRecord>) -> Result<(), FileError> {
        let record = &entry.record;
        let state = ask_state(&self.state_socket, self.state_timeout, &record.session)?;
        let route = self.routes.route(state);
        let _g = self.filing.lock().unwrap_or_else(|p| p.into_inner());
        if !self.outbox.holds(entry) {
            // Forgotten by the owner while brokerd was asked.
            return Ok(());
        }
        self.stores.file(&Filing {
            record,
            route,
            state,
            received: entry.received,
        })?;
        self.outbox.done(entry).map_err(|error| FileError::Outbox {
            dir: self.outbox.dir().to_path_buf(),
            error,
        })
    }

    /// One round: the [`ROUND`] oldest waiting records in order, until the first failure.
    /// What a round holds in memory is bounded by it, however deep the outbox.
    pub fn round(&self) -> Result<usize, FileError> {
        let entries = self.outbox.oldest(ROUND)?;
        for e in &entries {
            self.file_one(e)?;
        }
        Ok(entries.len())
    }

    /// The filer thread: forever, file what waits; on a failure wait with backoff (or until a
    /// new record comes) and try again. One line per outage, one when it ends.
    pub fn run(self: Arc<Self>, first: Duration, max: Duration) -> ! {
        let mut backoff = first;
        let mut outage: Option<&'static str> = None;
        loop {
            match self.round() {
                Ok(n) => {
                    if outage.take().is_some() {
                        bxharden::log::notice("files turns again");
                    }
                    *self.waiting.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    backoff = first;
                    // A full round may have left more behind it: the next round at once.
                    if n < ROUND {
                        self.outbox.wait(Duration::from_secs(60));
                    }
                }
                Err(e) => {
                    if outage != Some(e.outage()) {
                        bxharden::log::fail(&e);
                        outage = Some(e.outage());
                    }
                    *self.waiting.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(e.pointed().to_string());
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(max);
                }
            }
        }
    }

    /// Forget `session`: its waiting records and every turn the stores hold, and, recorded
    /// first, every turn of it still to come (`forgotten`).
    pub fn forget(&self, session: &SessionId) -> Result<crate::store::Forgotten, FileError> {
        self.forgotten.add(session)?;
        let _g = self.filing.lock().unwrap_or_else(|p| p.into_inner());
        let waiting = self
            .outbox
            .forget(session)
            .map_err(|error| FileError::Outbox {
                dir: self.outbox.dir().to_path_buf(),
                error,
            })?;
        let mut done = self.stores.forget(session)?;
        done.turns += waiting;
        Ok(done)
    }
}
