//! Issue 17, findings 3 and 7 (interactive chat), through a pseudo-terminal as a person types:
//! line editing and history (an arrow key recalls, never reaches the model as `^[[A`), `/help`,
//! `/sessions` and `/quit` never sent to the model, an approval answered inline with
//! `approve? [y/N/show]`, and hints that carry the `--home` bxctl was run with.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;

use boxmaker_e2e::{DEADLINE, DevBox, bin_dir};
use bxtest::Bounded;
use nix::pty::openpty;

const SCRIPT: &str = r#"
[[step]]
after = "user"
text = "Let me read that email."
tool_calls = [{ tool = "workspace_read", args = { path = "@WORKSPACE@/inbox/meeting.txt" } }]

[[step]]
after = "tool"
text = "I will note that down."
tool_calls = [{ tool = "workspace_write", args = { path = "@WORKSPACE@/notes/inline.txt", content = "noted\n" } }]

[[rule]]
text = "Fine."
"#;

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

#[test]
fn the_interactive_chat_edits_lines_keeps_commands_from_the_model_and_asks_approvals_inline() {
    let b = DevBox::new();
    let script = b.beside("script.toml");
    fs::write(&script, SCRIPT).unwrap();
    b.up(&["--script", script.to_str().unwrap()]);
    let state = b.beside("state");

    let pty = openpty(None, None).unwrap();
    let slave: OwnedFd = pty.slave;
    let mut cmd = Command::new(bin_dir().join("bxctl"));
    cmd.args(["chat", "--session", "p1", "--home"])
        .arg(b.home())
        .env_remove("BOXMAKER_HOME")
        .env("TERM", "xterm")
        .env("XDG_STATE_HOME", &state)
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
    let mut screen = Screen { text, master };

    let at = screen.wait_for("you> ", 0);
    screen.type_("/help\r");
    let at = screen.wait_for("/sessions", at);
    let at = screen.wait_for("you> ", at);
    screen.type_("/frobnicate\r");
    let at = screen.wait_for("is not a command", at);
    screen.type_("read my mail\r");
    let at = screen.wait_for("approve? [y/N/show]", at);
    let pending = screen.shown();
    let home = b.home_arg();
    assert!(
        pending.contains(&format!("--home {home}")),
        "the printed hint names the box: {pending}"
    );
    screen.type_("show\r");
    let at = screen.wait_for("digest", at);
    let at = screen.wait_for("approve? [y/N/show]", at);
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
