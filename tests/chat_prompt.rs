//! Issue 17, findings 3 and 7 (interactive chat), through a pseudo-terminal as a person types:
//! line editing and history (an arrow key recalls, never reaches the model as `^[[A`), `/help`,
//! `/sessions` and `/quit` never sent to the model, an approval answered inline with
//! `approve? [y/n/l/show]`, and hints that carry the `--home` bxctl was run with.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;

use boxmaker_e2e::{DEADLINE, DevBox, bin_dir, mail_then_write};
use bxtest::Bounded;
use nix::pty::openpty;

/// What the terminal showed so far, read by a thread from the pty's master side.
struct Screen {
    text: Arc<Mutex<String>>,
    master: fs::File,
}

impl Screen {
    fn wait_for(&self, needle: &str, after: usize) -> usize {
        let mut at = 0;
        bxtest::wait_for(
            &format!("the terminal to show {needle:?}"),
            DEADLINE,
            || {
                let t = self.text.lock().unwrap();
                match t[after.min(t.len())..].find(needle) {
                    Some(i) => {
                        at = after + i + needle.len();
                        true
                    }
                    None => false,
                }
            },
        );
        at
    }

    fn shown(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    fn len(&self) -> usize {
        self.text.lock().unwrap().len()
    }

    fn type_(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).unwrap();
        self.master.flush().unwrap();
    }
}

/// `bxctl chat --session SESSION` on a pseudo-terminal of its own, and what it shows.
fn chat_on_a_terminal(b: &DevBox, session: &str, state: &std::path::Path) -> (Bounded, Screen) {
    let pty = openpty(None, None).unwrap();
    let slave: OwnedFd = pty.slave;
    let mut cmd = Command::new(bin_dir().join("bxctl"));
    cmd.args(["chat", "--session", session, "--home"])
        .arg(b.home())
        .env_remove("BOXMAKER_HOME")
        .env("TERM", "xterm")
        .env("XDG_STATE_HOME", state)
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    let child = Bounded::spawn(&mut cmd, "bxctl chat on a terminal").unwrap();
    let master = fs::File::from(pty.master);
    let mut reader = master.try_clone().unwrap();
    let text = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&text);
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (child, Screen { text, master })
}

#[test]
fn the_interactive_chat_edits_lines_keeps_commands_from_the_model_and_asks_approvals_inline() {
    let b = DevBox::new();
    b.up_with_script(
        &mail_then_write(
            "notes/inline.txt",
            "noted
",
        ),
        &[],
    );
    let state = b.beside("state");
    let (child, mut screen) = chat_on_a_terminal(&b, "p1", &state);

    let at = screen.wait_for("you> ", 0);
    screen.type_("/help\r");
    let at = screen.wait_for("/sessions", at);
    let at = screen.wait_for("you> ", at);
    screen.type_("/frobnicate\r");
    let at = screen.wait_for("is not a command", at);
    screen.type_("read my mail\r");
    let at = screen.wait_for("approve? [y/n/l/show]", at);
    let pending = screen.shown();
    let home = b.home_arg();
    assert!(
        pending.contains(&format!("--home {home}")),
        "the printed hint names the box: {pending}"
    );
    screen.type_("show\r");
    let at = screen.wait_for("digest", at);
    let at = screen.wait_for("approve? [y/n/l/show]", at);
    screen.type_("y\r");
    let at = screen.wait_for("Fine.", at);
    let at = screen.wait_for("you> ", at);
    // The up arrow recalls the last message; Enter sends it again.
    screen.type_("\x1b[A\r");
    let at = screen.wait_for("Fine.", at);
    let at = screen.wait_for("you> ", at);
    screen.type_("/sessions\r");
    let at = screen.wait_for("p1", at);
    screen.wait_for("you> ", at);
    let before_quit = screen.len();
    screen.type_("/quit\r");
    let out = child.finish(DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        &screen.shown()[before_quit..]
    );

    let log = fs::read_to_string(b.home().join("loop/sessions/p1.jsonl")).unwrap();
    assert_eq!(
        log.matches(r#""text":"read my mail""#).count(),
        2,
        "the recalled line was sent as typed: {log}"
    );
    for never in [
        "/help",
        "/quit",
        "/sessions",
        "/frobnicate",
        "\\u001b",
        "^[",
    ] {
        assert!(!log.contains(never), "{never} reached the model: {log}");
    }
    assert_eq!(
        fs::read_to_string(b.home().join("workspace/notes/inline.txt")).unwrap(),
        "noted\n",
        "the call approved inline ran"
    );
    let history = state.join("boxmaker/chat-history");
    let mode = fs::metadata(&history).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
}

/// A model that thinks before each answer, as a local one does: the owner types on meanwhile.
fn thinking_model() -> bxtest::model::PacedModel {
    use bxtest::model::Paced;
    use std::time::Duration;
    let think = Duration::from_secs(4);
    bxtest::model::PacedModel::start(vec![
        Paced {
            silence: think,
            ..Paced::call(
                "workspace_read",
                serde_json::json!({"path": "inbox/meeting.txt"}),
            )
        },
        Paced::call(
            "workspace_write",
            serde_json::json!({"path": "notes/ahead.txt", "content": "noted\n"}),
        ),
        Paced::text("Fine."),
    ])
}

#[test]
fn a_line_typed_before_the_question_never_answers_an_approval() {
    let model = thinking_model();
    let b = DevBox::new();
    let url = model.base_url();
    b.up(&["--provider", "openai", "--base-url", &url, "--model", "m"]);
    let (child, mut screen) = chat_on_a_terminal(&b, "ahead", &b.beside("state"));
    let at = screen.wait_for("you> ", 0);
    screen.type_("read my mail\r");
    // While the model thinks, the owner types a `y` nobody asked for.
    let at = screen.wait_for("waiting for the model", at);
    screen.type_("y\r");
    let at = screen.wait_for("approve? [y/n/l/show]", at);
    // It was thrown away: the call still waits, and nothing was written.
    assert_eq!(b.pending().len(), 1, "{}", screen.shown());
    assert!(!b.home().join("workspace/notes/ahead.txt").exists());
    screen.type_("n\r");
    let at = screen.wait_for("denied", at);
    screen.wait_for("you> ", at);
    assert!(b.pending().is_empty());
    assert!(!b.home().join("workspace/notes/ahead.txt").exists());
    screen.type_("/quit\r");
    let out = child.finish(DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{}", screen.shown());
}

#[test]
fn anything_but_an_answer_leaves_the_approval_pending_for_bxctl_approve() {
    let b = DevBox::new();
    b.up_with_script(
        &mail_then_write(
            "notes/inline.txt",
            "noted
",
        ),
        &[],
    );
    let (child, mut screen) = chat_on_a_terminal(&b, "later", &b.beside("state"));
    let at = screen.wait_for("you> ", 0);
    screen.type_("read my mail\r");
    let at = screen.wait_for("approve? [y/n/l/show]", at);
    // `/quit` at the question is not a deny: the call waits for an answer from elsewhere.
    screen.type_("/quit\r");
    let at = screen.wait_for("not answered", at);
    let p = b.pending();
    assert_eq!(p.len(), 1, "{}", screen.shown());
    let id = p[0]["approval"].as_str().unwrap().to_string();
    let out = b.bxctl(&["approve", &id]);
    assert!(out.status.success(), "{}", boxmaker_e2e::said(&out));
    let at = screen.wait_for("Fine.", at);
    screen.wait_for("you> ", at);
    assert_eq!(
        fs::read_to_string(b.home().join("workspace/notes/inline.txt")).unwrap(),
        "noted\n"
    );
    screen.type_("/quit\r");
    let out = child.finish(DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{}", screen.shown());
}
