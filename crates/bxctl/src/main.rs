//! `bxctl`: exit 0 done, 1 refused or failed, 2 usage.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    bxctl::cli::run(bxctl::cli::Cli::parse())
}
