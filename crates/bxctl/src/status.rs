//! `bxctl status`: which sockets answer `ping`, each daemon's pid, uid and sandbox as
//! `/proc/<pid>/status` shows it, the audit chain's length and head, and the pending approvals.

use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::layout::{self, DAEMONS, SOCKETS};
use bxcore::{Message, Pong};
use serde::Serialize;

use crate::dev::{self, DevHome};
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
    pub sockets: Vec<SocketLine>,
    pub daemons: Vec<DaemonLine>,
    /// The chain, as brokerd verifies it; `None` when admin.sock did not answer.
    pub audit: Option<AuditLine>,
    /// The pending approvals' count; `None` when admin.sock did not answer.
    pub pending: Option<usize>,
}

fn ping(path: &std::path::Path) -> SocketState {
    if !path.exists() {
        return SocketState::Absent;
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

/// Gather the status of the box at `target`.
pub fn gather(target: &Target) -> Status {
    let sockets = SOCKETS
        .iter()
        .map(|spec| {
            let path = target.socket(spec);
            SocketLine {
                name: spec.file(),
                state: ping(&path),
                path: path.display().to_string(),
            }
        })
        .collect();
    // A dev box knows its daemons by pid file (several may run on one machine); elsewhere the
    // daemons are found by name.
    let dev_home = target
        .is_dev_box()
        .then(|| DevHome::new(target.home()).ok())
        .flatten();
    let daemons = DAEMONS
        .iter()
        .map(|d| {
            let pids = match &dev_home {
                Some(h) => dev::running(h)
                    .into_iter()
                    .filter(|(name, _)| name == d.name)
                    .map(|(_, pid)| pid)
                    .collect(),
                None => procfs::pids_named(d.name),
            };
            DaemonLine {
                name: d.name.to_string(),
                processes: pids.into_iter().filter_map(procfs::sandbox).collect(),
            }
        })
        .collect();
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
    let pending = match client::call(&admin, PING, 2, Message::ApprovalsList {}, |_| {}) {
        Ok(Message::Approvals(a)) => Some(a.pending.len()),
        Ok(_) | Err(ClientError::Remote(_)) | Err(_) => None,
    };
    Status {
        home: target.home().display().to_string(),
        sockets,
        daemons,
        audit,
        pending,
    }
}

/// The status as lines for a person.
pub fn render(s: &Status) -> String {
    let mut out = format!("box at {}\n\nsockets:\n", s.home);
    for sock in &s.sockets {
        let state = match &sock.state {
            SocketState::Answers {
                daemon,
                version,
                protocol,
            } => format!("answers ({daemon} {version}, protocol {protocol})"),
            SocketState::Refuses { why } => format!("refuses: {why}"),
            SocketState::Absent => "absent".to_string(),
        };
        out.push_str(&format!("  {:<13} {state}\n", sock.name));
    }
    out.push_str("\ndaemons:\n");
    for d in &s.daemons {
        if d.processes.is_empty() {
            out.push_str(&format!(
                "  {:<11} not running (or not visible to you)\n",
                d.name
            ));
        }
        for p in &d.processes {
            let verdict = if p.confined() {
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
    match &s.audit {
        Some(a) if a.ok => out.push_str(&format!(
            "audit chain: {} records, head {}\n",
            a.records, a.head
        )),
        Some(a) => out.push_str(&format!(
            "audit chain: BROKEN after {} records: {}\n",
            a.records, a.detail
        )),
        None => out.push_str("audit chain: unknown (admin.sock did not answer)\n"),
    }
    match s.pending {
        Some(n) => out.push_str(&format!("pending approvals: {n}\n")),
        None => out.push_str("pending approvals: unknown (admin.sock did not answer)\n"),
    }
    out
}
