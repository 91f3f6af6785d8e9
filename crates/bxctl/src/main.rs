//! `bxctl`: exit 0 done, 1 refused or failed, 2 usage.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // A reader that goes away (`bxctl approvals | head -1`) ends bxctl as it ends any Unix
    // tool, by SIGPIPE, not by a panic with a backtrace: Rust starts programs with SIGPIPE
    // ignored, which turns every later print into an error.
    // SAFETY: restoring a signal's default action before any thread exists.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
    bxctl::cli::run(bxctl::cli::Cli::parse())
}
