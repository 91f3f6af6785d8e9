//! What the commands that talk to a daemon share: the home, the socket, the output style and
//! the deadline. Its own module so the commands depend on it and not on the command line that
//! builds it (`cli` uses the commands; they do not use `cli`).

use std::path::PathBuf;
use std::time::Duration;

use bxcore::client::ClientError;

use crate::done::Failure;
use crate::output::{Asked, failed_at};

/// What the approval and audit commands need to know.
#[derive(Debug, Clone)]
pub struct Context {
    pub home: PathBuf,
    pub admin: PathBuf,
    pub json: bool,
    pub timeout: Duration,
}

/// What a command that asks one daemon on one of the owner's sockets needs to know (`bxctl
/// memory` asks memoryd on memories.sock, `bxctl channel` channeld on channel.sock).
#[derive(Debug, Clone)]
pub struct SocketContext {
    /// The daemon that serves it: `memoryd`.
    pub daemon: &'static str,
    pub socket: PathBuf,
    /// The flag that names another socket: `--memories`.
    pub flag: &'static str,
    pub json: bool,
    pub timeout: Duration,
}

impl SocketContext {
    /// The failed request `what` ([`failed_at`]).
    pub fn failed(&self, what: &str, e: &ClientError) -> Failure {
        let asked = Asked {
            daemon: self.daemon,
            socket: &self.socket,
            flag: self.flag,
        };
        failed_at(self.json, &asked, what, e)
    }
}
