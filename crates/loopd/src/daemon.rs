//! The three commands: `serve` (start, sandbox, serve loop.sock), `check` (the configuration
//! and the files it names) and `selftest` (check, then ask every socket loopd uses who answers,
//! without a model request).
//!
//! `serve` does everything that needs privileges or the full filesystem first, in `main`'s one
//! thread: the configuration, the state directories, the peer policy, the listening socket. Then
//! the sandbox closes, and only then do threads start.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bxcore::layout;
use bxcore::runbook::Anchored;
use bxharden::daemon::{self, Spec, Start, StartError, Usage};
use bxharden::log::{line, notice};
use bxharden::profiles::SeccompProfile;
use bxharden::serve::LISTENER_ANCHOR;
use bxharden::{Profile, STATE_DIR_ANCHOR};

use crate::baseline::Baseline;
use crate::broker_port::{BrokerPort, NoBroker, not_configured_line};
use crate::channel::{Context, handle, handle_bridge};
use crate::config::Config;
use crate::infer::Client;
use crate::outbox::Outbox;
use crate::recall::Recall;
use crate::tools::{Registry, ToolPort};

/// The runbook entry of the broker port's lines.
pub use crate::broker_port::BROKER_ANCHOR;
/// The runbook entry of a configuration loopd refuses.
pub const CONFIG_ANCHOR: &str = "loopd-config-refused";
/// The runbook entry of a failed `check` or `selftest`.
pub const SELFTEST_ANCHOR: &str = "loopd-selftest-failed";

/// How long `selftest` waits for each socket.
pub const SELFTEST_TIMEOUT: Duration = Duration::from_secs(10);

/// loopd, for the start-up every daemon runs.
pub const SPEC: Spec = Spec {
    daemon: bxharden::Daemon {
        name: "loopd",
        version: env!("CARGO_PKG_VERSION"),
    },
    config_anchor: CONFIG_ANCHOR,
};

/// The command line's words: `serve`, `check` and `selftest`, each with `--config FILE`.
pub const USAGE: Usage = Usage {
    about: env!("CARGO_PKG_DESCRIPTION"),
    serve: "Serve turns on loop.sock",
    check: "Check the configuration and the files it names; print what would be served",
};

/// `loopd serve`: returns only with the reason loopd did not start (logged).
pub fn run_serve(config: &Path) -> ExitCode {
    daemon::run(SPEC, || start(config))
}

fn start(config: &Path) -> Result<std::convert::Infallible, StartError> {
    let mut s = Start::<Config>::load(SPEC, config)?;
    let cfg = s.cfg();
    for dir in [Some(cfg.loop_dir()), Some(cfg.sessions_dir())]
        .into_iter()
        .chain([cfg.memory.socket.as_ref().map(|_| cfg.outbox_dir())])
        .flatten()
    {
        s.own_dir(&dir)?;
    }
    let outbox = match &cfg.memory.socket {
        Some(_) => Some(Arc::new(Outbox::open(&cfg.outbox_dir()).map_err(|e| {
            StartError::own(
                STATE_DIR_ANCHOR,
                format!(
                    "{}: cannot open the memory outbox: {e}",
                    cfg.outbox_dir().display()
                ),
            )
        })?)),
        None => None,
    };
    let channel = cfg.sockets.channel.clone();
    let socket = s.listen(layout::LOOP, &channel)?;
    let bridge_path = s.cfg().sockets.bridge.clone();
    let bridge = s.listen(layout::BRIDGE, &bridge_path)?;
    let profile = profile(s.cfg(), config);
    let (cfg, running) = s.sandbox(&profile)?;

    // Threads from here on: the sandbox is closed.
    let port: Box<dyn ToolPort> = match &cfg.broker.socket {
        Some(path) => Box::new(BrokerPort::with_log(
            path.clone(),
            cfg.broker_timeout(),
            Box::new(|l| line(BROKER_ANCHOR, l)),
        )),
        None => {
            line(BROKER_ANCHOR, &not_configured_line());
            Box::new(NoBroker)
        }
    };
    if let (Some(outbox), Some(socket)) = (&outbox, cfg.memory.socket.clone()) {
        let outbox = Arc::clone(outbox);
        let timeout = cfg.memory_timeout();
        std::thread::Builder::new()
            .name("memory-outbox".to_owned())
            .spawn(move || outbox.run_sender(&socket, timeout))
            .map_err(|e| {
                StartError::own(
                    LISTENER_ANCHOR,
                    format!("cannot start the memory outbox's sender: {e}"),
                )
            })?;
    }
    let client = Client::new(cfg.inference.socket.clone(), cfg.inference_timeout());
    notice(&format!(
        "serving turns on {} and the channel's on {} (sessions {}...; inference {}, broker {}, memory {})",
        cfg.sockets.channel.display(),
        cfg.sockets.bridge.display(),
        cfg.bridge.session_prefix,
        cfg.inference.socket.display(),
        cfg.broker
            .socket
            .as_ref()
            .map_or_else(|| "none".to_string(), |p| p.display().to_string()),
        cfg.memory
            .socket
            .as_ref()
            .map_or_else(|| "none".to_string(), |p| p.display().to_string()),
    ));
    let mut ctx = Context::new(cfg, client, port, Registry::new());
    if let Some(outbox) = outbox {
        ctx = ctx.with_outbox(outbox);
    }
    if let Some(socket) = ctx.cfg.memory.socket.clone() {
        if ctx.cfg.memory.recall_tokens > 0 {
            let r = Recall::new(
                socket,
                ctx.cfg.recall_timeout(),
                ctx.cfg.memory.recall_tokens,
            );
            ctx = ctx.with_recall(r);
        }
    }
    let ctx = Arc::new(ctx);
    let prefix = ctx.cfg.bridge.session_prefix.clone();
    let for_bridge = Arc::clone(&ctx);
    running.serve(socket, move |stream, env| {
        handle(stream, env, Arc::clone(&ctx))
    })?;
    running.serve(bridge, move |stream, env| {
        handle_bridge(stream, env, Arc::clone(&for_bridge), &prefix)
    })?;
    running.ready()
}

/// What loopd may touch: its own directory read-write, the client socket directories that exist,
/// its configuration read-only.
fn profile(cfg: &Config, config: &Path) -> Profile {
    let mut p = Profile::new(SeccompProfile::Loopd).read_write(cfg.loop_dir());
    let mut dirs: Vec<PathBuf> = Vec::new();
    for socket in [
        Some(&cfg.inference.socket),
        cfg.broker.socket.as_ref(),
        cfg.memory.socket.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        if let Some(dir) = socket.parent() {
            if dir.is_dir() && !dirs.iter().any(|d| d == dir) {
                dirs.push(dir.to_path_buf());
            }
        }
    }
    for d in dirs {
        p = p.read_write(d);
    }
    let config = std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf());
    p.read_only(config)
}

/// `loopd check` (`live: false`) and `loopd selftest` (`live: true`). Prints what it found;
/// a failure prints `selftest: FAILED: {e}` and the pointer of [`SELFTEST_ANCHOR`].
pub fn run_selftest_check(config: &Path, live: bool) -> i32 {
    match selftest(config, live) {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            0
        }
        Err(e) => {
            println!(
                "selftest: FAILED: {e}; {}",
                bxcore::runbook::pointer(SELFTEST_ANCHOR)
            );
            1
        }
    }
}

fn selftest(config: &Path, live: bool) -> Result<Vec<String>, String> {
    let cfg = Config::load(config).map_err(|e| e.to_string())?;
    let baseline = Baseline::assemble(&cfg.loop_dir(), "").map_err(|e| e.pointed().to_string())?;
    let mut out = vec![
        format!("loopd: {} is valid", config.display()),
        format!(
            "loopd: would serve turns on {}",
            cfg.sockets.channel.display()
        ),
        format!(
            "loopd: sessions in {}, a new one starts on slot {:?} with the owner's {} bytes of \
             system.md and core memory after the box's own part",
            cfg.sessions_dir().display(),
            cfg.slots.main,
            baseline.system.len()
        ),
        format!(
            "loopd: inference on {} ({} ms)",
            cfg.inference.socket.display(),
            cfg.inference.timeout_ms
        ),
        match &cfg.broker.socket {
            Some(p) => format!(
                "loopd: tool broker on {} ({} ms)",
                p.display(),
                cfg.broker.timeout_ms
            ),
            None => format!("loopd: {}", crate::broker_port::NOT_CONFIGURED),
        },
        match &cfg.memory.socket {
            Some(p) => format!(
                "loopd: memory on {}, outbox {}",
                p.display(),
                cfg.outbox_dir().display()
            ),
            None => "loopd: no memory hand-off is configured".to_string(),
        },
    ];
    if !live {
        out.push("check: ok".to_string());
        return Ok(out);
    }
    // The same checks a channel's `health` asks: every one is printed, the first failure
    // fails the selftest.
    let report = crate::health::report(&cfg);
    let mut failed = None;
    for c in &report.checks {
        if c.ok {
            out.push(format!("selftest: {}", c.detail));
        } else if failed.is_none() {
            failed = Some(format!("{}: {}", c.part, c.detail));
        }
    }
    if let Some(why) = failed {
        for l in out {
            println!("{l}");
        }
        return Err(why);
    }
    out.push("selftest: ok".to_string());
    Ok(out)
}
