//! `bxctl status`: which sockets answer `ping`, each daemon's pid, uid and sandbox as
//! `/proc/<pid>/status` shows it, the model it talks to, the audit chain's length and head, and
//! the pending approvals, and what loopd finds asking every part a turn needs (`health` on
//! loop.sock: inferproxy and its model provider, brokerd, memoryd); then one verdict. Like
//! `systemctl is-system-running`, it exits 0 only when the box is healthy: every socket of the
//! box answers, every daemon runs confined, the model provider and a configured remote memory
//! store answer, and the chain verifies. Anything else is a problem, named, and the exit is 1.

use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::layout::{self, DAEMONS, SOCKETS};
use bxcore::visible::{Mode, Shown};
use bxcore::{Message, Pong};
use serde::Serialize;

use crate::dev::{self, DevHome};
use crate::model::{self, ModelLine};
use crate::procfs::{self, Sandbox};
use crate::target::Target;

const PING: Duration = Duration::from_secs(5);

/// One socket's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SocketState {
    /// It answered `ping`.
    Answers {
        daemon: String,
        version: String,
        protocol: u32,
    },
    /// It is there but did not answer (refused, forbidden, or broke off).
    Refuses { why: String },
    /// No socket file.
    Absent,
    /// Its daemon is not part of this box (no config file names it).
    NotConfigured,
}

#[derive(Debug, Clone, Serialize)]
pub struct SocketLine {
    pub name: String,
    pub path: String,
    #[serde(flatten)]
    pub state: SocketState,
}

#[derive(Debug, Clone, Serialize)]
pub struct DaemonLine {
    pub name: String,
    /// Whether it is part of this box (always for loopd, brokerd and inferproxy).
    pub configured: bool,
    /// One entry per running process of that name (one, normally).
    pub processes: Vec<Sandbox>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuditLine {
    pub records: u64,
    pub head: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub home: String,
    /// Whether the home exists; when not, nothing else was looked for.
    pub home_exists: bool,
    /// Whether nothing below is a problem.
    pub healthy: bool,
    /// Every reason the box is not healthy, for a person.
    pub problems: Vec<String>,
    /// The model inferproxy is configured with; `None` when its config could not be read.
    pub model: Option<ModelLine>,
    pub sockets: Vec<SocketLine>,
    pub daemons: Vec<DaemonLine>,
    /// The chain, as brokerd verifies it; `None` when admin.sock did not answer.
    pub audit: Option<AuditLine>,
    /// The pending approvals' count; `None` when admin.sock did not answer.
    pub pending: Option<usize>,
    /// memoryd's store and outbox; `None` when memoryd is not part of the box or did not answer.
    pub memory: Option<MemoryLine>,
    /// What loopd found asking every part a turn needs (`health` on loop.sock); `None` when
    /// loop.sock did not answer.
    pub health: Option<Vec<bxcore::HealthCheck>>,
    /// The Matrix channel, as channeld reports it; `None` when it is not part of the box or did
    /// not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<bxcore::ChannelReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryLine {
    /// What memoryd files into.
    pub store: String,
    /// Turns durable in its outbox, not yet filed.
    pub outbox: u64,
    /// Why the oldest of them waits, when it waits.
    pub waiting: Option<String>,
    /// The remote store (Honcho), when one is configured: whether it answered just now.
    pub remote: Option<bxcore::RemoteHealth>,
}

/// How long loopd has to ask every part (it gives each of them ten seconds).
const HEALTH: Duration = Duration::from_secs(45);

/// `health` on loop.sock: every part a turn needs, as loopd finds it (the model provider asked
/// without spending a token). The owner's socket: the device's owner can ask it too.
pub fn health(target: &Target) -> Result<Vec<bxcore::HealthCheck>, String> {
    let socket = target.socket(&layout::LOOP);
    match client::call(&socket, HEALTH, 4, Message::Health {}, |_| {}) {
        Ok(Message::HealthReport(r)) => Ok(r.checks),
        Ok(other) => Err(format!("loop.sock answered health with {}", other.kind())),
        Err(e) => Err(format!("loop.sock did not answer health: {e}")),
    }
}

fn ping(path: &std::path::Path) -> SocketState {
    match std::fs::symlink_metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return SocketState::Absent,
        // A directory on the way that is not the caller's to enter: there, but not reachable.
        Err(e) => {
            return SocketState::Refuses {
                why: format!("cannot reach {}: {e}", path.display()),
            };
        }
    }
    match client::ping(path, PING) {
        Ok(Pong {
            daemon,
            version,
            protocol,
        }) => SocketState::Answers {
            daemon,
            version,
            protocol,
        },
        Err(e) => SocketState::Refuses { why: e.to_string() },
    }
}

/// The daemons every box has: the dev box starts each of them and the NixOS module installs each
/// (a user who cannot read the box's `dev/` still knows which sockets to try).
pub const REQUIRED: [&str; 5] = ["loopd", "brokerd", "inferproxy", "gatewayd", "memoryd"];

/// Whether `daemon` is part of the box at `target`.
pub fn expected(target: &Target, daemon: &str) -> bool {
    REQUIRED.contains(&daemon) || target.config(daemon).exists()
}

/// Whether a socket answered as its own daemon speaking this protocol; the problem otherwise.
pub fn socket_problem(spec: &layout::SocketSpec, state: &SocketState) -> Option<String> {
    match state {
        SocketState::Answers {
            daemon, protocol, ..
        } if daemon == spec.server && *protocol == bxcore::PROTOCOL_VERSION => None,
        SocketState::Answers {
            daemon, protocol, ..
        } => Some(format!(
            "{} answered as {daemon} speaking protocol {protocol}, not {} speaking {}",
            spec.file(),
            spec.server,
            bxcore::PROTOCOL_VERSION
        )),
        SocketState::Refuses { why } => Some(format!("{} does not answer: {why}", spec.file())),
        SocketState::Absent => Some(format!(
            "{} is absent ({} is not serving it)",
            spec.file(),
            spec.server
        )),
        SocketState::NotConfigured => None,
    }
}

/// Why a process is not confined as a daemon must be; `None` when it is.
pub fn confinement_problem(name: &str, p: &Sandbox) -> Option<String> {
    let mut why = Vec::new();
    if p.seccomp != 2 {
        why.push(format!("Seccomp {}", p.seccomp));
    }
    if !p.no_new_privs {
        why.push("NoNewPrivs 0".to_string());
    }
    if !p.no_capabilities {
        why.push("capabilities held".to_string());
    }
    if p.uid == 0 {
        why.push("runs as root".to_string());
    }
    (!why.is_empty()).then(|| format!("{name} (pid {}) is NOT CONFINED: {}", p.pid, why.join(", ")))
}

/// Every daemon of the layout: whether it is part of this box, and its processes' sandboxes.
/// A daemon is found by what started it, never by its name (a name finds every box's
/// daemons on the machine): in a dev box by its pid file (pid and start time), on the device
/// by the main process systemd gives for its unit. In a home that does not exist nothing is.
pub fn gather_daemons(target: &Target) -> Vec<DaemonLine> {
    let dev_home = target
        .is_dev_box()
        .then(|| DevHome::new(target.home()).ok())
        .flatten();
    let exists = home_exists(target);
    DAEMONS
        .iter()
        .map(|d| {
            let pids: Vec<u32> = match &dev_home {
                Some(h) => dev::running(h)
                    .into_iter()
                    .filter(|(name, _)| name == d.name)
                    .map(|(_, pid)| pid)
                    .collect(),
                None if exists => {
                    crate::check::live::main_pid(&format!("boxmaker-{}.service", d.name))
                        .into_iter()
                        .collect()
                }
                None => Vec::new(),
            };
            DaemonLine {
                name: d.name.to_string(),
                configured: exists && expected(target, d.name),
                processes: pids.into_iter().filter_map(procfs::sandbox).collect(),
            }
        })
        .collect()
}

/// Whether the home is there at all (an `rm -rf` of a live home leaves its daemons running
/// on nothing).
pub fn home_exists(target: &Target) -> bool {
    std::fs::symlink_metadata(target.home()).is_ok()
}

/// The one problem of a home that does not exist.
pub fn home_gone(target: &Target) -> String {
    format!(
        "the home {} does not exist: it was removed, or --home names another; nothing of a box \
         is there, and daemons started on it before may still run unseen",
        target.home().display()
    )
}

/// Gather the status of the box at `target`.
pub fn gather(target: &Target) -> Status {
    if !home_exists(target) {
        return Status {
            home: target.home().display().to_string(),
            home_exists: false,
            healthy: false,
            problems: vec![home_gone(target)],
            model: None,
            sockets: Vec::new(),
            daemons: gather_daemons(target),
            audit: None,
            pending: None,
            memory: None,
            health: None,
            channel: None,
        };
    }
    let mut problems = Vec::new();
    let sockets = SOCKETS
        .iter()
        .map(|spec| {
            let path = target.socket(spec);
            let state = if expected(target, spec.server) || path.exists() {
                crate::peer::as_client(target, spec, || ping(&path))
                    .unwrap_or_else(|why| SocketState::Refuses { why })
            } else {
                SocketState::NotConfigured
            };
            problems.extend(socket_problem(spec, &state));
            SocketLine {
                name: spec.file(),
                state,
                path: path.display().to_string(),
            }
        })
        .collect();
    let daemons = gather_daemons(target);
    for d in &daemons {
        if d.processes.is_empty() && d.configured {
            problems.push(format!("{} is not running (or not visible to you)", d.name));
        }
        problems.extend(
            d.processes
                .iter()
                .filter_map(|p| confinement_problem(&d.name, p)),
        );
    }
    let model = match model::configured(target) {
        Ok(m) => Some(m),
        Err(why) => {
            problems.push(why);
            None
        }
    };
    let admin = target.socket(&layout::ADMIN);
    let audit = match client::call(&admin, PING, 1, Message::AuditVerify {}, |_| {}) {
        Ok(Message::AuditReport(r)) => Some(AuditLine {
            records: r.records,
            head: r.head,
            ok: r.ok,
            detail: r.detail,
        }),
        _ => None,
    };
    match &audit {
        Some(a) if a.ok => {}
        Some(a) => problems.push(format!(
            "the audit chain is BROKEN after {} records: {}",
            a.records, a.detail
        )),
        None => {
            problems.push("the audit chain was not verified: admin.sock did not answer".to_string())
        }
    }
    let pending = match client::call(&admin, PING, 2, Message::ApprovalsList {}, |_| {}) {
        Ok(Message::Approvals(a)) => Some(a.pending.len()),
        Ok(_) | Err(ClientError::Remote(_)) | Err(_) => None,
    };
    let memory = if expected(target, "memoryd") {
        let memories = target.socket(&layout::MEMORIES);
        match client::call(&memories, PING, 3, Message::MemoryStatus {}, |_| {}) {
            Ok(Message::MemoryReport(r)) => Some(MemoryLine {
                store: r.store,
                outbox: r.outbox,
                waiting: r.waiting,
                remote: r.remote,
            }),
            _ => None,
        }
    } else {
        None
    };
    if let Some(r) = memory.as_ref().and_then(|m| m.remote.as_ref()) {
        if !r.reachable {
            problems.push(format!(
                "memory's remote store does not answer: {}",
                r.detail
            ));
        }
    }
    let health = match health(target) {
        Ok(checks) => {
            for c in checks.iter().filter(|c| !c.ok) {
                problems.push(format!("{}: {}", part_name(&c.part), c.detail));
            }
            Some(checks)
        }
        // loop.sock's own problem (absent, refusing) is named with the sockets already.
        Err(_) => None,
    };
    // The Matrix channel, when the box has one: its homeserver down is a problem with its line.
    let channel = if expected(target, "channeld") {
        let r = crate::channel::report(&target.socket(&layout::CHANNEL), PING).ok();
        if let Some(r) = r.as_ref().filter(|r| !r.connected) {
            problems.push(format!(
                "the Matrix channel is not syncing: {}",
                Shown(&r.detail, Mode::Line)
            ));
        }
        r
    } else {
        None
    };
    Status {
        home: target.home().display().to_string(),
        home_exists: true,
        healthy: problems.is_empty(),
        problems,
        model,
        sockets,
        daemons,
        audit,
        pending,
        memory,
        health,
        channel,
    }
}

/// What a health check's part is, for a person.
pub fn part_name(part: &str) -> &str {
    match part {
        "inference" => "inferproxy",
        "provider" => "the model provider",
        "broker" => "the tool broker",
        "memory" => "memoryd",
        other => other,
    }
}

/// The status as lines for a person.
pub fn render(s: &Status) -> String {
    if !s.home_exists {
        let mut out = format!("box at {}: the home does not exist\n\n", s.home);
        out.push_str(&format!(
            "status: DEGRADED, {} problem(s):\n",
            s.problems.len()
        ));
        for p in &s.problems {
            out.push_str(&format!("  - {}\n", Shown(p, Mode::Line)));
        }
        return out;
    }
    let mut out = format!("box at {}\n\nsockets:\n", s.home);
    for sock in &s.sockets {
        let state = match &sock.state {
            SocketState::Answers {
                daemon,
                version,
                protocol,
            } => format!("answers ({daemon} {version}, protocol {protocol})"),
            SocketState::Refuses { why } => format!("refuses: {}", Shown(why, Mode::Line)),
            SocketState::Absent => "absent".to_string(),
            SocketState::NotConfigured => "not part of this box".to_string(),
        };
        out.push_str(&format!("  {:<13} {state}\n", sock.name));
    }
    out.push_str("\ndaemons:\n");
    for d in &s.daemons {
        if d.processes.is_empty() && !d.configured {
            out.push_str(&format!("  {:<11} not part of this box\n", d.name));
        } else if d.processes.is_empty() {
            out.push_str(&format!(
                "  {:<11} not running (or not visible to you)\n",
                d.name
            ));
        }
        for p in &d.processes {
            let verdict = if confinement_problem(&d.name, p).is_none() {
                "confined"
            } else {
                "NOT CONFINED"
            };
            out.push_str(&format!(
                "  {:<11} pid {}, uid {}, gid {}, {} threads: Seccomp {}, NoNewPrivs {}, capabilities {}: {verdict}\n",
                d.name,
                p.pid,
                p.uid,
                p.gid,
                p.threads,
                p.seccomp,
                u8::from(p.no_new_privs),
                if p.no_capabilities { "none" } else { "SOME" },
            ));
        }
    }
    out.push('\n');
    match &s.model {
        Some(m) => out.push_str(&format!("model: {}\n", m.describe())),
        None => out.push_str("model: unknown (inferproxy's config could not be read)\n"),
    }
    match &s.audit {
        Some(a) if a.ok => out.push_str(&format!(
            "audit chain: {} records, head {}\n",
            a.records, a.head
        )),
        Some(a) => out.push_str(&format!(
            "audit chain: BROKEN after {} records: {}\n",
            a.records,
            Shown(&a.detail, Mode::Line)
        )),
        None => out.push_str("audit chain: unknown (admin.sock did not answer)\n"),
    }
    match s.pending {
        Some(n) => out.push_str(&format!("pending approvals: {n}\n")),
        None => out.push_str("pending approvals: unknown (admin.sock did not answer)\n"),
    }
    if let Some(m) = &s.memory {
        out.push_str(&format!(
            "memory: {}; outbox: {} turn(s) waiting\n",
            Shown(&m.store, Mode::Line),
            m.outbox
        ));
        if let Some(why) = &m.waiting {
            out.push_str(&format!("memory waits: {}\n", Shown(why, Mode::Line)));
        }
        if let Some(r) = &m.remote {
            let state = if r.reachable {
                "answers"
            } else {
                "DOES NOT ANSWER"
            };
            out.push_str(&format!(
                "memory's remote store {state}: {}\n",
                Shown(&r.detail, Mode::Line)
            ));
        }
    }
    match &s.health {
        Some(checks) => {
            out.push_str("as loopd finds them:\n");
            for c in checks {
                out.push_str(&format!(
                    "  {:<18} {}: {}\n",
                    part_name(&c.part),
                    if c.ok { "ok" } else { "FAILED" },
                    Shown(&c.detail, Mode::Line)
                ));
            }
        }
        None => out.push_str("as loopd finds them: unknown (loop.sock did not answer)\n"),
    }
    if let Some(c) = &s.channel {
        out.push_str(&format!("channel: {}\n", crate::channel::describe(c)));
    }
    out.push('\n');
    if s.healthy {
        out.push_str("status: healthy\n");
    } else {
        out.push_str(&format!(
            "status: DEGRADED, {} problem(s):\n",
            s.problems.len()
        ));
        for p in &s.problems {
            out.push_str(&format!("  - {}\n", Shown(p, Mode::Line)));
        }
    }
    out
}

/// The line on stderr when the box is not healthy.
pub fn verdict(s: &Status) -> Option<String> {
    (!s.healthy).then(|| {
        format!(
            "status: DEGRADED: {}; {}",
            Shown(&s.problems.join("; "), Mode::Line),
            bxcore::runbook::pointer(DEGRADED_ANCHOR)
        )
    })
}

/// The runbook entry of a box that is not healthy.
pub const DEGRADED_ANCHOR: &str = "bxctl-status-degraded";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_without_its_sandbox_is_named_not_confined() {
        let me = procfs::sandbox(std::process::id()).unwrap();
        let why = confinement_problem("loopd", &me).expect("the test harness is not confined");
        assert!(
            why.starts_with(&format!("loopd (pid {}) is NOT CONFINED: Seccomp ", me.pid)),
            "{why}"
        );
    }

    #[test]
    fn a_confined_process_is_no_problem_and_root_always_is() {
        let confined = Sandbox {
            pid: 7,
            uid: 1000,
            gid: 1000,
            threads: 3,
            seccomp: 2,
            no_new_privs: true,
            no_capabilities: true,
        };
        assert_eq!(confinement_problem("brokerd", &confined), None);
        let root = Sandbox { uid: 0, ..confined };
        assert_eq!(
            confinement_problem("brokerd", &root).as_deref(),
            Some("brokerd (pid 7) is NOT CONFINED: runs as root")
        );
    }

    #[test]
    fn one_problem_makes_the_verdict_degraded_with_its_pointer() {
        let s = Status {
            home: "/h".into(),
            home_exists: true,
            healthy: false,
            problems: vec!["loopd (pid 7) is NOT CONFINED: Seccomp 0".into()],
            model: None,
            sockets: Vec::new(),
            daemons: Vec::new(),
            audit: None,
            pending: None,
            memory: None,
            health: None,
            channel: None,
        };
        let v = verdict(&s).unwrap();
        assert!(
            v.starts_with("status: DEGRADED: loopd (pid 7) is NOT CONFINED"),
            "{v}"
        );
        assert!(
            v.ends_with(&bxcore::runbook::pointer(DEGRADED_ANCHOR)),
            "{v}"
        );
        assert!(render(&s).contains("status: DEGRADED, 1 problem(s):\n  - loopd"));
    }

    #[test]
    fn a_home_that_does_not_exist_is_said_so_and_no_daemon_is_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::resolve(Some(&dir.path().join("gone")));
        let s = gather(&target);
        assert!(!s.home_exists);
        assert_eq!(s.problems, vec![home_gone(&target)]);
        assert!(
            s.daemons
                .iter()
                .all(|d| d.processes.is_empty() && !d.configured)
        );
        let text = render(&s);
        assert!(text.contains("the home does not exist"), "{text}");
        assert!(verdict(&s).unwrap().contains("does not exist"));
    }
}
