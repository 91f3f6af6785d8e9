//! `loopd serve | check | selftest --config FILE`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The agent loop: serves turns on loop.sock.
#[derive(Debug, Parser)]
#[command(name = "loopd", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve turns on loop.sock.
    Serve {
        #[arg(long)]
        config: PathBuf,
    },
    /// Check the configuration and the files it names; print what would be served.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// Check, then ask every socket loopd uses who answers (no model request).
    Selftest {
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    bxharden::log::init(loopd::daemon::SPEC.daemon);
    let code = match cli.command {
        Command::Serve { config } => return loopd::daemon::run_serve(&config),
        Command::Check { config } => loopd::daemon::run_selftest_check(&config, false),
        Command::Selftest { config } => loopd::daemon::run_selftest_check(&config, true),
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
