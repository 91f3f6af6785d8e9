//! loopd, as its table: `loopd serve | check | selftest --config FILE`, and `loopd worker`, the
//! process of one session that `serve`'s monitor starts.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use bxcore::layout::{BridgeRequest, LoopRequest};
use bxharden::Profile;
use bxharden::daemon::{Args, Body, Cmd, More, Running, Spec, Start, StartError, Table, Usage};
use bxharden::serve::Socket;
use loopd::channel::{handle, handle_bridge};
use loopd::config::Config;
use loopd::daemon;
use loopd::monitor::Monitor;
use loopd::outbox::Outbox;

/// loopd's own commands beside `serve` and `check`.
#[derive(Debug)]
enum Own {
    /// `selftest --config FILE`.
    Selftest { config: PathBuf },
    /// `worker --config FILE --session ID`.
    Worker { config: PathBuf, session: String },
}

impl More for Own {
    const COMMANDS: &'static [Cmd] = &[
        Cmd {
            name: "selftest",
            about: "Check, then ask every socket loopd uses who answers (no model request)",
            body: Body::Options(&["config"]),
        },
        Cmd {
            name: "worker",
            about: "Serve one session, confined, on the channel from loopd serve (stdin); started by loopd serve only",
            body: Body::Options(&["config", "session"]),
        },
    ];

    fn from_args(args: &Args) -> Result<Self, String> {
        match args.path() {
            ["selftest"] => Ok(Own::Selftest {
                config: args.path_of("config"),
            }),
            ["worker"] => Ok(Own::Worker {
                config: args.path_of("config"),
                session: args.parse("session")?,
            }),
            other => Err(format!("no command {}", other.join(" "))),
        }
    }
}

/// What `serve` opens: the outbox of turns from before a worker per session (when memory is
/// on), the two sockets, and what the monitor starts workers with.
struct Prepared {
    outbox: Option<Arc<Outbox>>,
    turns: Socket<LoopRequest>,
    bridge: Socket<BridgeRequest>,
    config: PathBuf,
    exe: PathBuf,
}

struct Loopd;

impl Table for Loopd {
    const SPEC: Spec = daemon::SPEC;
    const USAGE: Usage = Usage {
        about: env!("CARGO_PKG_DESCRIPTION"),
        serve: "Serve turns on loop.sock",
        check: "Check the configuration and the files it names; print what would be served",
    };
    type Config = Config;
    /// Nothing: the owner's system.md and core memory are read by each new session.
    type Read = ();
    type Prepared = Prepared;
    type More = Own;

    fn read(_: &Config) -> Result<(), StartError> {
        Ok(())
    }

    fn serves(cfg: &Config, _: &()) -> Vec<String> {
        vec![daemon::describe(cfg)]
    }

    /// The line says what it serves on which socket already.
    fn describe(cfg: &Config, read: &()) -> Vec<String> {
        Self::serves(cfg, read)
    }

    fn check(cfg: &Config, _: &()) -> (Vec<String>, bool) {
        daemon::selftest(cfg, false)
    }

    fn check_refused(e: &StartError) {
        println!("{}", daemon::failed_line(&e.to_string()));
    }

    fn prepare(s: &mut Start<Config>, _: ()) -> Result<Prepared, StartError> {
        for dir in daemon::own_dirs(s.cfg()) {
            s.own_dir(&dir)?;
        }
        let outbox = daemon::open_outbox(s.cfg())?;
        let turns = s.listen(&s.cfg().sockets.channel.clone())?;
        let bridge = s.listen(&s.cfg().sockets.bridge.clone())?;
        let exe = std::env::current_exe().map_err(|e| {
            StartError::own(daemon::CONFIG_ANCHOR, format!("loopd's own binary: {e}"))
        })?;
        Ok(Prepared {
            outbox,
            turns,
            bridge,
            config: std::fs::canonicalize(s.path()).unwrap_or_else(|_| s.path().to_path_buf()),
            exe,
        })
    }

    fn profile(s: &Start<Config>, _: &Prepared) -> Profile {
        daemon::profile(s.cfg(), s.path())
    }

    fn serve(cfg: Config, p: Prepared, running: &Running) -> Result<(), StartError> {
        daemon::send_left(&cfg, p.outbox, running)?;
        let monitor = Arc::new(Monitor::new(cfg, p.config, p.exe));
        let (for_turns, for_bridge, for_idle, for_stop) = (
            Arc::clone(&monitor),
            Arc::clone(&monitor),
            Arc::clone(&monitor),
            monitor,
        );
        running.thread("idle-workers", move || for_idle.reap_idle())?;
        running.on_stop(move || for_stop.end_all())?;
        running.serve(p.turns, move |stream, id, req| {
            handle(stream, id, req, &for_turns)
        })?;
        running.serve(p.bridge, move |stream, id, req| {
            handle_bridge(stream, id, req, &for_bridge)
        })
    }

    fn more(own: Own) -> ExitCode {
        let config = match own {
            Own::Worker { config, session } => {
                return loopd::worker::run(Self::SPEC, &config, &session);
            }
            Own::Selftest { config } => config,
        };
        let (lines, ok) = match bxharden::daemon::load::<Config>(&config) {
            Ok(cfg) => daemon::selftest(&cfg, true),
            Err(e) => (vec![daemon::failed_line(&e.to_string())], false),
        };
        for l in lines {
            println!("{l}");
        }
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    bxharden::daemon::main::<Loopd>()
}
