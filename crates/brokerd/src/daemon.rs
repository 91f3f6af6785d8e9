//! What brokerd's table (`main.rs`) is made of: its own step between its directories and its
//! sockets (the audit lock taken, the chain verified: a torn tail recovered, a break refused),
//! its sandbox (its roots, and the run tool's programs inside it), the `started` record and the
//! notices once the sandbox holds, and `check`, `audit verify` and `audit accept`.

use std::path::Path;
use std::sync::Arc;

use bxcore::layout::{AdminRequest, BrokerRequest, DecideRequest, StateRequest};
use bxcore::runbook::Anchored;
use bxharden::daemon::{Running, Start, StartError};
use bxharden::serve::Socket;
use bxharden::{ChildSandbox, Profile, SeccompProfile};
use serde_json::json;
use toolkit::{Env, Registry, Roots};

use crate::broker::Broker;
use crate::config::Config;
use crate::dirs;
use crate::fingerprints::Fingerprints;
use crate::ledger::Ledger;
use crate::ledger::chain::{self, Audit, ChainError, OnBreak, Opened};
use crate::ledger::lock::AuditLock;
use crate::ledger::record::{Draft, Event};
use crate::marks::MarkStore;
use crate::state::StateStore;
use crate::{admin, broker, decide, state_socket};

/// The runbook anchor of a configuration brokerd refuses.
pub const CONFIG_ANCHOR: &str = "broker-config-invalid";

/// What the configuration names, read: the tools (tightened) and the workspace roots (checked).
#[derive(Debug)]
pub struct Read {
    pub registry: Registry,
    pub roots: Roots,
}

/// What `serve` opens with the whole filesystem there.
#[derive(Debug)]
pub struct Prepared {
    read: Read,
    lock: AuditLock,
    audit: Audit,
    opened: Opened,
    fingerprints: Fingerprints,
    /// What untrusted sessions wrote (`crate::marks`).
    marks: MarkStore,
    /// The run tool's sandbox, made before brokerd's own closes (`None`: no `[run]`).
    run_sandbox: Option<ChildSandbox>,
    /// The declared tools' servers, each with its sandbox made before brokerd's own closes.
    servers: toolkit::Servers,
    state: Socket<StateRequest>,
    tools: Socket<BrokerRequest>,
    admin: Socket<AdminRequest>,
    decide: Socket<DecideRequest>,
}

fn config(e: impl std::fmt::Display) -> StartError {
    StartError::own(CONFIG_ANCHOR, e)
}

/// The tools and the roots the configuration names.
pub fn read(cfg: &Config) -> Result<Read, StartError> {
    Ok(Read {
        registry: cfg.registry().map_err(config)?,
        roots: cfg.roots().map_err(config)?,
    })
}

/// What brokerd serves, for the start-up notices (in the design's words and order).
pub fn describe(cfg: &Config) -> Vec<String> {
    vec![
        format!(
            "serving tools on {} and approvals on {}",
            cfg.broker_socket().display(),
            cfg.admin_socket().display()
        ),
        format!("serving session state on {}", cfg.state_socket().display()),
        format!(
            "serving the channel's decisions on {} (sessions {}...)",
            cfg.decide_socket().display(),
            cfg.decide.session_prefix
        ),
    ]
}

/// Steps 2 to 4: the directories, the audit lock, the chain opened (a torn tail recovered, a
/// break refused), the fingerprints, the run tool's sandbox, the four sockets.
pub fn prepare(s: &mut Start<Config>, read: Read) -> Result<Prepared, StartError> {
    let cfg = s.cfg();
    for dir in [cfg.broker_dir(), cfg.state_dir(), cfg.audit_dir()] {
        s.own_dir(&dir)?;
    }
    let lock = AuditLock::take(&cfg.lock_path()).map_err(|e| StartError::anchored(&e))?;
    let (audit, opened) =
        chain::open(&cfg.chain_path(), OnBreak::Refuse).map_err(|e| StartError::anchored(&e))?;
    for file in [cfg.lock_path(), cfg.chain_path()] {
        dirs::give(&file, s.owner())?;
    }
    let fingerprints =
        Fingerprints::open(&cfg.broker_dir()).map_err(|e| StartError::anchored(&e))?;
    let marks = MarkStore::open(&cfg.broker_dir(), cfg.workspace.max_marks)
        .map_err(|e| StartError::anchored(&e))?;
    let run_sandbox = match &cfg.run {
        Some(_) => Some(child_sandbox(cfg, &[])?),
        None => None,
    };
    let mut servers = toolkit::Servers::new();
    for (name, sc) in &cfg.tool_servers {
        servers.insert(name.clone(), Arc::new(tool_server(cfg, name, sc)?));
    }
    let state = s.listen(&s.cfg().state_socket())?;
    let tools = s.listen(&s.cfg().broker_socket())?;
    let admin = s.listen(&s.cfg().admin_socket())?;
    let decide = s.listen(&s.cfg().decide_socket())?;
    Ok(Prepared {
        read,
        lock,
        audit,
        opened,
        fingerprints,
        marks,
        run_sandbox,
        servers,
        state,
        tools,
        admin,
        decide,
    })
}

/// The sandbox of a program brokerd starts (the run tool's, a declared tool's server): the
/// system paths and `extra`, read-only, and the run tool's seccomp list. Made before brokerd's
/// own sandbox closes.
fn child_sandbox(cfg: &Config, extra: &[std::path::PathBuf]) -> Result<ChildSandbox, StartError> {
    let mut child = Profile::new(SeccompProfile::RunChild);
    for p in cfg.system_paths().into_iter().chain(extra.iter().cloned()) {
        child = child.read_only(p);
    }
    let mismatch = if cfg.sandbox.seccomp_log {
        bxharden::seccomp::Mismatch::LogEperm
    } else {
        bxharden::seccomp::Mismatch::KillProcess
    };
    ChildSandbox::prepare(&child, mismatch, cfg.sandbox.require)
        .map_err(|e| StartError::own(bxharden::sandbox::SANDBOX_ANCHOR, e))
}

/// `[tool_servers.<name>]` made ready to start for each call (`toolkit::declared`).
pub fn tool_server(
    cfg: &Config,
    name: &str,
    sc: &crate::config::ToolServerConfig,
) -> Result<toolkit::Server, StartError> {
    Ok(toolkit::Server {
        program: sc.command[0].clone().into(),
        argv: sc.command.clone(),
        env: sc.env.clone().into_iter().collect(),
        state: (sc.state == crate::config::ServerState::Session).then(|| toolkit::StatePlace {
            base: cfg.tool_state_dir(name),
            max_bytes: sc.state_max_mb << 20,
        }),
        keeping: sc.keeping(),
        kept: Default::default(),
        path: cfg.run_settings().path.clone(),
        timeout: std::time::Duration::from_millis(sc.timeout_ms),
        limits: toolkit::run::spawn::Limits {
            // A kept process's CPU over its whole life; else one call's.
            cpu_seconds: match sc.keeping() {
                Some(k) => k.lifetime.as_secs() + 1,
                None => sc.timeout_ms.div_ceil(1000) + 1,
            },
            memory_bytes: sc.memory_mb << 20,
            // A file in its session's place is held to what the place may hold; elsewhere it
            // may write nothing.
            file_bytes: match sc.state {
                crate::config::ServerState::Session => sc.state_max_mb << 20,
                crate::config::ServerState::None => 1 << 20,
            },
            processes: sc.processes,
            open_files: 256,
        },
        max_output: sc.max_output_bytes,
        own_network: sc.network_namespace,
        // Changing a mode or an owner could open brokerd's own files (Landlock governs
        // neither), and a server needs neither for the files of its place.
        sandbox: child_sandbox(cfg, &sc.read_paths)?
            .refusing(bxharden::seccomp::mode_changes(
                bxharden::profiles::Arch::current().ok_or_else(|| {
                    StartError::own(
                        bxharden::sandbox::SANDBOX_ANCHOR,
                        "no seccomp on this architecture",
                    )
                })?,
            ))
            .map_err(|e| StartError::own(bxharden::sandbox::SANDBOX_ANCHOR, e))?,
    })
}

/// What brokerd may touch: its own directory, its configuration, the workspace roots (read-only
/// or read-write as configured), and the run tool's system paths (its programs reach nothing
/// brokerd cannot: its domain holds theirs).
pub fn profile(cfg: &Config, p: &Prepared, config: &Path) -> Profile {
    let mut profile = Profile::new(SeccompProfile::Brokerd {
        run_tool: cfg.starts_programs(),
    })
    .read_write(cfg.broker_dir())
    .read_only(config.to_path_buf());
    if cfg.starts_programs() {
        for path in cfg.system_paths() {
            profile = profile.read_only(path);
        }
    }
    for server in cfg.tool_servers.values() {
        for path in &server.read_paths {
            profile = profile.read_only(path.clone());
        }
    }
    for root in p.read.roots.iter() {
        profile = if root.writable {
            profile.read_write(root.path.clone())
        } else {
            profile.read_only(root.path.clone())
        };
    }
    profile
}

/// Step 6: the `started` record (with the sandbox in force), the notices of what opening the
/// chain did, the head at start and at stop, and the four sockets served.
pub fn serve(cfg: Config, p: Prepared, running: &Running) -> Result<(), StartError> {
    let Prepared {
        read,
        lock,
        audit,
        opened,
        fingerprints,
        marks,
        run_sandbox,
        servers,
        state,
        tools,
        admin,
        decide,
    } = p;
    audit
        .commit(vec![Draft::broker(
            Event::Started,
            json!({
                "version": env!("CARGO_PKG_VERSION"),
                "pid": std::process::id(),
                "recovered": opened.torn.is_some(),
                "accepted": opened.accepted.iter().map(|b| b.at).collect::<Vec<_>>(),
                "expired_at_restart": opened.expired,
                "head_found": {"seq": opened.found.0, "hash": opened.found.1},
                "sandbox": running.report().to_string(),
            }),
        )])
        .map_err(|e| StartError::anchored(&ChainError::Io(cfg.chain_path(), e.0)))?;
    opened_notices(&cfg, &opened);

    let run = match (&cfg.run, run_sandbox) {
        (Some(r), Some(sandbox)) => Some(Arc::new(toolkit::run::Settings {
            path: r.path.clone(),
            programs: r.programs.clone(),
            memory_bytes: r.memory_mb << 20,
            file_bytes: r.file_size_mb << 20,
            processes: r.processes,
            open_files: r.open_files,
            max_output: r.max_output_bytes,
            own_network: r.network_namespace,
            sandbox,
        })),
        _ => None,
    };
    let marks = Arc::new(marks);
    let env = Env {
        roots: read.roots.with_marks(marks.clone()),
        gateway: cfg.gateway.socket.clone(),
        run,
        servers: Arc::new(servers),
    };
    let ledger = Ledger::new(StateStore::new(&cfg.state_dir()), audit);
    // A tool whose daemon is absent (web_fetch with no gateway) is not offered.
    let registry = read.registry.offered(&env);
    let broker = Arc::new(Broker::new(cfg, registry, env, ledger, fingerprints, marks));

    let (seq, hash) = broker.ledger().audit().head();
    chain::log_head("at start", seq, &hash);
    // The lock is held until the process ends: the stop hook owns it.
    let b = Arc::clone(&broker);
    running.on_stop(move || {
        let _lock = lock;
        let (seq, hash) = b.ledger().audit().head();
        chain::log_head("at stop", seq, &hash);
    })?;

    let b = Arc::clone(&broker);
    running.serve(state, move |s, id, r| state_socket::handle(s, id, r, &b))?;
    let b = Arc::clone(&broker);
    running.serve(tools, move |s, id, r| broker::handle(s, id, r, &b))?;
    let b = Arc::clone(&broker);
    running.serve(admin, move |s, id, r| admin::handle(s, id, r, &b))?;
    running.serve(decide, move |s, id, r| decide::handle(s, id, r, &broker))
}

/// What opening the chain recovered, accepted or expired, said once at start.
fn opened_notices(cfg: &Config, opened: &Opened) {
    let notice = bxharden::log::notice;
    if let Some(t) = &opened.torn {
        notice(&format!(
            "a torn tail is recovered: {} bytes at offset {} of {} were cut off and recorded",
            t.len,
            t.offset,
            cfg.chain_path().display()
        ));
    }
    for b in &opened.accepted {
        notice(&format!(
            "the audit chain has an accepted break at {}: {} (it resumes from {})",
            b.at, b.why, b.resumes
        ));
    }
    if opened.expired > 0 {
        notice(&format!(
            "{} approval(s) pending at the last stop are recorded as expired at restart",
            opened.expired
        ));
    }
}

/// `brokerd check`: what would be served, the tools offered, each root (a missing one fails),
/// the run tool, and the audit chain verified (a break fails).
pub fn check(cfg: &Config, _: &Read) -> (Vec<String>, bool) {
    let mut ok = true;
    let mut out = vec![
        "brokerd: configuration ok".to_string(),
        format!("  tools on     {}", cfg.broker_socket().display()),
        format!("  approvals on {}", cfg.admin_socket().display()),
        format!("  state on     {}", cfg.state_socket().display()),
        format!("  decisions on {}", cfg.decide_socket().display()),
        format!("  state files  {}", cfg.state_dir().display()),
        format!("  audit chain  {}", cfg.chain_path().display()),
        format!("  approvals wait {} ms", cfg.approvals.ttl_ms),
    ];
    let env = Env {
        gateway: cfg.gateway.socket.clone(),
        ..Env::default()
    };
    // What `serve` offers: the registry is tightened again, as `offered` takes it whole.
    let names: Vec<String> = cfg
        .registry()
        .map(|r| r.offered(&env).defs().into_iter().map(|d| d.name).collect())
        .unwrap_or_default();
    out.push(format!("  tools offered: {}", names.join(", ")));
    for d in &cfg.declared_tools {
        out.push(format!(
            "  declared tool {} on server {}: reads {}{}, effect {}, approval {}",
            d.name,
            d.server,
            d.reads,
            if d.untrusted { ", untrusted" } else { "" },
            d.effect_shown(),
            d.approval.as_str()
        ));
    }
    for root in &cfg.workspace.roots {
        let there = root.path.is_dir();
        out.push(format!(
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
        ));
        if !there {
            ok = false;
            bxharden::runbook!(
                CONFIG_ANCHOR,
                "the workspace root {} is not a directory",
                root.path.display()
            );
        }
    }
    out.push(match &cfg.gateway.socket {
        Some(s) => format!("  web_fetch through {}", s.display()),
        None => "  web_fetch: no gateway is configured, so it is not offered".to_string(),
    });
    match &cfg.run {
        Some(r) => {
            let path: Vec<String> = r.path.iter().map(|p| p.display().to_string()).collect();
            out.push(format!(
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
            ));
            let sys: Vec<String> = r
                .system_paths()
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            out.push(format!("  run: programs may read {}", sys.join(", ")));
        }
        None => out.push("  run: not configured".to_string()),
    }
    match chain::read_file(&cfg.chain_path()) {
        Ok(bytes) => {
            let r = chain::report(&bytes);
            out.push(format!(
                "  audit chain: {} records, {}",
                r.records, r.detail
            ));
            ok &= r.ok;
        }
        Err(e) => {
            ok = false;
            out.push(format!("  audit chain: {}", e.pointed()));
        }
    }
    (out, ok)
}
