//! bxctl: the owner's command. It talks to the box only through its sockets, with the same
//! protocol as everything else (`bxcore`), so it can do nothing the owner's socket permissions do
//! not allow. Each subcommand is one module; `cli` parses the command line and maps outcomes to
//! exit codes: 0 done, 1 refused or failed, 2 usage.

pub mod approvals;
pub mod audit;
pub mod channel;
pub mod chat;
pub mod check;
pub mod cli;
pub mod context;
#[cfg(feature = "devbox")]
pub mod demo;
pub mod dev;
pub mod in_flight;
pub mod logs;
pub mod memory;
pub mod model;
pub mod ondemand;
pub mod output;
pub mod peer;
pub mod procfs;
pub mod prompt;
pub mod selftest;
pub mod status;
pub mod target;
pub mod thread_ids;

/// How a subcommand ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Refused or failed; the reason was printed.
    Failed,
}
