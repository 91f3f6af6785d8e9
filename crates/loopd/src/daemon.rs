//! The three commands: `serve` (start, sandbox, serve loop.sock), `check` (the configuration
//! and the files it names) and `selftest` (check, then ask every socket loopd uses who answers,
//! without a model request).
//!
//! `serve` does everything that needs privileges or the full filesystem first, in `main`'s one
//! thread: the configuration, the state directories, the peer policy, the listening socket. Then
//! the sandbox closes, and only then do threads start.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bxcore::{Message, PROTOCOL_VERSION};
use bxcore::{client, layout};
use bxharden::log::{line, notice};
use bxharden::profiles::SeccompProfile;
use bxharden::sandbox::SANDBOX_ANCHOR;
use bxharden::serve::LISTENER_ANCHOR;
use bxharden::socket::LISTEN_ANCHOR;
use bxharden::{Identity, Profile, STATE_DIR_ANCHOR};

use crate::baseline::Baseline;
use crate::broker_port::{BrokerPort, NoBroker, not_configured_line};
use crate::channel::{Context, serve};
use crate::config::Config;
use crate::infer::Client;
use crate::outbox::Outbox;
use crate::tools::{Registry, ToolPort};

/// The runbook entry of the broker port's lines.
pub const BROKER_ANCHOR: &str = "broker-unavailable";
/// The runbook entry of a configuration loopd refuses.
pub const CONFIG_ANCHOR: &str = "loopd-config-refused";
/// The runbook entry of a failed `check` or `selftest`.
pub const SELFTEST_ANCHOR: &str = "loopd-selftest-failed";

/// How long `selftest` waits for each socket.
pub const SELFTEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `loopd serve`: returns only with the reason loopd stops (the line is logged already).
pub fn run_serve(config: &Path) -> i32 {
    let cfg = match Config::load(config) {
        Ok(cfg) => cfg,
        Err(e) => {
            bxharden::runbook!(CONFIG_ANCHOR, "{e}");
            return 1;
        }
    };
    let id = match Identity::resolve(&cfg.sandbox) {
        Ok(id) => id,
        Err(e) => {
            bxharden::runbook!(SANDBOX_ANCHOR, "[sandbox]: {e}");
            return 1;
        }
    };
    for dir in [Some(cfg.loop_dir()), Some(cfg.sessions_dir())]
        .into_iter()
        .chain([cfg.memory.socket.as_ref().map(|_| cfg.outbox_dir())])
        .flatten()
    {
        if let Err(e) = bxharden::own_dir(&dir, id.owner()) {
            line(STATE_DIR_ANCHOR, &format!("loopd: {e}"));
            return 1;
        }
    }
    let peers = match cfg.peers.policy(&layout::LOOP.file(), id.uid) {
        Ok(p) => p,
        Err(e) => {
            bxharden::runbook!(CONFIG_ANCHOR, "[peers]: {e}");
            return 1;
        }
    };
    let listener = match bxharden::activated() {
        Ok(mut act) => bxharden::socket_for(
            &mut act,
            layout::LOOP.name,
            &cfg.sockets.channel,
            id.owner(),
        ),
        Err(e) => {
            bxharden::runbook!(LISTEN_ANCHOR, "socket activation: {e}");
            return 1;
        }
    };
    let listener = match listener {
        Ok(l) => l,
        Err(e) => {
            line(LISTEN_ANCHOR, &format!("loopd: {e}"));
            return 1;
        }
    };
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
    let outbox = match &cfg.memory.socket {
        Some(_) => match Outbox::open(&cfg.outbox_dir()) {
            Ok(o) => Some(Arc::new(o)),
            Err(e) => {
                bxharden::runbook!(
                    STATE_DIR_ANCHOR,
                    "{}: cannot open the memory outbox: {e}",
                    cfg.outbox_dir().display()
                );
                return 1;
            }
        },
        None => None,
    };

    match bxharden::apply(&cfg.sandbox, &profile(&cfg, config)) {
        Ok(report) => notice(&report.to_string()),
        Err(e) => {
            line(SANDBOX_ANCHOR, &format!("loopd: {e}"));
            return 1;
        }
    }

    // Threads from here on: the sandbox is closed.
    bxharden::serve::set_frame_budget(cfg.serve.frame_budget);
    if let (Some(outbox), Some(socket)) = (&outbox, cfg.memory.socket.clone()) {
        let outbox = Arc::clone(outbox);
        let timeout = cfg.memory_timeout();
        let spawned = std::thread::Builder::new()
            .name("memory-outbox".to_owned())
            .spawn(move || outbox.run_sender(&socket, timeout));
        if let Err(e) = spawned {
            bxharden::runbook!(
                LISTENER_ANCHOR,
                "cannot start the memory outbox's sender: {e}"
            );
            return 1;
        }
    }
    let client = Client::new(cfg.inference.socket.clone(), cfg.inference_timeout());
    notice(&format!(
        "serving turns on {} (inference {}, broker {}, memory {})",
        cfg.sockets.channel.display(),
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
    let mut ctx = Context::new(cfg, client, port, Registry::new()).with_peers(peers);
    if let Some(outbox) = outbox {
        ctx = ctx.with_outbox(outbox);
    }
    let _ = bxharden::notify::ready();
    let e = match serve(listener, Arc::new(ctx)) {
        Ok(()) => std::io::Error::other("the accept loop ended"),
        Err(e) => e,
    };
    bxharden::runbook!(
        LISTENER_ANCHOR,
        "cannot accept on loop.sock, the listening socket is gone: {e}; stopping"
    );
    1
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
/// a failure prints `selftest: FAILED: {e}; see docs/runbook.md#loopd-selftest-failed`.
pub fn run_selftest_check(config: &Path, live: bool) -> i32 {
    match selftest(config, live) {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            0
        }
        Err(e) => {
            println!("selftest: FAILED: {e}; see docs/runbook.md#loopd-selftest-failed");
            1
        }
    }
}

fn selftest(config: &Path, live: bool) -> Result<Vec<String>, String> {
    let cfg = Config::load(config).map_err(|e| e.to_string())?;
    let baseline = Baseline::assemble(&cfg.loop_dir()).map_err(|e| e.to_string())?;
    let mut out = vec![
        format!("loopd: {} is valid", config.display()),
        format!(
            "loopd: would serve turns on {}",
            cfg.sockets.channel.display()
        ),
        format!(
            "loopd: sessions in {}, a new one starts on slot {:?} with a baseline of {} bytes",
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
    let mut sockets = vec![("inferproxy", cfg.inference.socket.clone())];
    if let Some(p) = &cfg.broker.socket {
        sockets.push(("brokerd", p.clone()));
    }
    if let Some(p) = &cfg.memory.socket {
        sockets.push(("memoryd", p.clone()));
    }
    for (daemon, socket) in sockets {
        let pong = client::ping(&socket, SELFTEST_TIMEOUT)
            .map_err(|e| format!("ping {daemon} on {}: {e}", socket.display()))?;
        if pong.daemon != daemon {
            return Err(format!(
                "{} is served by {}, not {daemon}",
                socket.display(),
                pong.daemon
            ));
        }
        if pong.protocol != PROTOCOL_VERSION {
            return Err(format!(
                "{daemon} on {} speaks protocol {}, not {PROTOCOL_VERSION}",
                socket.display(),
                pong.protocol
            ));
        }
        out.push(format!(
            "selftest: {daemon} {} answers on {}",
            pong.version,
            socket.display()
        ));
    }
    if let Some(p) = &cfg.broker.socket {
        match client::call(p, SELFTEST_TIMEOUT, 1, Message::ToolsList {}, |_| {}) {
            Ok(Message::Tools(t)) => out.push(format!(
                "selftest: brokerd offers {} tools besides the core ones",
                t.tools.len()
            )),
            Ok(other) => {
                return Err(format!(
                    "tools_list on {} was answered with {}",
                    p.display(),
                    other.kind()
                ));
            }
            Err(e) => return Err(format!("tools_list on {}: {e}", p.display())),
        }
    }
    out.push("selftest: ok".to_string());
    Ok(out)
}
