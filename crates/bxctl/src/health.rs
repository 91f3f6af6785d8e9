//! Whether the box is healthy, asked the same way by `status`, `selftest` and the device check
//! (`check`). Each looks at the box through the probes here, and each probe's finding is a
//! [`Check`]: what was checked, how it ended ([`State`]: ok, failed, or skipped, and a skipped
//! check is never ok) and a detail; a check that did not pass says what it is about, so a list
//! of problems is its checks' [`Check::problem`]s (`status`). A report prints its checks with one
//! renderer for people ([`Form::line`]) and one for `--json` ([`Form::json`]); the words are the
//! report's own ([`Form`]), so the device's scripts and the owner's read what they read before.
//!
//! A socket is asked `ping` one way ([`ping`]): as its client where the box says whose ids to
//! take ([`Target::client_ids`], the device check's manifest), else as this process.

use std::io;
use std::path::Path;
use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::layout::{self, DAEMONS, SocketSpec};
use bxcore::visible::{Mode, Shown};
use bxcore::{AuditReport, HealthCheck, Message, Pong};
use serde::Serialize;
use serde::ser::SerializeMap;

use crate::procfs::{self, Sandbox};
use crate::target::Target;
use crate::thread_ids::{Ids, as_ids};

/// How long a socket has to answer `ping` (or `audit_verify`) for `status` and `selftest`.
pub const ANSWER: Duration = Duration::from_secs(5);

/// How long loopd has to ask every part (it gives each of them ten seconds).
pub const HEALTH: Duration = Duration::from_secs(45);

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Ok,
    Failed,
    /// It could not run; never counted as ok.
    Skipped,
}

/// One check and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked: `ping loop.sock`, `confined brokerd`, `directory /var/lib/boxmaker`.
    pub check: String,
    pub state: State,
    /// What it found; when it did not pass, a sentence that names what it is about, or
    /// [`Check::about`] names it.
    pub detail: String,
    /// What a detail that does not name its subject is about (a part as loopd finds it).
    pub about: Option<String>,
}

impl Check {
    pub fn new(check: impl Into<String>, state: State, detail: impl Into<String>) -> Check {
        Check {
            check: check.into(),
            state,
            detail: detail.into(),
            about: None,
        }
    }

    /// The same, its detail about `subject`.
    pub fn about(mut self, subject: impl Into<String>) -> Check {
        self.about = Some(subject.into());
        self
    }

    /// The check as one problem of the box, for a list of them (`status`): its detail, with
    /// what it is about.
    pub fn problem(&self) -> String {
        match &self.about {
            Some(subject) => format!("{subject}: {}", self.detail),
            None => self.detail.clone(),
        }
    }

    pub fn ok(check: impl Into<String>, detail: impl Into<String>) -> Check {
        Check::new(check, State::Ok, detail)
    }

    pub fn failed(check: impl Into<String>, detail: impl Into<String>) -> Check {
        Check::new(check, State::Failed, detail)
    }

    pub fn skipped(check: impl Into<String>, detail: impl Into<String>) -> Check {
        Check::new(check, State::Skipped, detail)
    }

    /// `Ok(detail)` passed, `Err(detail)` failed.
    pub fn from_result(check: impl Into<String>, found: Result<String, String>) -> Check {
        match found {
            Ok(d) => Check::ok(check, d),
            Err(d) => Check::failed(check, d),
        }
    }

    pub fn is_ok(&self) -> bool {
        self.state == State::Ok
    }
}

/// The words a report says its checks in: one for each [`State`], for people and for `--json`,
/// and where a line puts the word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Form {
    /// Ok, failed, skipped, as people read them.
    pub words: [&'static str; 3],
    /// The key of the state in each check's JSON object, and its words there.
    pub json_key: &'static str,
    pub json_words: [&'static str; 3],
    /// `None`: the word first, then `check: detail`; `Some(width)`: indented, the check in a
    /// column this wide, then `word: detail`.
    pub name_width: Option<usize>,
}

fn index(state: State) -> usize {
    match state {
        State::Ok => 0,
        State::Failed => 1,
        State::Skipped => 2,
    }
}

impl Form {
    /// One check's line for a person (without its newline), the detail escaped (its own line
    /// breaks kept, as a command's output it quotes has them).
    pub fn line(&self, c: &Check) -> String {
        let word = self.words[index(c.state)];
        let detail = Shown(&c.detail, Mode::Text);
        match self.name_width {
            None => format!("{word} {}: {detail}", c.check),
            Some(width) => format!("  {:<width$} {word}: {detail}", c.check),
        }
    }

    /// One check as `--json` prints it: `{"check", <json_key>, "detail"}`.
    pub fn json<'a>(&'a self, c: &'a Check) -> JsonCheck<'a> {
        JsonCheck {
            form: self,
            check: c,
        }
    }

    /// Every check as `--json` prints it.
    pub fn json_all<'a>(&'a self, checks: &'a [Check]) -> Vec<JsonCheck<'a>> {
        checks.iter().map(|c| self.json(c)).collect()
    }
}

/// A check in a report's JSON.
#[derive(Debug, Clone, Copy)]
pub struct JsonCheck<'a> {
    form: &'a Form,
    check: &'a Check,
}

impl Serialize for JsonCheck<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("check", &self.check.check)?;
        m.serialize_entry(
            self.form.json_key,
            self.form.json_words[index(self.check.state)],
        )?;
        m.serialize_entry("detail", &self.check.detail)?;
        m.end()
    }
}

/// What a socket said to `ping`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinged {
    /// It answered.
    Answered(Pong),
    /// No socket file.
    Absent,
    /// It is not the caller's to reach: a directory on the way, or the socket itself, keeps the
    /// caller out.
    NotYours(String),
    /// It is there but did not answer (refused, forbidden, broke off).
    Refused(String),
}

/// `ping` on the socket at `path`, as `ids` when given (root taking a socket's client's ids for
/// the one exchange), else as this process.
pub fn ping(path: &Path, ids: Option<Ids>, timeout: Duration) -> Pinged {
    let exchange = || {
        match std::fs::symlink_metadata(path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Pinged::Absent,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Pinged::NotYours(format!("cannot reach {}: {e}", path.display()));
            }
            Err(e) => return Pinged::Refused(format!("cannot reach {}: {e}", path.display())),
        }
        match client::ping(path, timeout) {
            Ok(p) => Pinged::Answered(p),
            Err(e @ ClientError::Connect { .. }) if is_permission(&e) => {
                Pinged::NotYours(e.to_string())
            }
            Err(e) => Pinged::Refused(e.to_string()),
        }
    };
    match ids {
        Some(ids) => as_ids(ids, exchange).unwrap_or_else(Pinged::Refused),
        None => exchange(),
    }
}

fn is_permission(e: &ClientError) -> bool {
    matches!(e, ClientError::Connect { error, .. } if error.kind() == io::ErrorKind::PermissionDenied)
}

/// `ping` on `spec`'s socket of `target`, as its client; `None` when its daemon is not part of
/// the box and no socket is there.
pub fn ping_socket(target: &dyn Target, spec: &SocketSpec) -> Option<Pinged> {
    let path = target.socket(spec);
    if !target.has(spec.server) && !path.exists() {
        return None;
    }
    Some(ping(&path, target.client_ids(spec), ANSWER))
}

/// The socket a `ping` went to, and who asked.
#[derive(Debug, Clone, Copy)]
pub struct Pinging<'a> {
    /// Its file name: `loop.sock`.
    pub file: &'a str,
    /// The daemon that serves it.
    pub server: &'a str,
    /// Who asked, when it was the socket's client by name (the device check: a socket that
    /// keeps its own client out fails); `None` for `status` and `selftest`, whose caller a socket
    /// that is not the caller's may keep out (then the check is skipped, not failed).
    pub client: Option<&'a str>,
}

/// The check of what a socket answered: ok only when it answered as its own daemon speaking
/// this protocol.
pub fn ping_check(pinging: Pinging<'_>, pinged: &Pinged) -> Check {
    let Pinging {
        file,
        server,
        client,
    } = pinging;
    let name = format!("ping {file}");
    match pinged {
        Pinged::Answered(p) if p.daemon == server && p.protocol == bxcore::PROTOCOL_VERSION => {
            let who = client.map(|c| format!(" answers {c}")).unwrap_or_default();
            Check::ok(name, format!("{} {}{who}", p.daemon, p.version))
        }
        Pinged::Answered(p) => Check::failed(
            name,
            format!(
                "{file} answered as {} speaking protocol {}, not {server} speaking {}",
                p.daemon,
                p.protocol,
                bxcore::PROTOCOL_VERSION
            ),
        ),
        Pinged::Absent => Check::failed(
            name,
            format!("{file} is absent ({server} is not serving it)"),
        ),
        Pinged::NotYours(_) if client.is_none() => Check::skipped(
            name,
            format!("{file} is not yours to reach: run it as root to check this socket"),
        ),
        Pinged::NotYours(why) | Pinged::Refused(why) => {
            Check::failed(name, format!("{file} does not answer: {why}"))
        }
    }
}

/// The check of `spec`'s socket of `target` ([`ping_socket`], [`ping_check`]).
pub fn socket_check(spec: &SocketSpec, pinged: &Pinged) -> Check {
    let file = spec.file();
    ping_check(
        Pinging {
            file: &file,
            server: spec.server,
            client: None,
        },
        pinged,
    )
}

/// One daemon of the layout: whether it is part of the box, and its processes' sandboxes.
#[derive(Debug, Clone, Serialize)]
pub struct DaemonLine {
    pub name: String,
    /// Whether it is part of this box (always for the [`crate::target::REQUIRED`] ones).
    pub configured: bool,
    /// One entry per running process of it (one, normally).
    pub processes: Vec<Sandbox>,
    /// loopd's session workers, each with the session it serves (none for the others).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerLine>,
}

/// One of loopd's session workers: the session it serves, and its sandbox.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerLine {
    pub session: String,
    #[serde(flatten)]
    pub process: Sandbox,
}

/// Every daemon of the layout, found by what started it ([`Target::pids`]). In a home that does
/// not exist no daemon is part of the box.
pub fn daemons(target: &dyn Target) -> Vec<DaemonLine> {
    let exists = std::fs::symlink_metadata(target.home()).is_ok();
    DAEMONS
        .iter()
        .map(|d| {
            let pids = target.pids(d.name);
            let workers = if d.name == "loopd" {
                pids.iter()
                    .flat_map(|p| procfs::workers_of(*p))
                    .filter_map(|(pid, session)| {
                        Some(WorkerLine {
                            session,
                            process: procfs::sandbox(pid)?,
                        })
                    })
                    .collect()
            } else {
                Vec::new()
            };
            DaemonLine {
                name: d.name.to_string(),
                configured: exists && target.has(d.name),
                processes: pids.into_iter().filter_map(procfs::sandbox).collect(),
                workers,
            }
        })
        .collect()
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

/// Whether `d` runs confined: every process of it, and at least one when it is part of the box;
/// `None` for a daemon that is not part of the box and does not run.
pub fn confined_check(d: &DaemonLine) -> Option<Check> {
    let name = format!("confined {}", d.name);
    if d.processes.is_empty() {
        return d.configured.then(|| {
            Check::failed(
                name,
                format!("{} is not running (or not visible to you)", d.name),
            )
        });
    }
    let worker = |session: &str| format!("{}'s worker of session {session}", d.name);
    let bad: Vec<String> = d
        .processes
        .iter()
        .filter_map(|p| confinement_problem(&d.name, p))
        .chain(
            d.workers
                .iter()
                .filter_map(|w| confinement_problem(&worker(&w.session), &w.process)),
        )
        .collect();
    let pids: Vec<String> = d.processes.iter().map(|p| p.pid.to_string()).collect();
    let workers = match d.workers.len() {
        0 => String::new(),
        n => format!(
            " and its {n} session worker(s), pid {}",
            d.workers
                .iter()
                .map(|w| w.process.pid.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Some(if bad.is_empty() {
        Check::ok(
            name,
            format!(
                "pid {}{workers}: Seccomp 2, NoNewPrivs 1, no capabilities",
                pids.join(", ")
            ),
        )
    } else {
        Check::failed(name, bad.join("; "))
    })
}

/// brokerd verifies the whole audit chain, asked on admin.sock at `socket` (as `ids` when
/// given); `Err` says why it was not verified.
pub fn verify_audit(
    socket: &Path,
    ids: Option<Ids>,
    timeout: Duration,
) -> Result<AuditReport, String> {
    let ask = || client::call(socket, timeout, 1, Message::AuditVerify {}, |_| {});
    let answer = match ids {
        Some(ids) => as_ids(ids, ask)?,
        None => ask(),
    };
    match answer {
        Ok(Message::AuditReport(r)) => Ok(r),
        Ok(other) => Err(format!("admin.sock answered {}", other.kind())),
        Err(e) => Err(format!("admin.sock did not answer: {e}")),
    }
}

/// The check of the audit chain as brokerd verified it.
pub fn audit_check(verified: &Result<AuditReport, String>) -> Check {
    const NAME: &str = "audit chain";
    match verified {
        Ok(r) if r.ok => Check::ok(NAME, format!("{} records, head {}", r.records, r.head)),
        Ok(r) => Check::failed(
            NAME,
            format!(
                "the audit chain is BROKEN after {} records: {}",
                r.records, r.detail
            ),
        ),
        Err(why) => Check::failed(NAME, format!("the audit chain was not verified: {why}")),
    }
}

/// `health` on loop.sock: every part a turn needs, as loopd finds it (the model provider asked
/// without spending a token). The owner's socket: the device's owner can ask it too.
pub fn loopd_health(target: &dyn Target) -> Result<Vec<HealthCheck>, String> {
    let socket = target.socket(&layout::LOOP);
    match client::call(&socket, HEALTH, 4, Message::Health {}, |_| {}) {
        Ok(Message::HealthReport(r)) => Ok(r.checks),
        Ok(other) => Err(format!("loop.sock answered health with {}", other.kind())),
        Err(e) => Err(format!("loop.sock did not answer health: {e}")),
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

/// One part as loopd finds it.
pub fn health_check(h: &HealthCheck) -> Check {
    let part = part_name(&h.part);
    let state = if h.ok { State::Ok } else { State::Failed };
    Check::new(format!("loopd finds {part}"), state, h.detail.clone()).about(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORD_FIRST: Form = Form {
        words: ["ok  ", "FAIL", "skip"],
        json_key: "result",
        json_words: ["ok", "fail", "skip"],
        name_width: None,
    };

    #[test]
    fn one_renderer_lays_out_either_form_and_escapes_the_detail() {
        let c = Check::failed("ping loop.sock", "broke\u{1b}[2J\nsecond");
        assert_eq!(
            WORD_FIRST.line(&c),
            "FAIL ping loop.sock: broke\\u{1b}[2J\nsecond"
        );
        let named = Form {
            name_width: Some(16),
            ..WORD_FIRST
        };
        assert_eq!(
            named.line(&Check::skipped("x", "why")),
            "  x                skip: why"
        );
    }

    #[test]
    fn a_checks_json_has_its_forms_key_and_word_in_order() {
        let c = Check::skipped("scripted turn", "the provider is `openai`");
        assert_eq!(
            serde_json::to_string(&WORD_FIRST.json(&c)).unwrap(),
            r#"{"check":"scripted turn","result":"skip","detail":"the provider is `openai`"}"#
        );
    }

    fn pong(daemon: &str, protocol: u32) -> Pinged {
        Pinged::Answered(Pong {
            daemon: daemon.into(),
            version: "0.1.0".into(),
            protocol,
        })
    }

    #[test]
    fn a_socket_passes_only_answering_as_its_own_daemon_in_this_protocol() {
        let asked = Pinging {
            file: "loop.sock",
            server: "loopd",
            client: None,
        };
        assert!(ping_check(asked, &pong("loopd", bxcore::PROTOCOL_VERSION)).is_ok());
        for wrong in [pong("brokerd", bxcore::PROTOCOL_VERSION), pong("loopd", 0)] {
            let c = ping_check(asked, &wrong);
            assert_eq!(c.state, State::Failed, "{c:?}");
            assert!(c.detail.starts_with("loop.sock answered as "), "{c:?}");
        }
        assert_eq!(
            ping_check(asked, &Pinged::Absent).detail,
            "loop.sock is absent (loopd is not serving it)"
        );
    }

    #[test]
    fn a_socket_out_of_reach_is_skipped_as_oneself_and_failed_as_its_client() {
        let out = Pinged::NotYours("permission denied".into());
        let mine = Pinging {
            file: "broker.sock",
            server: "brokerd",
            client: None,
        };
        assert_eq!(ping_check(mine, &out).state, State::Skipped);
        let as_client = Pinging {
            client: Some("bx-loop"),
            ..mine
        };
        let c = ping_check(as_client, &out);
        assert_eq!(c.state, State::Failed);
        assert_eq!(c.detail, "broker.sock does not answer: permission denied");
    }

    #[test]
    fn a_socket_that_is_not_there_is_absent_and_one_that_does_not_listen_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        assert_eq!(ping(&path, None, ANSWER), Pinged::Absent);
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(ping(&path, None, ANSWER), Pinged::Refused(_)));
    }

    #[test]
    fn a_part_loopd_finds_failing_is_a_problem_that_names_the_part() {
        let h = HealthCheck {
            part: "provider".into(),
            ok: false,
            detail: "GET http://127.0.0.1:9/v1/models: refused".into(),
        };
        let c = health_check(&h);
        assert_eq!(c.check, "loopd finds the model provider");
        assert_eq!(c.detail, h.detail);
        assert_eq!(
            c.problem(),
            "the model provider: GET http://127.0.0.1:9/v1/models: refused"
        );
    }

    #[test]
    fn a_daemon_of_the_box_that_does_not_run_fails_and_one_outside_it_is_not_checked() {
        let mut d = DaemonLine {
            name: "loopd".into(),
            configured: true,
            processes: Vec::new(),
            workers: Vec::new(),
        };
        assert_eq!(
            confined_check(&d),
            Some(Check::failed(
                "confined loopd",
                "loopd is not running (or not visible to you)"
            ))
        );
        d.configured = false;
        assert_eq!(confined_check(&d), None);
    }

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
}
