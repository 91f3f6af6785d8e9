//! What channeld keeps across restarts, in one file replaced whole (`bxcore::durable::replace`:
//! write, fsync, rename, fsync the directory): `<home>/channel/state.json`.
//!
//! - `since`: the sync position from which nothing is left to hand to loopd. It moves only when
//!   every message before it has been handed off, so a restart resumes where nothing is lost.
//! - `seen`: the event ids of the messages handed off (the newest [`SEEN_MAX`]), so a message
//!   that a resumed sync brings again is never a second turn.
//! - `rooms`: each room's session, and whether loopd has it yet.
//! - `owners`: the Matrix ids paired as the owner (`bxctl channel pair`).
//! - `replies`: the answers being streamed, by room: after a crash they are marked as cut short.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The runbook anchor of a state file that cannot be read or written.
pub const STATE_ANCHOR: &str = "channel-state-damaged";

/// How many handed-off event ids are remembered.
pub const SEEN_MAX: usize = 2048;

/// The file's name in channeld's directory.
pub const FILE: &str = "state.json";

/// The whole state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct State {
    pub since: Option<String>,
    pub seen: VecDeque<String>,
    pub rooms: BTreeMap<String, RoomState>,
    pub owners: Vec<String>,
    pub replies: BTreeMap<String, String>,
}

/// One room's session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomState {
    pub session: String,
    /// Whether loopd has the session (a first turn created it).
    pub created: bool,
}

/// Why the state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{}: cannot read the channel's state: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: the channel's state does not parse: {why}", path.display())]
    Damaged { path: PathBuf, why: String },
    #[error("{}: the channel's state {source}", path.display())]
    Write {
        path: PathBuf,
        source: bxcore::durable::WriteError,
    },
}

impl bxcore::runbook::Anchored for StateError {
    fn anchor(&self) -> &str {
        STATE_ANCHOR
    }
}

impl State {
    /// The state in `dir`, or a new one when there is none.
    pub fn load(dir: &Path) -> Result<State, StateError> {
        let path = dir.join(FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| StateError::Damaged {
                path,
                why: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(source) => Err(StateError::Read { path, source }),
        }
    }

    /// Replace the file in `dir` with this state, durably.
    pub fn save(&self, dir: &Path) -> Result<(), StateError> {
        let path = dir.join(FILE);
        let body = serde_json::to_vec(self).unwrap_or_default();
        bxcore::durable::replace(&path, &body).map_err(|source| StateError::Write { path, source })
    }

    /// Whether the message `event` was handed off already.
    pub fn seen(&self, event: &str) -> bool {
        self.seen.iter().any(|e| e == event)
    }

    /// Remember `event` as handed off, forgetting the oldest past [`SEEN_MAX`].
    pub fn mark_seen(&mut self, event: &str) {
        if !self.seen(event) {
            self.seen.push_back(event.to_string());
        }
        while self.seen.len() > SEEN_MAX {
            self.seen.pop_front();
        }
    }
}

/// The session of `room`: `<prefix>` and 16 hex digits of the room id's sha256.
pub fn session_for(prefix: &str, room: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(room.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_survives_a_save_and_a_load() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(State::load(d.path()).unwrap(), State::default());
        let mut s = State {
            since: Some("s1_2".into()),
            ..State::default()
        };
        s.mark_seen("$a");
        s.mark_seen("$a");
        s.owners.push("@me:x".into());
        s.save(d.path()).unwrap();
        let back = State::load(d.path()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.seen.len(), 1);
    }

    #[test]
    fn seen_is_bounded() {
        let mut s = State::default();
        for i in 0..SEEN_MAX + 10 {
            s.mark_seen(&format!("${i}"));
        }
        assert_eq!(s.seen.len(), SEEN_MAX);
        assert!(!s.seen("$0"));
        assert!(s.seen(&format!("${}", SEEN_MAX + 9)));
    }

    #[test]
    fn a_room_has_a_session_of_the_prefix() {
        let s = session_for("matrix-", "!abc:localhost");
        assert!(s.starts_with("matrix-") && s.len() == 23, "{s}");
        assert!(bxcore::SessionId::new(s).is_ok());
    }

    #[test]
    fn a_damaged_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(FILE), "{not json").unwrap();
        assert!(matches!(
            State::load(d.path()),
            Err(StateError::Damaged { .. })
        ));
    }
}
