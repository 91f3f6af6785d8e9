//! `loopd serve | check | selftest --config FILE`.

use std::path::PathBuf;
use std::process::ExitCode;

use bxharden::daemon::{Cli, Command};
use loopd::daemon::{SPEC, USAGE};

/// loopd's own command beside `serve` and `check`.
#[derive(Debug, clap::Subcommand)]
enum More {
    /// Check, then ask every socket loopd uses who answers (no model request).
    Selftest {
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let command = Cli::<More>::parse(SPEC, &USAGE);
    bxharden::log::init(SPEC.daemon);
    let code = match command {
        Command::Serve { config } => return loopd::daemon::run_serve(&config),
        Command::Check { config } => loopd::daemon::run_selftest_check(&config, false),
        Command::More(More::Selftest { config }) => {
            loopd::daemon::run_selftest_check(&config, true)
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
