//! Issue 17, finding 2: Ctrl-C in `chat`, and a channel that hangs up, cancel the turn at the
//! next safe point. An in-flight model call is abandoned; a pending approval is withdrawn and
//! recorded as `withdrawn` in the chain (and the write never runs); the session takes the next
//! message at once, never `session_busy`.

use std::fs;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use boxmaker_e2e::{DEADLINE, DevBox, mail_then_write, said};
use bxtest::Bounded;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Wait for `child` to end within `DEADLINE`; its exit code and what it printed.
fn finish(child: Bounded) -> (Option<i32>, String) {
    let out = child.finish(DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    (out.status.code(), said(&out))
}

fn wait(what: &str, cond: impl FnMut() -> bool) {
    bxtest::wait_for(what, DEADLINE, cond);
}

/// A model server on loopback: the first request is read and never answered (a hanging model);
/// every later one is refused with a 400 at once.
fn hanging_model() -> (u16, mpsc::Receiver<()>, bxtest::Server) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    let mut held: Vec<TcpStream> = Vec::new();
    let mut first = true;
    let server = bxtest::Server::in_turn(listener, move |mut conn: TcpStream| {
        let mut buf = [0u8; 4096];
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = conn.read(&mut buf);
        if std::mem::take(&mut first) {
            held.push(conn);
            let _ = tx.send(());
        } else {
            use std::io::Write;
            let _ = conn.write_all(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 35\r\nconnection: close\r\n\r\n{\"error\":{\"message\":\"bad request\"}}",
            );
        }
    });
    (port, rx, server)
}

#[test]
fn ctrl_c_abandons_a_hanging_model_call_and_the_session_takes_the_next_message_at_once() {
    let (port, asked, _model) = hanging_model();
    let b = DevBox::new();
    let key = b.beside("key");
    fs::write(&key, "sk-test\n").unwrap();
    // inferproxy refuses a key file its group or others may read.
    fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let url = format!("http://127.0.0.1:{port}/v1");
    b.up(&[
        "--provider",
        "openai",
        "--base-url",
        &url,
        "--model",
        "m",
        "--api-key-file",
        key.to_str().unwrap(),
    ]);
    let chat = b.bxctl_in_background(&["chat", "--session", "c1", "hello"]);
    asked
        .recv_timeout(DEADLINE)
        .expect("the model server was asked");
    kill(Pid::from_raw(chat.id() as i32), Signal::SIGINT).unwrap();
    let (code, out) = finish(chat);
    assert_eq!(code, Some(130), "{out}");
    assert!(out.contains("the turn was cancelled"), "{out}");

    // The next message is taken at once: the model refuses it, which is a failed turn (exit
    // 1, the URL named), not `session_busy`.
    let out = b.bxctl(&["chat", "--session", "c1", "again"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let text = said(&out);
    assert!(!text.contains("session_busy"), "{text}");
    // Finding 5: one error chain, at the place it happened: the URL asked, one runbook entry.
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.starts_with("bxctl: the turn failed: the model call failed: "),
        "{err}"
    );
    assert_eq!(err.matches("see docs/runbook.md#").count(), 1, "{err}");

    let log = fs::read_to_string(b.home().join("loop/sessions/c1.jsonl")).unwrap();
    assert!(
        log.contains("\"cancelled\""),
        "the turn's end says cancelled: {log}"
    );
}

fn cancel_during_an_approval(signal: Signal) {
    let b = DevBox::new();
    b.up_with_script(
        &mail_then_write(
            "notes/cancelled.txt",
            "written
",
        ),
        &[],
    );
    let chat = b.bxctl_in_background(&["chat", "--session", "a1", "read my mail"]);
    wait("the write to wait for the owner", || b.pending().len() == 1);
    kill(Pid::from_raw(chat.id() as i32), signal).unwrap();
    let (code, out) = finish(chat);
    if signal == Signal::SIGINT {
        assert_eq!(code, Some(130), "{out}");
    }
    wait("the approval to be withdrawn", || b.pending().is_empty());
    let chain = fs::read_to_string(b.home().join("broker/audit/chain.jsonl")).unwrap();
    assert!(
        chain.contains("\"event\":\"withdrawn\""),
        "the chain records the withdrawal: {chain}"
    );
    // loopd ends the turn once brokerd has answered the withdrawn call: the session is free
    // when its log says so.
    let log = b.home().join("loop/sessions/a1.jsonl");
    wait("the cancelled turn to end", || {
        fs::read_to_string(&log).is_ok_and(|l| l.contains("\"cancelled\""))
    });
    let out = b.bxctl(&["chat", "--session", "a1", "never mind"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        !b.home().join("workspace/notes/cancelled.txt").exists(),
        "the withdrawn write never ran"
    );
    let out = b.bxctl(&["audit", "verify"]);
    assert!(out.status.success(), "{}", said(&out));
}

#[test]
fn ctrl_c_during_an_approval_withdraws_it_and_records_that_in_the_chain() {
    cancel_during_an_approval(Signal::SIGINT);
}

#[test]
fn a_channel_that_hangs_up_during_an_approval_withdraws_it_too() {
    cancel_during_an_approval(Signal::SIGKILL);
}
