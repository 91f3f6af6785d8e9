//! The running half of the device check: what systemd says of each unit, what the kernel says of
//! each daemon's threads, and what each socket answers to its client and to a peer it must
//! refuse. The check runs as root and talks to a socket as its client by taking the client's
//! effective ids for that one exchange (`SO_PEERCRED` and the file modes both see them).

use std::io;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::os::unix::net::UnixStream;

use bxcore::client;
use bxcore::deadline::Deadline;
use bxcore::{Envelope, ErrorCode, Message, Outcome, SessionId, TurnEvent, read_frame};
use bxharden::proc_status;

use super::manifest::{Ids, Manifest, Service, Socket, resolve};
use crate::chat::{self, Style};
use crate::health::{self, Check, Pinged, Pinging};
use crate::target::{main_pid, run};
use crate::thread_ids::as_ids;

/// How long one answer on a socket may take.
const ANSWER: Duration = Duration::from_secs(10);
/// How long the scripted turn may take.
const TURN: Duration = Duration::from_secs(60);
/// How long a refusal may take to reach the journal.
const JOURNAL: Duration = Duration::from_secs(15);
/// The uid no socket of the box belongs to.
const NOBODY: u32 = 65534;

/// systemd says the unit is active.
pub fn active(unit: &str) -> Result<String, String> {
    match run(Command::new("systemctl").args(["is-active", unit])) {
        Ok((_, state)) if state == "active" => Ok("active".into()),
        Ok((_, state)) => Err(format!("{state}, not active")),
        Err(e) => Err(e),
    }
}

/// Every thread of the daemon's main process, and of each of loopd's session workers:
/// `Seccomp: 2`, `NoNewPrivs: 1`, every capability set empty, and the daemon's own uid and gid,
/// never root.
pub fn sandbox(s: &Service) -> Result<String, String> {
    let ids = resolve(&s.user, &s.group)?;
    if ids.uid == 0 {
        return Err(format!("its user {} is root", s.user));
    }
    let pid = main_pid(&s.unit)?;
    let workers = crate::procfs::workers_of(pid);
    let mut problems = Vec::new();
    let mut threads = 0;
    for (p, what) in std::iter::once((pid, String::new())).chain(
        workers
            .iter()
            .map(|(w, session)| (*w, format!("worker of session {session}, "))),
    ) {
        let ts = match proc_status::threads(p) {
            Ok(t) if !t.is_empty() => t,
            Ok(_) => return Err(format!("{what}pid {p} has no threads")),
            Err(e) => return Err(format!("{what}cannot read /proc/{p}/task: {e}")),
        };
        threads += ts.len();
        problems.extend(ts.iter().flat_map(|t| {
            let what = what.clone();
            t.problems(ids.uid, ids.gid)
                .into_iter()
                .map(move |why| format!("{what}thread {}: {why}", t.tid))
        }));
    }
    let workers = match workers.len() {
        0 => String::new(),
        n => format!(" and its {n} session worker(s)"),
    };
    if problems.is_empty() {
        Ok(format!(
            "pid {pid}{workers}, {threads} threads, each uid {} ({}): Seccomp 2, NoNewPrivs 1, no capabilities",
            ids.uid, s.user
        ))
    } else {
        Err(problems.join("; "))
    }
}

/// `ping` as the socket's client: the server answers as itself, in this protocol.
pub fn ping(sock: &Socket) -> Check {
    let file = sock.file();
    let asked = Pinging {
        file: &file,
        server: &sock.server,
        client: Some(&sock.user),
    };
    match resolve(&sock.user, &sock.group) {
        Ok(ids) => health::ping_check(asked, &health::ping(&sock.path, Some(ids), ANSWER)),
        Err(e) => Check::failed(format!("ping {file}"), e),
    }
}

/// Seconds since the epoch, for `journalctl --since=@…`.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A peer that is not allowed is refused: another user by the file modes, and root (who passes
/// them) by the server's peer check, whose line is then found in the journal under
/// `RUNBOOK=socket-peer-refused SYSLOG_IDENTIFIER=<server>`.
pub fn refuses(sock: &Socket, since: u64) -> Result<String, String> {
    let nobody = Ids {
        uid: NOBODY,
        gid: NOBODY,
    };
    match health::ping(&sock.path, Some(nobody), ANSWER) {
        Pinged::NotYours(_) => {}
        Pinged::Answered(_) => return Err(format!("uid {NOBODY} got an answer")),
        Pinged::Absent => {
            return Err(format!(
                "uid {NOBODY} was not refused by the file modes: {} is absent",
                sock.path.display()
            ));
        }
        Pinged::Refused(why) => {
            return Err(format!(
                "uid {NOBODY} was not refused by the file modes: {why}"
            ));
        }
    }
    // A refused peer is answered at once and the connection closed, before any request is
    // read: so read first, and send nothing (a request written after the close would only
    // meet a broken pipe).
    let refusal = UnixStream::connect(&sock.path)
        .map_err(|e| format!("root cannot connect: {e}"))
        .and_then(|stream| {
            read_frame(&mut Deadline::new(&stream, Instant::now() + ANSWER))
                .map_err(|e| format!("no refusal came: {e}"))
        });
    match refusal {
        Ok(Envelope {
            msg: Message::Error(w),
            ..
        }) if w.code == ErrorCode::Forbidden => {}
        Ok(env) => {
            return Err(format!(
                "root was answered {} by {}, not refused as `forbidden`",
                env.msg.kind(),
                sock.server
            ));
        }
        Err(e) => {
            return Err(format!(
                "root was not refused as `forbidden` by {}: {e}",
                sock.server
            ));
        }
    }
    let want = format!("refused a connection from uid 0 on {}", sock.file());
    let deadline = Instant::now() + JOURNAL;
    loop {
        let found = run(Command::new("journalctl").args([
            "--no-pager",
            "--output=cat",
            &format!("--since=@{since}"),
            "RUNBOOK=socket-peer-refused",
            &format!("SYSLOG_IDENTIFIER={}", sock.server),
        ]));
        match found {
            Ok((_, text)) if text.lines().any(|l| l.contains(&want)) => {
                return Ok(format!(
                    "uid {NOBODY} by the file mode, root by {}'s peer check, in the journal",
                    sock.server
                ));
            }
            Ok(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(_) => {
                return Err(format!(
                    "{} refused root, but within {}s `journalctl RUNBOOK=socket-peer-refused \
                     SYSLOG_IDENTIFIER={}` had no line `{want}`",
                    sock.server,
                    JOURNAL.as_secs(),
                    sock.server
                ));
            }
            Err(e) => return Err(e),
        }
    }
}

/// `tools_list` on broker.sock as its client: brokerd offers at least one tool.
pub fn tools_list(sock: &Socket) -> Result<String, String> {
    let ids = resolve(&sock.user, &sock.group)?;
    match as_ids(ids, || {
        client::call(&sock.path, ANSWER, 1, Message::ToolsList {}, |_| {})
    }) {
        Ok(Ok(Message::Tools(t))) if !t.tools.is_empty() => {
            let names: Vec<&str> = t.tools.iter().map(|d| d.name.as_str()).collect();
            Ok(format!("{} tools: {}", names.len(), names.join(", ")))
        }
        Ok(Ok(Message::Tools(_))) => Err("brokerd offers no tool".into()),
        Ok(Ok(other)) => Err(format!("answered {}", other.kind())),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e),
    }
}

/// The provider inferproxy's configuration names (`[provider] kind`).
pub fn provider_kind(config: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| format!("cannot read {}: {e}", config.display()))?;
    let value: toml::Value =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", config.display()))?;
    value
        .get("provider")
        .and_then(|p| p.get("kind"))
        .and_then(|k| k.as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("{}: no [provider] kind", config.display()))
}

/// One turn as the owner on loop.sock, in a session of its own, asking the time: the
/// scripted model calls `time_now` through brokerd, and the turn ends with text.
pub fn scripted_turn(m: &Manifest, sock: &Socket) -> Result<String, String> {
    let ids = resolve(&m.owner.user, &m.owner.group)?;
    // Two checks in one second (the twin runs one, then one with --json) must not meet.
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let session = match SessionId::new(format!("device-check-{millis}-{}", std::process::id())) {
        Ok(s) => s,
        Err(e) => return Err(e.to_string()),
    };
    let style = Style {
        json: false,
        color: false,
    };
    let started = Instant::now();
    let log = as_ids(ids, || {
        chat::turn(
            &sock.path,
            &session,
            false,
            "What time is it?",
            style,
            &mut io::sink(),
            |_| {},
        )
    });
    let log = match log {
        Ok(Ok(log)) => log,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(e) => return Err(e),
    };
    if started.elapsed() > TURN {
        return Err(format!("the turn took {:?}", started.elapsed()));
    }
    let tool_ok = log.events.iter().any(|e| {
        matches!(
            e,
            TurnEvent::ToolResult {
                outcome: Outcome::Result,
                ..
            }
        )
    });
    let text = log
        .events
        .iter()
        .any(|e| matches!(e, TurnEvent::AssistantText { text } if !text.is_empty()));
    match (tool_ok, text) {
        (true, true) => Ok(format!(
            "session {}: a tool call answered through brokerd, and a reply",
            session.as_str()
        )),
        (false, _) => Err(format!(
            "session {}: no tool call was answered: {:?}",
            session.as_str(),
            log.events
        )),
        (true, false) => Err(format!("session {}: no reply text", session.as_str())),
    }
}

/// brokerd verifies the whole audit chain, asked as the owner on admin.sock.
pub fn audit_chain(m: &Manifest, sock: &Socket) -> Check {
    let verified = resolve(&m.owner.user, &m.owner.group)
        .and_then(|ids| health::verify_audit(&sock.path, Some(ids), ANSWER));
    health::audit_check(&verified)
}

/// `systemd-analyze security --threshold=<t>` of the installed unit: its exposure is at most
/// the module's target.
pub fn security(unit: &str, threshold: u32) -> Result<String, String> {
    let out = match Command::new("systemd-analyze")
        .args([
            "security",
            "--no-pager",
            &format!("--threshold={threshold}"),
            unit,
        ])
        .output()
    {
        Ok(o) => o,
        Err(e) => return Err(format!("cannot run systemd-analyze: {e}")),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let overall = text
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for "))
        .and_then(|(_, rest)| rest.split_once(": "))
        .and_then(|(_, v)| v.split_whitespace().next())
        .map(str::to_string);
    let target = format!("{}.{}", threshold / 10, threshold % 10);
    match (out.status.success(), overall) {
        (true, Some(level)) => Ok(format!("exposure {level}, at most {target}")),
        (false, Some(level)) => Err(format!("exposure {level}, over {target}")),
        (_, None) => Err(format!(
            "systemd-analyze security gave no exposure level: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}
