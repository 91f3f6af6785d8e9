//! bxctl: the owner's command. It talks to the box only through its sockets, with the same
//! protocol as everything else (`bxcore`), so it can do nothing the owner's socket permissions do
//! not allow.

pub mod chat;
pub mod cli;
pub mod demo;
pub mod dev;
pub mod procfs;
pub mod selftest;
pub mod status;
pub mod target;
