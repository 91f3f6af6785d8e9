//! What loopd's table (`main.rs`) is made of: its directories and outbox, what it says it serves,
//! its sandbox, the context every turn shares, and `check` and `selftest` (check, then ask every
//! socket loopd uses who answers, without a model request).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bxcore::runbook::Anchored;
use bxharden::daemon::{Running, StartError};
use bxharden::log::line;
use bxharden::profiles::SeccompProfile;
use bxharden::{Profile, STATE_DIR_ANCHOR};

use crate::baseline::Baseline;
use crate::broker_port::{BrokerPort, NoBroker, not_configured_line};
use crate::channel::Context;
use crate::config::Config;
use crate::infer::Client;
use crate::outbox::Outbox;
use crate::recall::Recall;
use crate::tools::{Registry, ToolPort};

/// The runbook entry of the broker port's lines.
pub use crate::broker_port::BROKER_ANCHOR;
/// The runbook entry of a configuration loopd refuses.
pub const CONFIG_ANCHOR: &str = "loopd-config-refused";

/// loopd's name, version and configuration anchor, for its monitor and its workers alike.
pub const SPEC: bxharden::daemon::Spec = bxharden::daemon::Spec {
    daemon: bxharden::Daemon {
        name: "loopd",
        version: env!("CARGO_PKG_VERSION"),
    },
    config_anchor: CONFIG_ANCHOR,
};
/// The runbook entry of a failed `check` or `selftest`.
pub const SELFTEST_ANCHOR: &str = "loopd-selftest-failed";

/// How long `selftest` waits for each socket.
pub const SELFTEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The outbox of turns finished before loopd ran a worker per session, opened (made) when
/// `[memory] socket` is set: the monitor sends what it holds ([`send_left`]). Each worker has
/// its own outbox now (`crate::worker`).
pub fn open_outbox(cfg: &Config) -> Result<Option<Arc<Outbox>>, StartError> {
    if cfg.memory.socket.is_none() {
        return Ok(None);
    }
    let outbox = Outbox::open(&cfg.outbox_dir(), cfg.memory.max_outbox).map_err(|e| {
        StartError::own(
            STATE_DIR_ANCHOR,
            format!(
                "{}: cannot open the memory outbox: {e}",
                cfg.outbox_dir().display()
            ),
        )
    })?;
    Ok(Some(Arc::new(outbox)))
}

/// The directories loopd owns: its own, the sessions', the workers', and the outbox's when
/// memory is on.
pub fn own_dirs(cfg: &Config) -> Vec<PathBuf> {
    let mut dirs = vec![cfg.loop_dir(), cfg.sessions_dir(), cfg.workers_dir()];
    if cfg.memory.socket.is_some() {
        dirs.push(cfg.outbox_dir());
    }
    dirs
}

/// What loopd serves, for the start-up notice.
pub fn describe(cfg: &Config) -> String {
    let or_none =
        |p: Option<&PathBuf>| p.map_or_else(|| "none".to_string(), |p| p.display().to_string());
    format!(
        "serving turns on {} and the channel's on {} (sessions {}...; inference {}, broker {}, memory {})",
        cfg.sockets.channel.display(),
        cfg.sockets.bridge.display(),
        cfg.bridge.session_prefix,
        cfg.inference.socket.display(),
        or_none(cfg.broker.socket.as_ref()),
        or_none(cfg.memory.socket.as_ref()),
    )
}

/// The monitor's sender of the turns left in the outbox from before a worker per session.
pub fn send_left(
    cfg: &Config,
    outbox: Option<Arc<Outbox>>,
    running: &Running,
) -> Result<(), StartError> {
    if let (Some(outbox), Some(socket)) = (outbox, cfg.memory.socket.clone()) {
        let timeout = cfg.memory_timeout();
        running.thread("memory-outbox", move || outbox.run_sender(&socket, timeout))?;
    }
    Ok(())
}

/// Everything a worker's turns need, inside its sandbox: the broker port (or none, said once),
/// the inference client, the outbox and its sender thread, recall.
pub fn context(
    cfg: Config,
    outbox: Option<Arc<Outbox>>,
    running: &Running,
) -> Result<Context, StartError> {
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
        running.thread("memory-outbox", move || outbox.run_sender(&socket, timeout))?;
    }
    let client = Client::new(cfg.inference.socket.clone(), cfg.inference_timeout());
    let recall = match &cfg.memory.socket {
        Some(socket) if cfg.memory.recall_tokens > 0 => Some(Recall::new(
            socket.clone(),
            cfg.recall_timeout(),
            cfg.memory.recall_tokens,
        )),
        _ => None,
    };
    let mut ctx = Context::new(cfg, client, port, Registry::new());
    if let Some(outbox) = outbox {
        ctx = ctx.with_outbox(outbox);
    }
    if let Some(r) = recall {
        ctx = ctx.with_recall(r);
    }
    Ok(ctx)
}

/// What loopd may touch: its own directory read-write, the client socket directories that exist,
/// its configuration read-only.
pub fn profile(cfg: &Config, config: &Path) -> Profile {
    // The monitor's own list holds what each worker it starts calls before its own sandbox.
    // `/proc` read-only: a worker checks its own threads and descriptors there before its own
    // sandbox closes, under this domain, and no rule can name a process's own entry before the
    // process exists.
    let mut p = Profile::new(SeccompProfile::Loopd)
        .own_code()
        .read_only("/proc")
        .read_write(cfg.loop_dir());
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

/// The line `check` and `selftest` end with when they fail: `selftest: FAILED: {why}` and the
/// pointer of [`SELFTEST_ANCHOR`].
pub fn failed_line(why: &str) -> String {
    format!(
        "selftest: FAILED: {why}; {}",
        bxcore::runbook::pointer(SELFTEST_ANCHOR)
    )
}

/// `loopd check` (`live: false`) and `loopd selftest` (`live: true`) of a configuration that
/// loaded: what it found, and whether it passes. A failure's last line is [`failed_line`].
pub fn selftest(cfg: &Config, live: bool) -> (Vec<String>, bool) {
    match try_selftest(cfg, live) {
        Ok(lines) => (lines, true),
        Err((mut lines, why)) => {
            lines.push(failed_line(&why));
            (lines, false)
        }
    }
}

fn try_selftest(cfg: &Config, live: bool) -> Result<Vec<String>, (Vec<String>, String)> {
    let baseline = Baseline::assemble(&cfg.loop_dir(), "")
        .map_err(|e| (Vec::new(), e.pointed().to_string()))?;
    let mut out = vec![
        "loopd: configuration ok".to_string(),
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
                "loopd: memory on {}, each session's outbox in {}/<session>/outbox (at most {} turns each)",
                p.display(),
                cfg.workers_dir().display(),
                cfg.memory.max_outbox
            ),
            None => "loopd: no memory hand-off is configured".to_string(),
        },
        format!(
            "loopd: one worker process per live session, at most {} at once, each ending after {} s idle",
            cfg.workers.max, cfg.workers.idle_seconds
        ),
    ];
    if !live {
        out.push("check: ok".to_string());
        return Ok(out);
    }
    // The same checks a channel's `health` asks: every one is printed, the first failure
    // fails the selftest.
    let report = crate::health::report(cfg);
    let mut failed = None;
    for c in &report.checks {
        if c.ok {
            out.push(format!("selftest: {}", c.detail));
        } else if failed.is_none() {
            failed = Some(format!("{}: {}", c.part, c.detail));
        }
    }
    if let Some(why) = failed {
        return Err((out, why));
    }
    out.push("selftest: ok".to_string());
    Ok(out)
}
