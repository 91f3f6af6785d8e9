//! Names of workspaces, peers and sessions, checked before they are put in a URL path: Honcho
//! takes 1 to 512 of `A-Z a-z 0-9 _ -`, and answers a malformed name in a path with a 500 rather
//! than a refusal, so the client never sends one.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A workspace, peer or session name Honcho accepts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Id(String);

/// Why a string cannot be a Honcho name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("a Honcho name is 1 to {max} characters, not {0}", max = Id::MAX_LEN)]
    Length(usize),
    #[error("a Honcho name holds only letters, digits, '_' and '-', not {0:?}")]
    Char(char),
}

impl Id {
    /// The longest name Honcho takes.
    pub const MAX_LEN: usize = 512;

    /// Check `s`.
    pub fn new(s: impl Into<String>) -> Result<Id, IdError> {
        let s = s.into();
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(IdError::Char(c));
        }
        if s.is_empty() || s.len() > Self::MAX_LEN {
            return Err(IdError::Length(s.len()));
        }
        Ok(Id(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Id {
    type Error = IdError;
    fn try_from(s: String) -> Result<Id, IdError> {
        Id::new(s)
    }
}

impl From<Id> for String {
    fn from(id: Id) -> String {
        id.0
    }
}

/// A box session's id is always a valid Honcho name (1 to 64 of the same characters).
impl From<&bxcore::SessionId> for Id {
    fn from(s: &bxcore::SessionId) -> Id {
        Id(s.as_str().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_a_dot_slash_or_space_is_refused() {
        for bad in ["bad.name", "a/b", "a b", "", "é"] {
            assert!(Id::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Id::new("x".repeat(513)), Err(IdError::Length(513)));
        assert_eq!(Id::new("box-main_1").unwrap().as_str(), "box-main_1");
    }

    #[test]
    fn every_box_session_id_is_a_honcho_name() {
        let s = bxcore::SessionId::new("A-z_09").unwrap();
        assert_eq!(Id::from(&s), Id::new("A-z_09").unwrap());
    }
}
