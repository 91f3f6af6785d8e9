//! Any text given to inferproxy's configuration parser is a configuration or an error that names
//! what is wrong, never a panic (see `common.rs`).
#![no_main]

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::config::<inferproxy::config::Config>(data));
