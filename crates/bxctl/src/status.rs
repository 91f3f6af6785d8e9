//! `bxctl status`: which sockets answer `ping`, each daemon's pid, uid and sandbox as
//! `/proc/<pid>/status` shows it, the model it talks to, the audit chain's length and head, and
//! the pending approvals, and what loopd finds asking every part a turn needs (`health` on
//! loop.sock: inferproxy and its model provider, brokerd, memoryd); then one verdict. Like
//! `systemctl is-system-running`, it exits 0 only when the box is healthy: every socket of the
//! box answers, every daemon runs confined, the model provider and a configured remote memory
//! store answer, and the chain verifies. Anything else is a problem, named, and the exit is 1.

use std::io::Write;

use bxcore::client;
use bxcore::layout::{self, SOCKETS};
use bxcore::visible::{Mode, Shown};
use bxcore::{AuditReport, MemoryReport, Message, Pong};
use serde::Serialize;

use crate::done::{Done, Ended, Failure};
use crate::health::{self, ANSWER, Check, DaemonLine, Pinged};
use crate::model::{self, ModelLine};
use crate::target::Target;

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
    /// It is there but did not answer (refused, forbidden, broke off, out of reach).
    Refuses { why: String },
    /// No socket file.
    Absent,
    /// Its daemon is not part of this box (no config file names it).
    NotConfigured,
}

impl From<&Pinged> for SocketState {
    fn from(p: &Pinged) -> SocketState {
        match p {
            Pinged::Answered(Pong {
                daemon,
                version,
                protocol,
            }) => SocketState::Answers {
                daemon: daemon.clone(),
                version: version.clone(),
                protocol: *protocol,
            },
            Pinged::Absent => SocketState::Absent,
            Pinged::NotYours(why) | Pinged::Refused(why) => {
                SocketState::Refuses { why: why.clone() }
            }
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SocketLine {
    pub name: String,
    pub path: String,
    #[serde(flatten)]
    pub state: SocketState,
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub home: String,
    /// Whether the home exists; when not, nothing else was looked for.
    pub home_exists: bool,
    /// Whether nothing below is a problem.
    pub healthy: bool,
    /// Why the box is down, when none of its daemons runs (and how to start it): the one
    /// problem then, in place of a line per socket and daemon.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down: Option<String>,
    /// Every reason the box is not healthy, for a person.
    pub problems: Vec<String>,
    /// The model inferproxy is configured with; `None` when its config could not be read.
    pub model: Option<ModelLine>,
    pub sockets: Vec<SocketLine>,
    pub daemons: Vec<DaemonLine>,
    /// The chain, as brokerd verifies it; `None` when admin.sock did not answer.
    pub audit: Option<AuditReport>,
    /// The pending approvals' count; `None` when admin.sock did not answer.
    pub pending: Option<usize>,
    /// memoryd's store and outbox; `None` when memoryd is not part of the box or did not answer.
    pub memory: Option<MemoryReport>,
    /// What loopd found asking every part a turn needs (`health` on loop.sock); `None` when
    /// loop.sock did not answer.
    pub health: Option<Vec<bxcore::HealthCheck>>,
    /// The Matrix channel, as channeld reports it; `None` when it is not part of the box or did
    /// not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<bxcore::ChannelReport>,
}

/// Whether the home is there at all (an `rm -rf` of a live home leaves its daemons running
/// on nothing).
pub fn home_exists(target: &dyn Target) -> bool {
    std::fs::symlink_metadata(target.home()).is_ok()
}

/// The one problem of a home that does not exist.
pub fn home_gone(target: &dyn Target) -> String {
    format!(
        "the home {} does not exist: it was removed, or --home names another; nothing of a box \
         is there, and daemons started on it before may still run unseen",
        target.home().display()
    )
}

/// Gather the status of the box at `target`: what each part shows, and every check that did
/// not pass as a problem.
pub fn gather(target: &dyn Target) -> Status {
    if !home_exists(target) {
        return Status {
            home: target.home().display().to_string(),
            home_exists: false,
            healthy: false,
            down: None,
            problems: vec![home_gone(target)],
            model: None,
            sockets: Vec::new(),
            daemons: health::daemons(target),
            audit: None,
            pending: None,
            memory: None,
            health: None,
            channel: None,
        };
    }
    let mut checks: Vec<Check> = Vec::new();
    let sockets = SOCKETS
        .iter()
        .map(|spec| {
            let pinged = health::ping_socket(target, spec);
            if let Some(p) = &pinged {
                checks.push(health::socket_check(spec, p));
            }
            SocketLine {
                name: spec.file(),
                state: pinged
                    .as_ref()
                    .map_or(SocketState::NotConfigured, SocketState::from),
                path: target.socket(spec).display().to_string(),
            }
        })
        .collect();
    let daemons = health::daemons(target);
    if daemons
        .iter()
        .all(|d| !d.configured || d.processes.is_empty())
    {
        let why = format!(
            "the box is down: none of its daemons runs; {}",
            target.start_hint()
        );
        return Status {
            home: target.home().display().to_string(),
            home_exists: true,
            healthy: false,
            down: Some(why.clone()),
            problems: vec![why],
            model: model::configured(target).ok(),
            sockets,
            daemons,
            audit: None,
            pending: None,
            memory: None,
            health: None,
            channel: None,
        };
    }
    checks.extend(daemons.iter().filter_map(health::confined_check));
    checks.extend(
        target
            .log_problems()
            .into_iter()
            .map(|why| Check::failed("logs", why)),
    );
    let model = match model::configured(target) {
        Ok(m) => Some(m),
        Err(why) => {
            checks.push(Check::failed("model", why));
            None
        }
    };
    let admin = target.socket(&layout::ADMIN);
    let verified = health::verify_audit(&admin, None, ANSWER);
    checks.push(health::audit_check(&verified));
    let audit = verified.ok();
    let pending = match client::call(&admin, ANSWER, 2, Message::ApprovalsList {}, |_| {}) {
        Ok(Message::Approvals(a)) => Some(a.pending.len()),
        _ => None,
    };
    let memory = if target.has("memoryd") {
        let memories = target.socket(&layout::MEMORIES);
        match client::call(&memories, ANSWER, 3, Message::MemoryStatus {}, |_| {}) {
            Ok(Message::MemoryReport(r)) => Some(r),
            _ => None,
        }
    } else {
        None
    };
    if let Some(r) = memory.as_ref().and_then(|m| m.remote.as_ref()) {
        if !r.reachable {
            checks.push(Check::failed(
                "memory's remote store",
                format!("memory's remote store does not answer: {}", r.detail),
            ));
        }
    }
    // loop.sock's own problem (absent, refusing) is named with the sockets already.
    let health = health::loopd_health(target).ok();
    checks.extend(health.iter().flatten().map(health::health_check));
    // The Matrix channel, when the box has one: its homeserver down is a problem with its line.
    let channel = if target.has("channeld") {
        let r = crate::channel::report(&target.socket(&layout::CHANNEL), ANSWER).ok();
        if let Some(r) = r.as_ref().filter(|r| !r.connected) {
            checks.push(Check::failed(
                "the Matrix channel",
                format!(
                    "the Matrix channel is not syncing: {}",
                    Shown(&r.detail, Mode::Line)
                ),
            ));
        }
        r
    } else {
        None
    };
    let problems: Vec<String> = checks
        .into_iter()
        .filter(|c| !c.is_ok())
        .map(|c| c.problem())
        .collect();
    Status {
        home: target.home().display().to_string(),
        home_exists: true,
        healthy: problems.is_empty(),
        down: None,
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
        let rows = d.processes.iter().map(|p| (d.name.clone(), p)).chain(
            d.workers
                .iter()
                .map(|w| (format!("  worker {}", w.session), &w.process)),
        );
        for (name, p) in rows {
            let verdict = if health::confinement_problem(&d.name, p).is_none() {
                "confined"
            } else {
                "NOT CONFINED"
            };
            out.push_str(&format!(
                "  {:<11} pid {}, uid {}, gid {}, {} threads: Seccomp {}, NoNewPrivs {}, capabilities {}: {verdict}\n",
                name,
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
                    health::part_name(&c.part),
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
    } else if let Some(why) = &s.down {
        out.push_str(&format!("status: DOWN: {}\n", Shown(why, Mode::Line)));
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

/// The failure of a box that is not healthy, on one line with its pointer: its one problem, or
/// how many (each listed above) and the first.
pub fn verdict(s: &Status) -> Ended {
    if s.healthy {
        return Ok(Done);
    }
    if let Some(why) = &s.down {
        return Err(
            Failure::failed(format!("status: DOWN: {}", Shown(why, Mode::Line)))
                .pointing(Some(DOWN_ANCHOR)),
        );
    }
    let said = match s.problems.as_slice() {
        [one] => one.clone(),
        // Each is listed above; the verdict counts them and names the first.
        [first, ..] => format!(
            "{} problems, listed above; the first: {first}",
            s.problems.len()
        ),
        [] => "no problem was named".to_string(),
    };
    Err(
        Failure::failed(format!("status: DEGRADED: {}", Shown(&said, Mode::Line)))
            .pointing(Some(DEGRADED_ANCHOR)),
    )
}

/// The runbook entry of a box that is not healthy.
pub const DEGRADED_ANCHOR: &str = "bxctl-status-degraded";
/// The runbook entry of a box none of whose daemons runs.
pub const DOWN_ANCHOR: &str = "bxctl-status-down";

/// `bxctl status [--json]`: the status of the box at `target` on `out`, then the verdict.
pub fn run(target: &dyn Target, json: bool, out: &mut dyn Write) -> Ended {
    let s = gather(target);
    if json {
        let _ = writeln!(out, "{}", serde_json::to_string(&s).unwrap_or_default());
    } else {
        let _ = write!(out, "{}", render(&s));
    }
    verdict(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_problem_makes_the_verdict_degraded_with_its_pointer() {
        let s = Status {
            home: "/h".into(),
            home_exists: true,
            healthy: false,
            down: None,
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
        let v = verdict(&s).unwrap_err();
        assert_eq!((v.code(), v.anchor()), (1, Some(DEGRADED_ANCHOR)));
        let line = v.line();
        assert!(
            line.starts_with("status: DEGRADED: loopd (pid 7) is NOT CONFINED"),
            "{line}"
        );
        assert!(
            line.ends_with(&bxcore::runbook::pointer(DEGRADED_ANCHOR)),
            "{line}"
        );
        assert!(render(&s).contains("status: DEGRADED, 1 problem(s):\n  - loopd"));
    }

    #[test]
    fn a_home_that_does_not_exist_is_said_so_and_no_daemon_is_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let target = crate::target::Device::resolve(Some(&dir.path().join("gone")));
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
        assert!(verdict(&s).unwrap_err().line().contains("does not exist"));
    }
}
