//! loopd, the agent loop: it serves turns to channels on loop.sock, keeps each session as an
//! append-only log, asks inferproxy for the model's replies and brokerd for every tool call, and
//! hands finished turns to memoryd.
//!
//! loopd reads the model's output and so is the daemon most exposed to it: it holds no secrets,
//! runs no tool itself beyond two harmless core tools, and reaches only its own directory and its
//! client sockets.

pub mod baseline;
pub mod broker_port;
pub mod cancel;
pub mod channel;
pub mod config;
pub mod control;
pub mod daemon;
pub mod health;
pub mod infer;
pub mod monitor;
pub mod outbox;
pub mod prompt;
pub mod recall;
pub mod session;
pub mod tools;
pub mod turn;
pub mod worker;
