//! bxctl: the owner's command. It talks to the box only through its sockets, with the same
//! protocol as everything else (`bxcore`), so it can do nothing the owner's socket permissions do
//! not allow. Each subcommand is one module and ends with one result (`done`); `cli` parses the
//! command line, picks the box (`target`) and maps how a subcommand ended to its exit code: 0
//! done, 1 refused or failed, 2 usage, 130 a chat turn the owner cancelled.
//!
//! The floors, each using only those below it: `cli`, then the dev box and the demo (`dev`,
//! `demo`, behind the `devbox` feature: the device build has neither), then the commands
//! (`chat`, `approvals`, `audit`, `memory`, `channel`, `status`, `selftest`, `check`, `logs`),
//! then what they share (`target`, `health`, `model`, `output`, `done`, ...). No command knows
//! whether its box is a device or a dev box: it asks the [`target::Target`].

pub mod approvals;
pub mod audit;
pub mod channel;
pub mod chat;
pub mod check;
pub mod cli;
pub mod context;
#[cfg(feature = "devbox")]
pub mod demo;
#[cfg(feature = "devbox")]
pub mod dev;
pub mod done;
pub mod health;
pub mod in_flight;
pub mod logs;
pub mod marks;
pub mod memory;
pub mod model;
pub mod ondemand;
pub mod output;
pub mod procfs;
pub mod prompt;
pub mod selftest;
pub mod status;
pub mod target;
pub mod thread_ids;
pub mod tools;

pub use done::{Done, Ended, Failure};
