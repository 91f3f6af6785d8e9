//! What the commands that talk to brokerd's admin socket share: the home, the socket, the output
//! style and the deadline. Its own module so the commands depend on it and not on the command
//! line that builds it (`cli` uses the commands; they do not use `cli`).

use std::path::PathBuf;
use std::time::Duration;

/// What the approval and audit commands need to know.
#[derive(Debug, Clone)]
pub struct Context {
    pub home: PathBuf,
    pub admin: PathBuf,
    pub json: bool,
    pub timeout: Duration,
}
