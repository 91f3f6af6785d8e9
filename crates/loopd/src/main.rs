//! loopd, as its table: `loopd serve | check | selftest --config FILE`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use bxcore::layout::{BridgeRequest, LoopRequest};
use bxharden::daemon::{Args, Body, Cmd, More, Running, Spec, Start, StartError, Table, Usage};
use bxharden::serve::Socket;
use bxharden::{Daemon, Profile};
use loopd::channel::{handle, handle_bridge};
use loopd::config::Config;
use loopd::daemon::{self, CONFIG_ANCHOR};
use loopd::outbox::Outbox;

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

/// What `serve` opens: the memory outbox (when memory is on) and the two sockets.
struct Prepared {
    outbox: Option<Arc<Outbox>>,
    turns: Socket<LoopRequest>,
    bridge: Socket<BridgeRequest>,
}

struct Loopd;

impl Table for Loopd {
    const SPEC: Spec = Spec {
        daemon: Daemon {
            name: "loopd",
            version: env!("CARGO_PKG_VERSION"),
        },
        config_anchor: CONFIG_ANCHOR,
    };
    const USAGE: Usage = Usage {
        about: env!("CARGO_PKG_DESCRIPTION"),
        serve: "Serve turns on loop.sock",
        check: "Check the configuration and the files it names; print what would be served",
    };
    type Config = Config;
    /// Nothing: the owner's system.md and core memory are read by each new session.
    type Read = ();
    type Prepared = Prepared;
    type More = Selftest;

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
        Ok(Prepared {
            outbox,
            turns,
            bridge,
        })
    }

    fn profile(s: &Start<Config>, _: &Prepared) -> Profile {
        daemon::profile(s.cfg(), s.path())
    }

    fn serve(cfg: Config, p: Prepared, running: &Running) -> Result<(), StartError> {
        let ctx = Arc::new(daemon::context(cfg, p.outbox, running)?);
        let for_bridge = Arc::clone(&ctx);
        running.serve(p.turns, move |stream, id, req| {
            handle(stream, id, req, &ctx)
        })?;
        running.serve(p.bridge, move |stream, id, req| {
            handle_bridge(stream, id, req, &for_bridge)
        })
    }

    fn more(Selftest { config }: Selftest) -> ExitCode {
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
