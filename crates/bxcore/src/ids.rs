//! Ids and timestamps. Each id validates when it is made and when it is deserialized, so an id
//! that reached daemon code is safe to use as a file name.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// A session id is 1 to 64 characters.
    #[error("a session id is 1 to 64 characters, not {0}")]
    SessionLength(usize),
    /// A session id holds only `A-Z a-z 0-9 _ -`.
    #[error("a session id holds only letters, digits, '_' and '-', not {0:?}")]
    SessionChar(char),
    /// An approval id is 16 lowercase hex digits.
    #[error("an approval id is 16 lowercase hex digits, not {0:?}")]
    Approval(String),
    /// A lease id is 16 lowercase hex digits.
    #[error("a lease id is 16 lowercase hex digits, not {0:?}")]
    Lease(String),
    /// A turn key is 1 to 255 printable ASCII characters, no space.
    #[error("a turn key is 1 to 255 printable ASCII characters without a space, not {0:?}")]
    TurnKey(String),
}

/// A session's name: 1 to 64 of `A-Z a-z 0-9 _ -`. It names files on disk
/// (`sessions/<id>.jsonl`), so a path, `..`, a space or an empty string can never be one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SessionId(String);

impl SessionId {
    /// The longest session id, in bytes.
    pub const MAX_LEN: usize = 64;

    /// Validate `s` as a session id.
    pub fn new(s: impl Into<String>) -> Result<SessionId, IdError> {
        let s = s.into();
        // Characters, not bytes: a non-ASCII letter is refused by name, never cut in half.
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(IdError::SessionChar(c));
        }
        if s.is_empty() || s.len() > Self::MAX_LEN {
            return Err(IdError::SessionLength(s.len()));
        }
        Ok(SessionId(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SessionId {
    type Error = IdError;
    fn try_from(s: String) -> Result<SessionId, IdError> {
        SessionId::new(s)
    }
}

impl From<SessionId> for String {
    fn from(id: SessionId) -> String {
        id.0
    }
}

impl std::str::FromStr for SessionId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<SessionId, IdError> {
        SessionId::new(s)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a channel names one of the owner's messages by (a Matrix event id): loopd keeps it with
/// the turn it started, so the same message handed off twice (a channel that crashed between
/// handing it off and remembering that it did) is never a second turn. 1 to 255 of the
/// printable ASCII characters, no space: a Matrix event id's own bounds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TurnKey(String);

impl TurnKey {
    /// The longest key, in bytes.
    pub const MAX_LEN: usize = 255;

    /// Validate `s` as a turn key.
    pub fn new(s: impl Into<String>) -> Result<TurnKey, IdError> {
        let s = s.into();
        let ok =
            !s.is_empty() && s.len() <= Self::MAX_LEN && s.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(TurnKey(s))
        } else {
            Err(IdError::TurnKey(s.chars().take(64).collect()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TurnKey {
    type Error = IdError;
    fn try_from(s: String) -> Result<TurnKey, IdError> {
        TurnKey::new(s)
    }
}

impl From<TurnKey> for String {
    fn from(k: TurnKey) -> String {
        k.0
    }
}

impl fmt::Display for TurnKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The loop's number for one tool call, unique within its session. A tool request's envelope id
/// is its call id.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct CallId(pub u64);

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An id of 16 lowercase hex digits from the kernel's random source: the owner can type it,
/// and nobody can guess the next one.
macro_rules! random_hex_id {
    ($(#[$doc:meta])* $name:ident, $error:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// A fresh random id.
            ///
            /// # Panics
            ///
            /// If the kernel's random source fails, which on Linux (getrandom(2), after boot)
            /// it does not; a box that cannot draw random numbers must not hand out guessable
            /// ids.
            pub fn random() -> $name {
                let mut bytes = [0u8; 8];
                getrandom::fill(&mut bytes).expect("the kernel's random source failed");
                let mut s = String::with_capacity(16);
                for b in bytes {
                    s.push_str(&format!("{b:02x}"));
                }
                $name(s)
            }

            /// Validate `s` as such an id.
            pub fn new(s: impl Into<String>) -> Result<$name, IdError> {
                let s = s.into();
                let ok =
                    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
                if ok { Ok($name(s)) } else { Err(IdError::$error(s)) }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<$name, IdError> {
                $name::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<$name, IdError> {
                $name::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

random_hex_id!(
    /// A pending approval's id.
    ApprovalId,
    Approval
);

random_hex_id!(
    /// A lease's id: the owner's "allow for this session", revoked by it.
    LeaseId,
    Lease
);

/// Milliseconds since the Unix epoch.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The wall clock now. A clock before 1970 reads as 0.
    pub fn now() -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis();
        Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    pub fn unix_millis(self) -> u64 {
        self.0
    }

    /// `self + ms`, saturating.
    pub fn plus_millis(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }

    /// RFC 3339 in UTC with milliseconds, `YYYY-MM-DDTHH:MM:SS.mmmZ` (proleptic Gregorian): the
    /// one way the box writes a time for a person (log lines, `audit tail`, `time_now`).
    pub fn utc_text(self) -> String {
        let ms = self.0;
        let secs = ms / 1000;
        let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
        let rem = secs % 86_400;
        // Howard Hinnant's days-to-civil.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
            rem / 3600,
            rem / 60 % 60,
            rem % 60,
            ms % 1000
        )
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
