//! `loopd serve | check | selftest --config FILE`.

use std::path::PathBuf;
use std::process::ExitCode;

use bxharden::daemon::{Args, Body, Cli, Cmd, Command, More};
use loopd::daemon::{SPEC, USAGE};

/// loopd's own command beside `serve` and `check`: `selftest --config FILE`.
#[derive(Debug)]
struct Selftest {
    config: PathBuf,
}

impl More for Selftest {
    const COMMANDS: &'static [Cmd] = &[Cmd {
        name: "selftest",
        about: "Check, then ask every socket loopd uses who answers (no model request)",
        body: Body::Options(&["config"]),
    }];

    fn from_args(args: &Args) -> Result<Self, String> {
        Ok(Selftest {
            config: args.path_of("config"),
        })
    }
}

fn main() -> ExitCode {
    let command = Cli::<Selftest>::parse(SPEC.daemon, &USAGE);
    bxharden::log::init(SPEC.daemon);
    let code = match command {
        Command::Serve { config } => return loopd::daemon::run_serve(&config),
        Command::Check { config } => loopd::daemon::run_selftest_check(&config, false),
        Command::More(Selftest { config }) => loopd::daemon::run_selftest_check(&config, true),
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
