//! bxctl against a real brokerd on a temporary home: the approval view, approve and deny, audit
//! verify and tail, with and without `--json`, and the exit codes.

use bxtest::OutputBounded;
use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bxcore::deadline::Deadline;
use bxcore::{
    CallId, Envelope, Message, SessionId, ToolRequest, ToolResponse, read_frame, write_frame,
};
use serde_json::{Value, json};
use tempfile::TempDir;

const WAIT: Duration = bxtest::DEADLINE;
/// A build on a loaded machine may take long; it still ends.
const BUILD: Duration = Duration::from_secs(1800);

/// brokerd beside bxctl in the target directory; built once if this run has not built it.
fn brokerd_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = Path::new(env!("CARGO_BIN_EXE_bxctl")).with_file_name("brokerd");
        if !bin.exists() {
            let out = bxtest::run(
                Command::new(env!("CARGO")).args(["build", "-p", "brokerd", "--bin", "brokerd"]),
                "cargo build -p brokerd",
                BUILD,
            )
            .unwrap();
            assert!(out.status.success(), "{}", bxtest::said(&out));
        }
        bin
    })
}

struct Box_ {
    _dir: TempDir,
    home: PathBuf,
    child: Child,
}

impl Drop for Box_ {
    fn drop(&mut self) {
        bxtest::reap(&mut self.child);
    }
}

fn start(extra: &str) -> Box_ {
    let dir = TempDir::new().unwrap();
    let home = dir.path().canonicalize().unwrap();
    fs::create_dir(home.join("notes")).unwrap();
    let cfg = home.join("brokerd.toml");
    fs::write(
        &cfg,
        format!(
            "[paths]\nhome = {:?}\n[sandbox]\nrequire = false\n[[workspace.roots]]\npath = {:?}\nclass = \"private\"\nwritable = true\n{extra}",
            home.display().to_string(),
            home.join("notes").display().to_string()
        ),
    )
    .unwrap();
    let child = Command::new(brokerd_bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let b = Box_ {
        _dir: dir,
        home,
        child,
    };
    let until = Instant::now() + WAIT;
    while bxcore::client::ping(&b.home.join("run/owner-broker/admin.sock"), WAIT).is_err()
        || bxcore::client::ping(&b.home.join("run/loop-broker/broker.sock"), WAIT).is_err()
    {
        assert!(Instant::now() < until, "brokerd never answered");
        std::thread::sleep(Duration::from_millis(20));
    }
    b
}

fn bxctl(b: &Box_, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bxctl"))
        .arg("--home")
        .arg(&b.home)
        .args(args)
        .output_bounded()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A call that waits for the owner (the session is untrusted); its connection.
fn pending_call(b: &Box_, session: &str, content: &str) -> (UnixStream, String) {
    pending_write(b, session, "notes/out.txt", content)
}

/// A `workspace_write` of `rel` (under the home) that waits for the owner; its connection.
fn pending_write(b: &Box_, session: &str, rel: &str, content: &str) -> (UnixStream, String) {
    match write_frame_of(b, session, rel, content) {
        (s, Message::ToolResponse(ToolResponse::PendingApproval { approval, .. })) => {
            (s, approval.as_str().to_string())
        }
        (_, o) => panic!("{o:?}"),
    }
}

/// A `workspace_write` from an untrusted session: its connection and brokerd's first answer.
fn write_frame_of(b: &Box_, session: &str, rel: &str, content: &str) -> (UnixStream, Message) {
    fs::create_dir_all(b.home.join("broker/sessions")).unwrap();
    fs::write(
        b.home.join(format!("broker/sessions/{session}.json")),
        r#"{"taint":"private","untrusted":true}"#,
    )
    .unwrap();
    let mut s = UnixStream::connect(b.home.join("run/loop-broker/broker.sock")).unwrap();
    write_frame(
        &mut s,
        &Envelope::new(
            2,
            true,
            Message::ToolRequest(ToolRequest {
                session: SessionId::new(session).unwrap(),
                call: CallId(2),
                tool: "workspace_write".into(),
                args: json!({"path": b.home.join(rel).display().to_string(), "content": content}),
            }),
        ),
    )
    .unwrap();
    let msg = read_frame(&mut Deadline::within(&s, WAIT).unwrap())
        .unwrap()
        .msg;
    (s, msg)
}

fn final_of(s: &UnixStream) -> ToolResponse {
    let mut d = Deadline::within(s, WAIT).unwrap();
    match read_frame(&mut d).unwrap().msg {
        Message::ToolResponse(r) => r,
        o => panic!("{o:?}"),
    }
}

#[test]
fn approvals_shows_everything_the_owner_approves() {
    let b = start("");
    let (code, out, _) = bxctl(&b, &["approvals"]);
    assert_eq!((code, out.trim()), (0, "no approvals pending"));
    let (_s, id) = pending_call(&b, "s1", "the whole text");
    let (code, out, _) = bxctl(&b, &["approvals"]);
    assert_eq!(code, 0);
    for want in [
        format!("approval {id}"),
        "tool     workspace_write (call 2 of session s1)".to_string(),
        "taint private, untrusted".to_string(),
        "rule     untrusted-effect: ".to_string(),
        "digest   sha256 ".to_string(),
        "content  \"the whole text\"".to_string(),
        "left)".to_string(),
    ] {
        assert!(out.contains(&want), "{want:?} not in:\n{out}");
    }
    // Scripts get each approval whole, its arguments as the view shows them, in the list and
    // by id, `--json` before or after `show ID`.
    let (code, out, _) = bxctl(&b, &["approvals", "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["pending"][0]["approval"], id);
    assert_eq!(v["pending"][0]["args"]["content"], "the whole text");
    for args in [
        vec!["approvals", "--json", "show", &id],
        vec!["approvals", "show", &id, "--json"],
    ] {
        let (code, out, err) = bxctl(&b, &args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let a: Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(a["args"]["content"], "the whole text");
        assert_eq!(a["digest"], v["pending"][0]["digest"]);
        assert_eq!(a["digest"], bxcore::canonical::digest(&a["args"]));
        assert!(
            a["lease_scope"].as_str().unwrap().contains("root notes"),
            "{a}"
        );
    }
}

#[test]
fn one_huge_pending_write_does_not_hide_another_sessions_request() {
    // Beyond what an approval may show (256 KiB by default): denied at the door, never queued.
    let b = start("");
    let (s, first) = write_frame_of(&b, "s1", "notes/huge.txt", &"z".repeat(500_000));
    match first {
        Message::ToolResponse(ToolResponse::Denied { reason }) => assert!(
            reason.ends_with("see docs/runbook.md#approval-too-large"),
            "{:.300}",
            reason
        ),
        other => panic!("{:.300}", format!("{other:?}")),
    }
    drop(s);
    drop(b);
    // The most brokerd may show: almost 512 KiB waits beside another session's request.
    let b = start("[approvals]\nmax_args_bytes = 524288\n");
    let big = "q".repeat(500_000);
    let (_s1, big_id) = pending_write(&b, "s1", "notes/big.txt", &big);
    let (_s2, small_id) = pending_write(&b, "s2", "notes/out.txt", "small");
    let (code, out, err) = bxctl(&b, &["approvals"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("approval {small_id}")), "{out}");
    assert!(out.contains("content  \"small\""), "{out}");
    assert!(out.contains(&format!("approval {big_id}")), "{out}");
    let cut = format!(
        "\"{}\"… (500000 bytes, sha256 {}; whole: bxctl approvals show {big_id})",
        "q".repeat(160),
        bxcore::canonical::sha256_hex(big.as_bytes())
    );
    assert!(out.contains(&cut), "{out}");
    assert!(out.len() < 10_000, "the list shows the first bytes only");
    let (code, out, _) = bxctl(&b, &["approvals", "show", &big_id]);
    assert_eq!(code, 0);
    assert!(out.contains(&format!("content  \"{big}\"")), "whole");
    // A decided one is gone, the other still there.
    let (code, _, _) = bxctl(&b, &["deny", &big_id]);
    assert_eq!(code, 0);
    let (code, out, err) = bxctl(&b, &["approvals", "show", &big_id]);
    assert_eq!(code, 1);
    assert!(err.contains("no such pending approval"), "{out}{err}");
    // It says why it may be gone and where to read on, once.
    assert!(err.contains("answered already"), "{err}");
    assert_eq!(
        err.matches("see docs/runbook.md#approval-not-pending")
            .count(),
        1,
        "{err}"
    );
}

#[test]
fn a_urls_host_is_shown_apart_from_the_rest() {
    use bxctl::approvals::{show, url_host};
    assert_eq!(
        url_host("https://example.org/a?b"),
        Some(("example.org", None))
    );
    assert_eq!(
        url_host("HTTP://bank.example@evil.example:8443/login"),
        Some(("evil.example:8443", Some("bank.example")))
    );
    assert_eq!(url_host("notes/a.txt"), None);
    let a = bxcore::Approval {
        approval: bxcore::ApprovalId::new("0123456789abcdef").unwrap(),
        session: SessionId::new("s1").unwrap(),
        call: CallId(1),
        tool: "web_fetch".into(),
        args: json!({"url": "https://bank.example@evil.example/\u{202e}x"}),
        digest: "d".repeat(64),
        taint: bxcore::DataClass::Public,
        untrusted: true,
        rule: "r".into(),
        reason: "why".into(),
        lease_scope: "web_fetch calls in host evil.example".into(),
        requested: bxcore::Timestamp(0),
        expires: bxcore::Timestamp(1),
    };
    let out = show(&a, bxcore::Timestamp(0), false);
    assert!(
        out.contains("url  \"https://bank.example@evil.example/\\u{202e}x\"\n"),
        "{out}"
    );
    assert!(out.contains("     host \"evil.example\"\n"), "{out}");
    assert!(
        out.contains("     user info \"bank.example\" (not the host)\n"),
        "{out}"
    );
}

#[test]
fn the_approval_view_shows_controls_and_bidi_characters_escaped() {
    let b = start("");
    let (_s, _id) = pending_write(
        &b,
        "s1",
        "notes/\u{202e}txt.tsil-gnippohs",
        "a\u{1b}]52;c;cHduZWQ=\u{7}b\u{9b}2J\u{200b}\u{2028}\u{7f}\u{2066}",
    );
    let (code, out, _) = bxctl(&b, &["approvals"]);
    assert_eq!(code, 0);
    assert!(out.contains("notes/\\u{202e}txt.tsil-gnippohs"), "{out}");
    for raw in [
        '\u{1b}', '\u{7}', '\u{9b}', '\u{200b}', '\u{2028}', '\u{7f}', '\u{202e}', '\u{2066}',
    ] {
        assert!(!out.contains(raw), "{raw:?} reached the terminal:\n{out}");
    }
    for shown in [
        "\\u{9b}2J",
        "\\u{200b}",
        "\\u{2028}",
        "\\u{7f}",
        "\\u{2066}",
    ] {
        assert!(out.contains(shown), "{shown} not in:\n{out}");
    }
}

#[test]
fn approve_runs_the_call_and_deny_refuses_it() {
    let b = start("");
    let (s, id) = pending_call(&b, "s1", "yes");
    let (code, out, _) = bxctl(&b, &["approve", &id]);
    assert_eq!(
        (code, out.trim().to_string()),
        (0, format!("approved {id}"))
    );
    assert!(matches!(final_of(&s), ToolResponse::Result { .. }));
    assert_eq!(
        fs::read_to_string(b.home.join("notes/out.txt")).unwrap(),
        "yes"
    );

    let (s, id) = pending_call(&b, "s2", "no");
    let (code, out, _) = bxctl(&b, &["deny", &id, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Value>(out.trim()).unwrap(),
        json!({"approval": id, "allow": false, "lease": false})
    );
    assert_eq!(
        final_of(&s),
        ToolResponse::Denied {
            reason: "the owner denied it".into()
        }
    );
}

#[test]
fn a_decision_on_an_unknown_or_malformed_id_fails() {
    let b = start("");
    let (code, _, err) = bxctl(&b, &["approve", "0123456789abcdef"]);
    assert_eq!(code, 1);
    assert!(err.contains("no such pending approval"), "{err}");
    let (code, out, _) = bxctl(&b, &["deny", "0123456789abcdef", "--json"]);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["error"]["code"], "forbidden");
    let (code, _, err) = bxctl(&b, &["approve", "XYZ"]);
    assert_eq!(code, 1);
    assert!(err.contains("16 lowercase hex digits"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let b = start("");
    let (code, _, _) = bxctl(&b, &["approve"]);
    assert_eq!(code, 2);
    let (code, _, _) = bxctl(&b, &["frobnicate"]);
    assert_eq!(code, 2);
}

#[test]
fn audit_verify_and_tail() {
    let b = start("");
    let (s, id) = pending_call(&b, "s1", "x");
    bxctl(&b, &["deny", &id]);
    final_of(&s);
    let (code, out, _) = bxctl(&b, &["audit", "verify"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("records: 4"), "{out}");
    assert!(out.contains("the chain verifies"), "{out}");
    let (code, out, _) = bxctl(&b, &["audit", "verify", "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["head"].as_str().unwrap().len(), 64);

    let (code, out, _) = bxctl(&b, &["audit", "tail", "-n", "2"]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].contains("pending") && lines[0].contains("s1/2"),
        "{out}"
    );
    assert!(
        lines[1].contains("denied") && lines[1].contains("the owner denied it"),
        "{out}"
    );
    let (code, out, _) = bxctl(&b, &["audit", "tail", "-n", "10", "--json"]);
    assert_eq!(code, 0);
    let recs: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 4);
    assert_eq!(recs[0]["event"], "started");
    assert_eq!(recs[3]["seq"], 4);
}

#[test]
fn a_box_that_is_not_running_is_a_clear_failure() {
    let dir = TempDir::new().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_bxctl"))
        .arg("approvals")
        .arg("--admin")
        .arg(dir.path().join("nowhere.sock"))
        .output_bounded()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is brokerd running"), "{err}");
}

#[test]
fn boxmaker_home_is_the_default_home() {
    let b = start("");
    let out = Command::new(env!("CARGO_BIN_EXE_bxctl"))
        .env("BOXMAKER_HOME", &b.home)
        .args(["approvals", "--json"])
        .output_bounded()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        json!({"pending": []})
    );
}

#[test]
fn approvals_watch_prints_again_when_the_list_changes() {
    use std::io::{BufRead, BufReader};
    let b = start("");
    let mut child = Command::new(env!("CARGO_BIN_EXE_bxctl"))
        .arg("--home")
        .arg(&b.home)
        .args(["approvals", "--json", "--watch"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let first: Value = serde_json::from_str(&rx.recv_timeout(WAIT).unwrap()).unwrap();
    assert_eq!(first, json!({"pending": []}));
    let (_s, id) = pending_call(&b, "w", "watched");
    let second: Value = serde_json::from_str(&rx.recv_timeout(WAIT).unwrap()).unwrap();
    assert_eq!(second["pending"][0]["approval"], id);
    bxtest::reap(&mut child);
}

#[test]
fn an_error_that_quotes_a_daemon_reaches_the_terminal_escaped() {
    // A loop.sock that answers every turn with an error whose detail carries terminal controls.
    let dir = TempDir::new().unwrap();
    let home = dir.path().canonicalize().unwrap();
    let sock = bxcore::layout::LOOP.path(&home);
    fs::create_dir_all(sock.parent().unwrap()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let mut s = bxtest::accept(&listener, "bxctl chat");
        let req = read_frame(&mut Deadline::within(&s, WAIT).unwrap()).unwrap();
        write_frame(
            &mut s,
            &Envelope::error(
                req.id,
                bxcore::ErrorCode::Internal,
                "broke\u{1b}]0;owned\u{7}\u{1b}[2J\u{202e}",
            ),
        )
        .unwrap();
    });
    let out = Command::new(env!("CARGO_BIN_EXE_bxctl"))
        .arg("--home")
        .arg(&home)
        .args(["chat", "--session", "s1", "hello"])
        .output_bounded()
        .unwrap();
    bxtest::join(server, "the loop.sock double");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for raw in ['\u{1b}', '\u{7}', '\u{202e}'] {
        assert!(!err.contains(raw), "{raw:?} reached the terminal: {err:?}");
    }
    assert!(
        err.contains(r"broke\u{1b}]0;owned\u{7}\u{1b}[2J\u{202e}"),
        "{err}"
    );
}

#[test]
fn marks_lists_what_an_untrusted_session_wrote_and_clear_ends_a_mark_in_the_chain() {
    let b = start("");
    let (code, out, _) = bxctl(&b, &["marks"]);
    assert_eq!((code, out.trim()), (0, "no marks (of at most 4096)"));
    let (s, id) = pending_write(
        &b,
        "mail",
        "notes/ignore\u{1b}[2Jall.txt",
        "third-party words",
    );
    let (code, _, err) = bxctl(&b, &["approve", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(matches!(final_of(&s), ToolResponse::Result { .. }));
    let (code, out, _) = bxctl(&b, &["marks"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("notes/ignore\\u{1b}[2Jall.txt"),
        "escaped: {out}"
    );
    assert!(!out.contains('\u{1b}'), "{out}");
    assert!(out.contains("1 of at most 4096 marks"), "{out}");
    let (code, out, _) = bxctl(&b, &["marks", "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["marks"][0]["root"], "notes");
    let (code, _, err) = bxctl(&b, &["marks", "clear", "notes/nothing.txt"]);
    assert_ne!(code, 0);
    assert!(err.contains("no mark names"), "{err}");
    let (code, out, err) = bxctl(&b, &["marks", "clear", "notes/ignore\u{1b}[2Jall.txt"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("cleared "), "{out}");
    let (_, out, _) = bxctl(&b, &["marks"]);
    assert_eq!(out.trim(), "no marks (of at most 4096)");
    let chain = fs::read_to_string(b.home.join("broker/audit/chain.jsonl")).unwrap();
    assert!(chain.contains("\"event\":\"mark_cleared\""), "{chain}");
}
