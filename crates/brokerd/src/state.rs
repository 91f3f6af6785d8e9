//! The state store: one file per session, `<home>/broker/sessions/<id>.json`, holding what the
//! session has read (`policy::SessionState`). A missing file is the default (nothing read yet);
//! a file that exists and cannot be read is an error, never the default, so damage can only make
//! the broker refuse, never forget a taint.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use bxcore::SessionId;

use crate::policy::SessionState;

/// The runbook anchor of a state file that cannot be read or written.
pub const STATE_ANCHOR: &str = "broker-state-damaged";

/// A state file that exists and cannot be read or parsed, or a state that could not be written.
#[derive(Debug)]
pub struct StateError {
    pub path: PathBuf,
    pub why: String,
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}; {}",
            self.path.display(),
            self.why,
            bxcore::runbook::pointer(STATE_ANCHOR)
        )
    }
}

impl std::error::Error for StateError {}

/// The session state files in one directory.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    pub fn new(dir: &Path) -> StateStore {
        StateStore {
            dir: dir.to_path_buf(),
        }
    }

    /// The file of `session`. A `SessionId` cannot hold `/` or `..`, so this stays in the dir.
    pub fn path(&self, session: &SessionId) -> PathBuf {
        self.dir.join(format!("{}.json", session.as_str()))
    }

    /// The session's state: the default when it has no file. Reads only; never writes.
    pub fn read(&self, session: &SessionId) -> Result<SessionState, StateError> {
        let path = self.path(session);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(SessionState::default()),
            Err(e) => {
                return Err(StateError {
                    path,
                    why: format!("cannot be read: {e}"),
                });
            }
        };
        serde_json::from_str(&text).map_err(|e| StateError {
            path,
            why: format!("is not a session state: {e}"),
        })
    }

    /// Replace the session's state atomically: a temporary file in the same directory, fsync,
    /// rename, fsync the directory. A reader sees the old state or the new one, whole.
    pub fn write(&self, session: &SessionId, state: &SessionState) -> Result<(), StateError> {
        let path = self.path(session);
        let fail = |what: &str, e: io::Error| StateError {
            path: path.clone(),
            why: format!("cannot be written ({what}): {e}"),
        };
        let tmp = self.dir.join(format!(".{}.json.tmp", session.as_str()));
        let body = serde_json::to_vec(state).map_err(|e| fail("encode", io::Error::other(e)))?;
        let mut f = File::create(&tmp).map_err(|e| fail("create", e))?;
        f.write_all(&body).map_err(|e| fail("write", e))?;
        f.sync_all().map_err(|e| fail("fsync", e))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(|e| fail("rename", e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| fail("fsync the directory", e))
    }
}
