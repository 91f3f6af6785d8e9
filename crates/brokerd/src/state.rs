//! The state store: one file per session, `<home>/broker/sessions/<id>.json`, holding what the
//! session has read: its label (`bxcore::Label`), written `{"taint": "private", "untrusted":
//! false}` as the design fixes. A missing file is the default (nothing read yet);
//! a file that exists and cannot be read is an error, never the default, so damage can only make
//! the broker refuse, never forget a taint.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use bxcore::SessionId;
use bxcore::runbook::Anchored;

use bxcore::{DataClass, Label};
use serde::{Deserialize, Serialize};

/// A state file as it is on disk. `public` is never a valid taint: a session starts private and
/// only rises, so a file that says public is damaged.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    taint: DataClass,
    untrusted: bool,
}

/// The runbook anchor of a state file that cannot be read or written.
pub const STATE_ANCHOR: &str = "broker-state-damaged";

/// A state file that exists and cannot be read or parsed, or a state that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{}: {why}", path.display())]
pub struct StateError {
    pub path: PathBuf,
    pub why: String,
}

impl Anchored for StateError {
    fn anchor(&self) -> &str {
        STATE_ANCHOR
    }
}

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

    /// The session's label: [`Label::FRESH`] when it has no file. Reads only; never writes.
    pub fn read(&self, session: &SessionId) -> Result<Label, StateError> {
        let path = self.path(session);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Label::FRESH),
            Err(e) => {
                return Err(StateError {
                    path,
                    why: format!("cannot be read: {e}"),
                });
            }
        };
        let file: StateFile = serde_json::from_str(&text).map_err(|e| StateError {
            path: path.clone(),
            why: format!("is not a session state: {e}"),
        })?;
        if file.taint == DataClass::Public {
            return Err(StateError {
                path,
                why: "is not a session state: a taint of public is never valid: a session \
                      starts private and only rises"
                    .to_string(),
            });
        }
        Ok(Label::new(file.taint, file.untrusted))
    }

    /// Replace the session's state durably (`bxcore::durable`): a reader sees the old state or
    /// the new one, whole.
    pub fn write(&self, session: &SessionId, label: Label) -> Result<(), StateError> {
        let path = self.path(session);
        let file = StateFile {
            taint: label.class,
            untrusted: label.untrusted,
        };
        let body = serde_json::to_vec(&file).map_err(|e| StateError {
            path: path.clone(),
            why: format!("cannot be written (encode): {e}"),
        })?;
        bxcore::durable::replace(&path, &body).map_err(|e| StateError {
            why: e.to_string(),
            path,
        })
    }
}
