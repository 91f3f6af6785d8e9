//! `brokerd`: the broker role. `serve` takes the audit lock, binds its three sockets, and serves;
//! `check` says what it would serve; `audit verify` and `audit accept` look after the chain.

use std::path::PathBuf;
use std::process::ExitCode;

use brokerd::config::Config;
use brokerd::ledger::chain::{self, OnBreak};
use brokerd::ledger::lock::AuditLock;
use brokerd::serve::{self, CONFIG_ANCHOR};
use bxcore::runbook::Anchored;
use bxharden::daemon::{self, Args, Body, Cli, Cmd, Command, More, Usage};

/// The words of brokerd's command line.
const USAGE: Usage = Usage {
    about: "The box's tool broker",
    serve: "Serve broker.sock, admin.sock and state.sock",
    check: "Load and check the configuration and the files it names, print what would be served",
};

/// brokerd's own commands beside `serve` and `check`: the audit chain.
#[derive(Debug)]
enum Audit {
    /// `audit verify --config FILE`.
    Verify { config: PathBuf },
    /// `audit accept --config FILE --at SEQ`.
    Accept { config: PathBuf, at: u64 },
}

impl More for Audit {
    const COMMANDS: &'static [Cmd] = &[Cmd {
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
    }];

    fn from_args(args: &Args) -> Result<Self, String> {
        match args.path() {
            ["audit", "verify"] => Ok(Audit::Verify {
                config: args.path_of("config"),
            }),
            ["audit", "accept"] => Ok(Audit::Accept {
                config: args.path_of("config"),
                at: args.parse("at")?,
            }),
            other => Err(format!("no command {}", other.join(" "))),
        }
    }
}

fn main() -> ExitCode {
    bxharden::log::init(serve::SPEC.daemon);
    match Cli::<Audit>::parse(serve::SPEC.daemon, &USAGE) {
        Command::Serve { config } => match serve::start(&config) {
            Ok(started) => started.run(),
            Err(e) => daemon::exit(&e),
        },
        Command::Check { config } => check(&config),
        Command::More(Audit::Verify { config }) => verify(&config),
        Command::More(Audit::Accept { config, at }) => accept(&config, at),
    }
}

fn load(path: &std::path::Path) -> Option<Config> {
    match Config::load(path) {
        Ok(c) => Some(c),
        Err(e) => {
            bxharden::runbook!(CONFIG_ANCHOR, "{e}");
            None
        }
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    let Some(cfg) = load(path) else {
        return ExitCode::FAILURE;
    };
    let mut ok = true;
    println!("brokerd: configuration {} is valid", path.display());
    println!("  tools on     {}", cfg.broker_socket().display());
    println!("  approvals on {}", cfg.admin_socket().display());
    println!("  state on     {}", cfg.state_socket().display());
    println!("  state files  {}", cfg.state_dir().display());
    println!("  audit chain  {}", cfg.chain_path().display());
    println!("  approvals wait {} ms", cfg.approvals.ttl_ms);
    if let Ok(reg) = cfg.registry() {
        let env = toolkit::Env {
            gateway: cfg.gateway.socket.clone(),
            ..toolkit::Env::default()
        };
        let names: Vec<String> = reg
            .offered(&env)
            .defs()
            .into_iter()
            .map(|d| d.name)
            .collect();
        println!("  tools offered: {}", names.join(", "));
    }
    for root in &cfg.workspace.roots {
        let there = root.path.is_dir();
        println!(
            "  root {} ({}, {}{}){}",
            root.path.display(),
            root.class,
            if root.writable {
                "writable"
            } else {
                "read-only"
            },
            if root.untrusted { ", untrusted" } else { "" },
            if there { "" } else { ": MISSING" }
        );
        if !there {
            ok = false;
            bxharden::runbook!(
                CONFIG_ANCHOR,
                "the workspace root {} is not a directory",
                root.path.display()
            );
        }
    }
    match &cfg.gateway.socket {
        Some(s) => println!("  web_fetch through {}", s.display()),
        None => println!("  web_fetch: no gateway is configured, so it is not offered"),
    }
    match &cfg.run {
        Some(r) => {
            let path: Vec<String> = r.path.iter().map(|p| p.display().to_string()).collect();
            println!(
                "  run: programs {}, PATH {}, {} MiB memory, {} MiB files, {} processes, {} open files, {} output bytes",
                r.programs
                    .as_ref()
                    .map_or("any".to_string(), |p| p.join(", ")),
                path.join(":"),
                r.memory_mb,
                r.file_size_mb,
                r.processes,
                r.open_files,
                r.max_output_bytes
            );
            let sys: Vec<String> = r
                .system_paths()
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            println!("  run: programs may read {}", sys.join(", "));
        }
        None => println!("  run: not configured"),
    }
    match chain::read_file(&cfg.chain_path()) {
        Ok(bytes) => {
            let r = chain::report(&bytes);
            println!("  audit chain: {} records, {}", r.records, r.detail);
            if !r.ok {
                ok = false;
            }
        }
        Err(e) => {
            ok = false;
            println!("  audit chain: {}", e.pointed());
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
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
