//! `bxctl demo`: the dev box on a temporary home with the scripted provider and the shipped
//! demo script, then one conversation that shows, a line of explanation each, what the broker
//! does: a plain answer, a private read, a secret read that raises the session's taint, the web
//! refused to a secret session, an untrusted session's write approved by the owner, another
//! denied, and the audit chain verified; then what memoryd does with the turns: a private
//! session's turn filed to main memory, the untrusted sessions' turns quarantined, the secret
//! session's kept local, and a new session given the first back by recall. Every step is checked
//! from the frames, the broker's answers and memoryd's (`bxctl memory recent`), and the demo
//! fails on the first step that did not do what it says.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bxcore::client;
use bxcore::layout;
use bxcore::{
    ApprovalDecision, ApprovalId, DataClass, Label, Memory, MemoryRoute, Message, Outcome,
    SessionId, SessionQuery, TurnEvent,
};

use crate::chat::{self, Style, TurnLog};
use crate::dev::{self, DevHome, ModelFlags, Provider, UpOptions};
use crate::done::{Done, Ended, Failure};

/// The shipped demo script: its paths are relative to the workspace roots, as a real model's are.
pub const DEMO_SCRIPT: &str = include_str!("../scripts/demo.toml");

const ASK: Duration = Duration::from_secs(10);

/// How long a memory step waits for memoryd to have filed a turn.
const FILED: Duration = Duration::from_secs(60);

/// Why the demo failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("demo: {0}")]
    Setup(String),
    #[error("demo: the dev box did not come up: {0}")]
    Up(#[source] dev::DevError),
    /// A step did not do what it says.
    #[error("demo: step {n} ({title}) failed: {why}")]
    Step {
        n: usize,
        title: &'static str,
        why: String,
    },
    #[error("demo: the dev box did not go down: {0}")]
    Down(#[source] dev::DevError),
}

/// What one step of the conversation did.
#[derive(Debug, Clone)]
pub struct StepReport {
    pub title: &'static str,
    pub session: SessionId,
    pub turn: TurnLog,
    /// The approval the demo answered in this step, and how.
    pub approval: Option<(ApprovalId, bool)>,
}

/// The sessions of the conversation.
pub const SESSIONS: [&str; 3] = ["demo", "inbox-1", "inbox-2"];

/// The sessions of the memory steps: the one that tells the box something, and the later one
/// that has it recalled.
pub const MEMORY_SESSIONS: [&str; 2] = ["memory-1", "memory-2"];

/// What the owner tells the box in step 8, and step 11 recalls.
pub const REMEMBERED: &str = "Remember that my cat is called Biscuit.";

/// What the owner asks in step 11.
pub const RECALL_QUESTION: &str = "What is my cat called?";

struct Step {
    title: &'static str,
    explain: &'static str,
    session: &'static str,
    resume: bool,
    text: &'static str,
    /// How the owner answers an approval in this step.
    owner: Option<bool>,
}

const STEPS: [Step; 6] = [
    Step {
        title: "a plain answer",
        explain: "The model answers in words; no tool is involved, so the broker is not asked.",
        session: "demo",
        resume: false,
        text: "Hello, box.",
        owner: None,
    },
    Step {
        title: "a private file",
        explain: "The model reads notes/todo.txt, in a private root: the broker allows it, and \
                  the session's taint stays private.",
        session: "demo",
        resume: true,
        text: "What is on my todo list?",
        owner: None,
    },
    Step {
        title: "a secret file",
        explain: "The model reads secret/bank.txt, in a secret root: the broker allows it, and \
                  the session's taint rises to secret, for good.",
        session: "demo",
        resume: true,
        text: "What are my bank details?",
        owner: None,
    },
    Step {
        title: "the web from a secret session",
        explain: "The model asks for web_fetch. The public web may receive private data at \
                  most, and this session has read a secret: the broker denies it, and no \
                  approval could lift that.",
        session: "demo",
        resume: true,
        text: "What is the exchange rate today?",
        owner: None,
    },
    Step {
        title: "untrusted mail, then a write the owner approves",
        explain: "A new session reads a colleague's email from the inbox, a root of mail others \
                  wrote: the session becomes untrusted. When the model then wants to write a \
                  note, the broker asks the owner first; the demo, as the owner, approves.",
        session: "inbox-1",
        resume: false,
        text: "What does my colleague's email say?",
        owner: Some(true),
    },
    Step {
        title: "a prompt injection the owner denies",
        explain: "Another session reads an email that tells the model to write the bank PIN \
                  into the notes. The model tries; the broker asks the owner, who sees the \
                  whole arguments and denies it.",
        session: "inbox-2",
        resume: false,
        text: "What does the prize email say?",
        owner: Some(false),
    },
];

fn sid(s: &str) -> SessionId {
    SessionId::new(s).expect("the demo's session ids are valid")
}

/// The session's class and trust, as brokerd answers on state.sock.
pub fn session_state(home: &Path, session: &SessionId) -> Result<Label, String> {
    let msg = Message::SessionState(SessionQuery {
        session: session.clone(),
    });
    // As state.sock's client (memoryd's user, where the box has users per daemon).
    let target = DevHome::new(home).map_err(|e| format!("state.sock: {e}"))?;
    let answer = crate::target::as_client(&target, &layout::STATE, || {
        client::call(&layout::STATE.path(home), ASK, 1, msg, |_| {})
    })
    .map_err(|e| format!("state.sock: {e}"))?;
    match answer {
        Ok(Message::SessionStateReply(r)) => Ok(r),
        Ok(other) => Err(format!("state.sock answered {}", other.kind())),
        Err(e) => Err(format!("state.sock: {e}")),
    }
}

fn decide(home: &Path, approval: &ApprovalId, allow: bool) -> Result<(), String> {
    let msg = Message::ApprovalDecision(ApprovalDecision {
        approval: approval.clone(),
        allow,
        lease: false,
        approver: None,
    });
    match client::call(&layout::ADMIN.path(home), ASK, 1, msg, |_| {}) {
        Ok(Message::ApprovalAck(a)) if a.approval == *approval => Ok(()),
        Ok(other) => Err(format!("admin.sock answered {}", other.kind())),
        Err(e) => Err(format!("admin.sock: {e}")),
    }
}

fn results(log: &TurnLog) -> Vec<(Outcome, &str)> {
    log.events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::ToolResult { outcome, text, .. } => Some((*outcome, text.as_str())),
            _ => None,
        })
        .collect()
}

fn tools(log: &TurnLog) -> Vec<&str> {
    log.events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::ToolCall { tool, .. } => Some(tool.as_str()),
            _ => None,
        })
        .collect()
}

/// Run the conversation against the dev box at `home` (up, with the demo script), showing each
/// step on `out`. Returns what each step did.
pub fn conversation(home: &Path, out: &mut dyn Write) -> Result<Vec<StepReport>, DemoError> {
    let style = Style {
        json: false,
        color: false,
    };
    let loop_socket = layout::LOOP.path(home);
    let workspace = home.join("workspace");
    let mut reports = Vec::new();
    for (i, step) in STEPS.iter().enumerate() {
        let n = i + 1;
        let fail = |why: String| DemoError::Step {
            n,
            title: step.title,
            why,
        };
        let _ = writeln!(out, "\n{n}. {}\n   {}\n", step.title, step.explain);
        let session = sid(step.session);
        let mut answered: Option<Result<(ApprovalId, bool), String>> = None;
        let log = chat::turn(
            &loop_socket,
            &session,
            step.resume,
            step.text,
            style,
            out,
            |event| {
                if let (TurnEvent::ToolPending { approval, .. }, Some(allow)) = (event, step.owner)
                {
                    let r = decide(home, approval, allow).map(|()| (approval.clone(), allow));
                    answered = Some(r);
                }
            },
        )
        .map_err(|e| fail(e.to_string()))?;
        let approval = match answered {
            Some(Ok(a)) => Some(a),
            Some(Err(why)) => return Err(fail(format!("the owner's decision: {why}"))),
            None => None,
        };
        let state = session_state(home, &session).map_err(fail)?;
        let said = check(n, &log, &state, approval.as_ref(), &workspace).map_err(fail)?;
        let _ = writeln!(out, "   ✓ {said}");
        reports.push(StepReport {
            title: step.title,
            session,
            turn: log,
            approval,
        });
    }
    let _ = writeln!(
        out,
        "\n7. the audit chain\n   Every decision above was written, hash-chained and fsync'd, \
         before it took effect. brokerd verifies the whole chain:\n"
    );
    let report = match client::call(
        &layout::ADMIN.path(home),
        ASK,
        1,
        Message::AuditVerify {},
        |_| {},
    ) {
        Ok(Message::AuditReport(r)) => r,
        Ok(other) => {
            return Err(DemoError::Step {
                n: 7,
                title: "the audit chain",
                why: format!("admin.sock answered {}", other.kind()),
            });
        }
        Err(e) => {
            return Err(DemoError::Step {
                n: 7,
                title: "the audit chain",
                why: e.to_string(),
            });
        }
    };
    if !report.ok || report.records == 0 {
        return Err(DemoError::Step {
            n: 7,
            title: "the audit chain",
            why: format!(
                "{} records, ok {}: {}",
                report.records, report.ok, report.detail
            ),
        });
    }
    let _ = writeln!(
        out,
        "   ✓ {} records, every hash verified; head {}",
        report.records, report.head
    );
    memory_steps(home, style, out)?;
    Ok(reports)
}

/// The turns memoryd filed to `route`, as `bxctl memory recent --route ROUTE --json` lists them.
fn filed(home: &Path, route: MemoryRoute) -> Result<Vec<Memory>, String> {
    crate::memory::list_recent(
        &layout::MEMORIES.path(home),
        Some(route),
        // memoryd's most for one listing: the demo's turns are far fewer.
        1_000,
        ASK,
    )
    .map_err(|e| format!("memories.sock: {e}"))
}

/// Wait until turn `turn` of `session` is filed to `route`, within [`FILED`]; then check it is
/// filed to no other route.
fn wait_filed(home: &Path, route: MemoryRoute, session: &str, turn: u64) -> Result<Memory, String> {
    let is_it = |m: &Memory| m.session.as_str() == session && m.turn == turn;
    let until = Instant::now() + FILED;
    let found = loop {
        if let Some(m) = filed(home, route)?.into_iter().find(is_it) {
            break m;
        }
        if Instant::now() >= until {
            return Err(format!(
                "turn {turn} of session {session} was not filed to {route} within {} s",
                FILED.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for other in [
        MemoryRoute::Main,
        MemoryRoute::Quarantine,
        MemoryRoute::Local,
    ] {
        if other != route && filed(home, other)?.iter().any(is_it) {
            return Err(format!(
                "turn {turn} of session {session} is filed to {other} as well as to {route}"
            ));
        }
    }
    Ok(found)
}

/// Steps 8 to 11: where memoryd filed the turns, and a recall.
fn memory_steps(home: &Path, style: Style, out: &mut dyn Write) -> Result<(), DemoError> {
    let loop_socket = layout::LOOP.path(home);
    let step = |n: usize, title: &'static str, explain: &str, out: &mut dyn Write| {
        let _ = writeln!(out, "\n{n}. {title}\n   {explain}\n");
        move |why: String| DemoError::Step { n, title, why }
    };
    let say = |m: &Memory| {
        format!(
            "{} turn {} [{}, {}{}]",
            m.session,
            m.turn,
            m.route,
            m.class,
            if m.untrusted { ", untrusted" } else { "" }
        )
    };

    let fail = step(
        8,
        "memory: a private turn, filed to main memory",
        "A new session tells the box something. When the turn ends, loopd hands it to memoryd, \
         which asks the broker for the session's state: private and trusted, so the turn goes \
         to the owner's main memory, which later turns may recall.",
        out,
    );
    let (first, second) = (sid(MEMORY_SESSIONS[0]), sid(MEMORY_SESSIONS[1]));
    let log = chat::turn(&loop_socket, &first, false, REMEMBERED, style, out, |_| {})
        .map_err(|e| fail(e.to_string()))?;
    if !tools(&log).is_empty() {
        return Err(fail(format!("expected words only, got {:?}", log.events)));
    }
    let m = wait_filed(home, MemoryRoute::Main, first.as_str(), 1).map_err(fail)?;
    if m.class != DataClass::Private || m.untrusted || !m.text.contains(REMEMBERED) {
        return Err(fail(format!("filed as {}: {:?}", say(&m), m.text)));
    }
    let _ = writeln!(out, "   ✓ filed to main memory: {}", say(&m));

    let fail = step(
        9,
        "memory: untrusted sessions, quarantined",
        "The sessions of steps 5 and 6 read mail others wrote, so their turns went to \
         quarantine: the owner can list and search them, but they are never recalled into a \
         model's context, where the mail's words would pass for the owner's own.",
        out,
    );
    let mut said = Vec::new();
    for s in ["inbox-1", "inbox-2"] {
        let m = wait_filed(home, MemoryRoute::Quarantine, s, 1).map_err(fail)?;
        if !m.untrusted {
            return Err(fail(format!("filed as {}", say(&m))));
        }
        said.push(say(&m));
    }
    let _ = writeln!(out, "   ✓ quarantined: {}", said.join("; "));

    let fail = step(
        10,
        "memory: a secret session, kept local",
        "The first session read the bank details in step 3: its turns from then on are secret, \
         kept in the store on this device only (never sent to a memory server elsewhere) and \
         never recalled.",
        out,
    );
    let m = wait_filed(home, MemoryRoute::Local, "demo", 3).map_err(fail)?;
    if m.class != DataClass::Secret {
        return Err(fail(format!("filed as {}", say(&m))));
    }
    let _ = writeln!(out, "   ✓ kept local: {}", say(&m));

    let fail = step(
        11,
        "memory: recall in a new session",
        "A new session asks about the cat. Before the model is asked, loopd asks memoryd what \
         main memory holds about the question and puts it into the model's context, marked as \
         the owner's memory; the scripted model shows what it was given.",
        out,
    );
    let log = chat::turn(
        &loop_socket,
        &second,
        false,
        RECALL_QUESTION,
        style,
        out,
        |_| {},
    )
    .map_err(|e| fail(e.to_string()))?;
    let answer = log.text();
    let from = format!("[session {}, turn 1]", first.as_str());
    if !answer.contains(&from) || !answer.contains(REMEMBERED) {
        return Err(fail(format!(
            "the model was not given step 8's turn; it answered {answer:?}"
        )));
    }
    for never in [
        "[session inbox-1,",
        "[session inbox-2,",
        "[session demo, turn 3]",
    ] {
        if answer.contains(never) {
            return Err(fail(format!(
                "a quarantined or secret turn was recalled ({never}): {answer:?}"
            )));
        }
    }
    let state = session_state(home, &second).map_err(fail)?;
    if state.class != DataClass::Private || state.untrusted {
        return Err(fail(format!(
            "the recalling session is {} and untrusted {}, not private and trusted",
            state.class, state.untrusted
        )));
    }
    let _ = writeln!(
        out,
        "   ✓ step 8's turn was recalled into the new session's context; nothing quarantined or \
         secret was; the session is still private and trusted"
    );
    Ok(())
}

/// What step `n` must have done; the line that says it did.
fn check(
    n: usize,
    log: &TurnLog,
    state: &Label,
    approval: Option<&(ApprovalId, bool)>,
    workspace: &Path,
) -> Result<String, String> {
    let texts = log.text();
    let want_state = |class: DataClass, untrusted: bool| -> Result<(), String> {
        if state.class == class && state.untrusted == untrusted {
            Ok(())
        } else {
            Err(format!(
                "the session is {} and untrusted {}, not {class} and untrusted {untrusted}",
                state.class, state.untrusted
            ))
        }
    };
    let rs = results(log);
    match n {
        1 => {
            if texts.is_empty() || !tools(log).is_empty() {
                return Err(format!(
                    "expected words and no tool call, got {:?}",
                    log.events
                ));
            }
            want_state(DataClass::Private, false)?;
            Ok("the box answered in words; the session is private and trusted".into())
        }
        2 | 3 => {
            if tools(log) != ["workspace_read"] || rs.len() != 1 || rs[0].0 != Outcome::Result {
                return Err(format!(
                    "expected one allowed workspace_read, got {:?}",
                    log.events
                ));
            }
            if n == 2 {
                want_state(DataClass::Private, false)?;
                Ok("the read was allowed; the session's taint is still private".into())
            } else {
                want_state(DataClass::Secret, false)?;
                Ok("the read was allowed; the session's taint is now secret".into())
            }
        }
        4 => {
            if tools(log) != ["web_fetch"] || rs.len() != 1 || rs[0].0 != Outcome::Denied {
                return Err(format!(
                    "expected one denied web_fetch, got {:?}",
                    log.events
                ));
            }
            if !rs[0].1.contains("secret") {
                return Err(format!("the denial does not name the taint: {}", rs[0].1));
            }
            want_state(DataClass::Secret, false)?;
            Ok(format!("denied: {}", rs[0].1))
        }
        5 | 6 => {
            let allow = n == 5;
            if tools(log) != ["workspace_read", "workspace_write"] || rs.len() != 2 {
                return Err(format!(
                    "expected a read, then a write, got {:?}",
                    log.events
                ));
            }
            let pending = log
                .events
                .iter()
                .any(|e| matches!(e, TurnEvent::ToolPending { .. }));
            if !pending || approval.map(|a| a.1) != Some(allow) {
                return Err(format!(
                    "expected the write to wait for the owner, got {:?}",
                    log.events
                ));
            }
            want_state(DataClass::Private, true)?;
            let file = workspace.join(if allow {
                "notes/meeting.txt"
            } else {
                "notes/pin.txt"
            });
            if allow {
                if rs[1].0 != Outcome::Result || !file.is_file() {
                    return Err(format!(
                        "expected the approved write to happen, got {:?}",
                        rs[1]
                    ));
                }
                Ok(
                    "the session is untrusted; the owner approved the write, and the note is there"
                        .into(),
                )
            } else {
                if rs[1].0 != Outcome::Denied || file.exists() {
                    return Err(format!(
                        "expected the denied write not to happen, got {:?}",
                        rs[1]
                    ));
                }
                Ok(format!("answered \"{}\", and nothing was written", rs[1].1))
            }
        }
        _ => Err(format!("no step {n}")),
    }
}

/// The host on the demo box's allow-list: the secret session's fetch is refused by the policy
/// before it leaves, and the host is listed so that `web_fetch` is offered at all.
pub const WEB_HOST: &str = "example.org";

impl From<DemoError> for Failure {
    fn from(e: DemoError) -> Failure {
        Failure::failed(e.to_string())
    }
}

/// `bxctl demo`: the whole demo, on `out`.
pub fn run(out: &mut dyn Write) -> Ended {
    demo(out)?;
    Ok(Done)
}

/// The whole demo: up on a temporary home, the conversation, down.
pub fn demo(out: &mut dyn Write) -> Result<(), DemoError> {
    let setup = |what: &str| {
        let what = what.to_string();
        move |e: io::Error| DemoError::Setup(format!("{what}: {e}"))
    };
    let dir = tempfile::Builder::new()
        .prefix("boxmaker-demo-")
        .tempdir_in(std::env::temp_dir())
        .map_err(setup("cannot make a temporary home"))?;
    let home: PathBuf = dir.path().join("home");
    let script = dir.path().join("demo.toml");
    std::fs::write(&script, DEMO_SCRIPT).map_err(setup("cannot write the demo script"))?;
    // As root the daemons run as an unprivileged user, which must be able to enter the
    // temporary directory on its way to the home.
    if nix::unistd::geteuid().is_root() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(setup("cannot open the temporary directory"))?;
    }
    let _ = writeln!(
        out,
        "Starting a dev box on {} with the demo script.",
        home.display()
    );
    let opts = UpOptions {
        home: home.clone(),
        model: ModelFlags {
            provider: Some(Provider::Script),
            script: Some(script),
            ..ModelFlags::default()
        },
        honcho: dev::HonchoFlags::default(),
        web_hosts: vec![WEB_HOST.to_string()],
        matrix: None,
    };
    dev::up(&opts, out).map_err(DemoError::Up)?;
    let talk = conversation(&home, out);
    let _ = writeln!(out, "\nStopping the dev box.");
    let down = dev::down(&home, out);
    talk?;
    down.map_err(DemoError::Down)?;
    let _ = writeln!(out, "\ndemo: every step did what it says");
    Ok(())
}
