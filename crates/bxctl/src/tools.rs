//! `bxctl tools list` and `bxctl tools ask --server NAME`: the tools the broker offers, and what
//! a declared tool's server offers, as brokerd itself answers them (`brokerd tools list|ask` on
//! the box's brokerd.toml: the same configuration, the same confinement as a call;
//! `docs/tools.md`). What `ask` prints is for the owner to review and add to brokerd's
//! configuration (on the device, `services.boxmaker.settings.brokerd.declared_tools`).

use std::process::Command;

use crate::done::{Done, Ended, Failure};
use crate::target::{Target, find_daemon};

/// `brokerd tools <what> --config <the box's brokerd.toml> [--server NAME]`, its output passed on.
pub fn run(target: &dyn Target, what: &str, server: Option<&str>) -> Ended {
    let brokerd = find_daemon("brokerd").ok_or_else(|| {
        Failure::failed("bxctl: cannot find the brokerd executable beside bxctl or on PATH")
    })?;
    let mut cmd = Command::new(brokerd);
    cmd.args(["tools", what, "--config"])
        .arg(target.config("brokerd"));
    if let Some(s) = server {
        cmd.args(["--server", s]);
    }
    // Bounded by brokerd: `ask` starts the server under its deadline (at most five minutes).
    let out = cmd
        .output()
        .map_err(|e| Failure::failed(format!("bxctl: cannot run {:?}: {e}", cmd.get_program())))?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if out.status.success() {
        Ok(Done)
    } else {
        Err(Failure::failed(
            String::from_utf8_lossy(&out.stderr).trim_end().to_string(),
        ))
    }
}
