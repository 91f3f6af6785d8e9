//! The sessions the owner forgot, `<home>/memory/forgotten.json`: a forgotten session stays
//! forgotten. A turn of it that still waits elsewhere (in loopd's own outbox while memoryd was
//! down, or on its way when the owner ran `bxctl memory forget`) is answered `turn_filed`, so
//! its sender lets go of it, and filed nowhere.
//!
//! The list is written durably (`bxcore::durable::replace`) before the forget is answered, and
//! read at start; one that does not parse stops memoryd rather than let a forgotten session be
//! filed again. It holds [`MAX_FORGOTTEN`] sessions, the oldest forgotten first out: a turn
//! waits in loopd's outbox for hours at most, not for thousands of forgets.

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use bxcore::runbook::Anchored;
use bxcore::{ErrorCode, SessionId};
use serde::{Deserialize, Serialize};

/// The most sessions the list holds.
pub const MAX_FORGOTTEN: usize = 4096;
/// The runbook entry of a list that cannot be read or written.
pub const FORGOTTEN_ANCHOR: &str = "memoryd-forgotten-unreadable";

/// Why the list could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ForgottenError {
    #[error("{}: cannot be read: {error}", path.display())]
    Read { path: PathBuf, error: io::Error },
    #[error("{}: is not the list of forgotten sessions memoryd writes: {error}", path.display())]
    Damaged { path: PathBuf, error: String },
    #[error("{}: the forget was not recorded: {error}", path.display())]
    Write {
        path: PathBuf,
        error: bxcore::durable::WriteError,
    },
}

impl Anchored for ForgottenError {
    fn anchor(&self) -> &str {
        FORGOTTEN_ANCHOR
    }
    fn code(&self) -> ErrorCode {
        ErrorCode::Unavailable
    }
}

/// The file's shape.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    v: u32,
    /// Oldest forgotten first.
    sessions: VecDeque<SessionId>,
}

/// The list, and the lock a turn is taken under (see [`Forgotten::unless_forgotten`]).
#[derive(Debug)]
pub struct Forgotten {
    path: PathBuf,
    sessions: Mutex<VecDeque<SessionId>>,
}

impl Forgotten {
    /// The list in `dir` (`forgotten.json`), empty when there is none yet.
    pub fn open(dir: &Path) -> Result<Forgotten, ForgottenError> {
        let path = dir.join("forgotten.json");
        let sessions = match fs::read(&path) {
            Ok(bytes) => {
                let damaged = |error: String| ForgottenError::Damaged {
                    path: path.clone(),
                    error,
                };
                let f: File = serde_json::from_slice(&bytes).map_err(|e| damaged(e.to_string()))?;
                if f.v != 1 || f.sessions.len() > MAX_FORGOTTEN {
                    return Err(damaged(format!(
                        "version {} with {} sessions (version 1, at most {MAX_FORGOTTEN})",
                        f.v,
                        f.sessions.len()
                    )));
                }
                f.sessions
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => VecDeque::new(),
            Err(error) => return Err(ForgottenError::Read { path, error }),
        };
        Ok(Forgotten {
            path,
            sessions: Mutex::new(sessions),
        })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<SessionId>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the owner forgot `session`.
    pub fn contains(&self, session: &SessionId) -> bool {
        self.lock().contains(session)
    }

    /// Record `session` as forgotten, durably, before the caller forgets what is filed: a turn
    /// taken from then on is not filed, and one taken before is in the outbox the forget clears.
    pub fn add(&self, session: &SessionId) -> Result<(), ForgottenError> {
        let mut sessions = self.lock();
        if sessions.contains(session) {
            return Ok(());
        }
        let mut next = sessions.clone();
        if next.len() == MAX_FORGOTTEN {
            next.pop_front();
        }
        next.push_back(session.clone());
        let body = serde_json::to_vec(&File {
            v: 1,
            sessions: next.clone(),
        })
        .map_err(|e| ForgottenError::Damaged {
            path: self.path.clone(),
            error: e.to_string(),
        })?;
        bxcore::durable::replace(&self.path, &body).map_err(|error| ForgottenError::Write {
            path: self.path.clone(),
            error,
        })?;
        *sessions = next;
        Ok(())
    }

    /// Run `take` for a turn of `session` unless the owner forgot it, under the list's lock:
    /// a forget cannot fall between the check and the turn's taking. `None`: forgotten.
    pub fn unless_forgotten<T>(&self, session: &SessionId, take: impl FnOnce() -> T) -> Option<T> {
        let sessions = self.lock();
        if sessions.contains(session) {
            return None;
        }
        let taken = take();
        drop(sessions);
        Some(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SessionId {
        SessionId::new(s).unwrap()
    }

    #[test]
    fn a_forgotten_session_is_still_forgotten_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let f = Forgotten::open(dir.path()).unwrap();
        assert!(!f.contains(&id("s1")));
        f.add(&id("s1")).unwrap();
        f.add(&id("s1")).unwrap();
        let again = Forgotten::open(dir.path()).unwrap();
        assert!(again.contains(&id("s1")));
        assert!(!again.contains(&id("s2")));
        assert_eq!(again.unless_forgotten(&id("s1"), || 1), None);
        assert_eq!(again.unless_forgotten(&id("s2"), || 2), Some(2));
    }

    #[test]
    fn the_list_keeps_the_newest_forgets_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let f = Forgotten::open(dir.path()).unwrap();
        for i in 0..=MAX_FORGOTTEN {
            f.add(&id(&format!("s{i}"))).unwrap();
        }
        let again = Forgotten::open(dir.path()).unwrap();
        assert!(!again.contains(&id("s0")), "the oldest is out");
        assert!(again.contains(&id("s1")));
        assert!(again.contains(&id(&format!("s{MAX_FORGOTTEN}"))));
    }

    #[test]
    fn a_list_that_does_not_parse_stops_the_start_and_says_where() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("forgotten.json"),
            b"{\"v\":1,\"sessions\":[\"s1\"",
        )
        .unwrap();
        let e = Forgotten::open(dir.path()).unwrap_err();
        assert!(matches!(e, ForgottenError::Damaged { .. }), "{e}");
        assert!(e.to_string().contains("forgotten.json"), "{e}");
        assert_eq!(e.anchor(), FORGOTTEN_ANCHOR);
    }
}
