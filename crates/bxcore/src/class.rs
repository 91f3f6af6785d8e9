//! Data classes: how sensitive what a session has read is.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The class of data, ordered `Public < Private < Secret`: a session's taint is the highest class
/// it has read, and rises with `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataClass {
    Public,
    Private,
    Secret,
}

impl DataClass {
    /// The wire name: `public`, `private` or `secret`.
    pub fn as_str(self) -> &'static str {
        match self {
            DataClass::Public => "public",
            DataClass::Private => "private",
            DataClass::Secret => "secret",
        }
    }
}

impl fmt::Display for DataClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
