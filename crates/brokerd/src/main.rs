//! brokerd, as its table: `serve` takes the audit lock, verifies the chain, binds its four
//! sockets and serves; `check` says what it would serve; `audit verify` and `audit accept` look
//! after the chain; `tools list` and `tools ask` are what the owner declares tools from.

use std::path::PathBuf;
use std::process::ExitCode;

use brokerd::config::Config;
use brokerd::daemon::{self, CONFIG_ANCHOR};
use brokerd::ledger::chain::{self, OnBreak};
use brokerd::ledger::lock::AuditLock;
use bxcore::runbook::Anchored;
use bxharden::daemon::{Args, Body, Cmd, More, Running, Spec, Start, StartError, Table, Usage};
use bxharden::{Daemon, Profile};

/// brokerd's own commands beside `serve` and `check`: the audit chain, and the tools.
#[derive(Debug)]
enum Command {
    /// `audit verify --config FILE`.
    Verify { config: PathBuf },
    /// `audit accept --config FILE --at SEQ`.
    Accept { config: PathBuf, at: u64 },
    /// `tools list --config FILE`.
    ToolsList { config: PathBuf },
    /// `tools ask --config FILE --server NAME`.
    ToolsAsk { config: PathBuf, server: String },
}

impl More for Command {
    const COMMANDS: &'static [Cmd] = &[
        Cmd {
            name: "audit",
            about: "The audit chain",
            body: Body::Commands(&[
                Cmd {
                    name: "verify",
                    about: "Verify the whole chain: the number of records and the head hash; exit 1 on a break",
                    body: Body::Options(&["config"]),
                },
                Cmd {
                    name: "accept",
                    about: "Accept the break at SEQ, after looking at it, so that brokerd starts again",
                    body: Body::Options(&["config", "at"]),
                },
            ]),
        },
        Cmd {
            name: "tools",
            about: "The tools: those offered, and a declared tool's server asked what it offers",
            body: Body::Commands(&[
                Cmd {
                    name: "list",
                    about: "Every tool offered, built in or declared, with the label its results carry, its effect and its approval rule",
                    body: Body::Options(&["config"]),
                },
                Cmd {
                    name: "ask",
                    about: "Start the server NAME confined and print its tools as [[declared_tools]] entries that trust nothing, each with its digest, to review and add",
                    body: Body::Options(&["config", "server"]),
                },
            ]),
        },
    ];

    fn from_args(args: &Args) -> Result<Self, String> {
        match args.path() {
            ["audit", "verify"] => Ok(Command::Verify {
                config: args.path_of("config"),
            }),
            ["audit", "accept"] => Ok(Command::Accept {
                config: args.path_of("config"),
                at: args.parse("at")?,
            }),
            ["tools", "list"] => Ok(Command::ToolsList {
                config: args.path_of("config"),
            }),
            ["tools", "ask"] => Ok(Command::ToolsAsk {
                config: args.path_of("config"),
                server: args.parse("server")?,
            }),
            other => Err(format!("no command {}", other.join(" "))),
        }
    }
}

struct Brokerd;

impl Table for Brokerd {
    const SPEC: Spec = Spec {
        daemon: Daemon {
            name: "brokerd",
            version: env!("CARGO_PKG_VERSION"),
        },
        config_anchor: CONFIG_ANCHOR,
    };
    const USAGE: Usage = Usage {
        about: "The box's tool broker",
        serve: "Serve broker.sock, admin.sock, state.sock and decide.sock",
        check: "Load and check the configuration and the files it names, print what would be served",
    };
    type Config = Config;
    type Read = daemon::Read;
    type Prepared = daemon::Prepared;
    type More = Command;

    fn read(cfg: &Config) -> Result<daemon::Read, StartError> {
        daemon::read(cfg)
    }

    fn serves(cfg: &Config, _: &daemon::Read) -> Vec<String> {
        daemon::describe(cfg)
    }

    /// Each line says what it serves on which socket already.
    fn describe(cfg: &Config, read: &daemon::Read) -> Vec<String> {
        Self::serves(cfg, read)
    }

    fn check(cfg: &Config, read: &daemon::Read) -> (Vec<String>, bool) {
        daemon::check(cfg, read)
    }

    fn prepare(s: &mut Start<Config>, read: daemon::Read) -> Result<daemon::Prepared, StartError> {
        daemon::prepare(s, read)
    }

    fn profile(s: &Start<Config>, p: &daemon::Prepared) -> Profile {
        daemon::profile(s.cfg(), p, s.path())
    }

    fn serve(cfg: Config, p: daemon::Prepared, running: &Running) -> Result<(), StartError> {
        daemon::serve(cfg, p, running)
    }

    fn more(command: Command) -> ExitCode {
        match command {
            Command::Verify { config } => verify(&config),
            Command::Accept { config, at } => accept(&config, at),
            Command::ToolsList { config } => tools(&config, brokerd::declare::list),
            Command::ToolsAsk { config, server } => tools(&config, |cfg| {
                brokerd::declare::ask(cfg, &server).map(|text| vec![text])
            }),
        }
    }
}

fn main() -> ExitCode {
    bxharden::daemon::main::<Brokerd>()
}

fn load(path: &std::path::Path) -> Option<Config> {
    match bxharden::daemon::load::<Config>(path) {
        Ok(c) => Some(c),
        Err(e) => {
            bxharden::runbook!(CONFIG_ANCHOR, "{e}");
            None
        }
    }
}

fn verify(path: &std::path::Path) -> ExitCode {
    let Some(cfg) = load(path) else {
        return ExitCode::FAILURE;
    };
    let bytes = match chain::read_file(&cfg.chain_path()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("brokerd: {}", e.pointed());
            return ExitCode::FAILURE;
        }
    };
    let r = chain::report(&bytes);
    println!("records: {}", r.records);
    println!("head: {}", r.head);
    println!("{}", r.detail);
    if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `tools list` and `tools ask`: their lines on stdout, or why not on stderr and exit 1.
fn tools(
    path: &std::path::Path,
    what: impl FnOnce(&Config) -> Result<Vec<String>, String>,
) -> ExitCode {
    let Some(cfg) = load(path) else {
        return ExitCode::FAILURE;
    };
    match what(&cfg) {
        Ok(lines) => {
            for l in lines {
                println!("{}", l.trim_end());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("brokerd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn accept(path: &std::path::Path, at: u64) -> ExitCode {
    let Some(cfg) = load(path) else {
        return ExitCode::FAILURE;
    };
    let _lock = match AuditLock::take(&cfg.lock_path()) {
        Ok(l) => l,
        Err(e) => {
            bxharden::log::fail(&e);
            return ExitCode::FAILURE;
        }
    };
    match chain::open(&cfg.chain_path(), OnBreak::AcceptAt(at)) {
        Ok((_, opened)) => {
            for b in opened.accepted.iter().filter(|b| b.at == at) {
                println!(
                    "accepted the break at {}: {} (the chain resumes from {})",
                    b.at, b.why, b.resumes
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("brokerd: {}", e.pointed());
            ExitCode::FAILURE
        }
    }
}
