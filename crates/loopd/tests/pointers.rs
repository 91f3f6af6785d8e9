//! Every fail-closed line loopd can print ends with `see docs/runbook.md#<anchor>`, and that
//! anchor has its entry (Meaning, Confirm, Fix) in docs/runbook.md.

mod support;

use std::io;
use std::path::{Path, PathBuf};

use bxcore::runbook::Anchored;
use loopd::baseline::{Baseline, BaselineError};
use loopd::broker_port::{not_configured_line, unavailable_line};
use loopd::session::{Session, SessionError};
use loopd::turn::TurnError;
use support::sid;

fn runbook() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/runbook.md"))
        .unwrap()
}

/// The line ends with a pointer whose entry exists and says what it means, how to confirm it
/// and how to fix it.
fn assert_points(line: &str, anchor: &str) {
    let pointer = format!("; see docs/runbook.md#{anchor}");
    assert!(
        line.ends_with(&pointer),
        "{line:?} does not end with {pointer:?}"
    );
    let book = runbook();
    let heading = format!("## {anchor}\n");
    let start = book
        .find(&heading)
        .unwrap_or_else(|| panic!("docs/runbook.md has no {heading:?}"));
    let body = &book[start + heading.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    for part in ["**Meaning.**", "**Confirm.**", "**Fix.**"] {
        assert!(body.contains(part), "## {anchor} has no {part}");
    }
}

#[test]
fn the_broker_lines_point_at_broker_unavailable() {
    assert_points(&unavailable_line("no answer in time"), "broker-unavailable");
    assert_points(&not_configured_line(), "broker-unavailable");
}

#[test]
fn the_torn_tail_line_points_at_session_log_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let id = sid("s");
    let mut s = Session::create(dir.path(), &id, "main", "").unwrap();
    s.sync().unwrap();
    drop(s);
    let path = dir.path().join("s.jsonl");
    let mut text = std::fs::read(&path).unwrap();
    text.extend_from_slice(b"{\"type\":\"user\",\"tu");
    std::fs::write(&path, text).unwrap();
    let lines = std::cell::RefCell::new(Vec::new());
    Session::open(dir.path(), &id, &|l| lines.borrow_mut().push(l.to_string())).unwrap();
    let lines = lines.into_inner();
    assert_eq!(
        lines,
        vec![format!(
            "loopd: {}: a torn last record was cut off; see docs/runbook.md#session-log-torn-tail",
            path.display()
        )]
    );
    assert_points(&lines[0], "session-log-torn-tail");
}

#[test]
fn session_errors_point_at_their_entries() {
    let torn = SessionError::Torn {
        path: PathBuf::from("/h/loop/sessions/s.jsonl"),
        line: 3,
        why: "the record does not parse".to_string(),
    };
    let torn = TurnError::Session(torn).line();
    assert_eq!(
        torn,
        "/h/loop/sessions/s.jsonl:3: the record does not parse; see docs/runbook.md#session-log-damaged"
    );
    assert_points(&torn, "session-log-damaged");
    let io = SessionError::Io(PathBuf::from("/h/x"), io::Error::other("disk full"));
    assert_points(&TurnError::Session(io).line(), "session-log-unwritable");
}

#[test]
fn baseline_errors_point_at_their_entries() {
    let core = BaselineError::Core(
        PathBuf::from("/h/loop/memory/core.md"),
        io::Error::from(io::ErrorKind::PermissionDenied),
    );
    assert!(core.to_string().starts_with("/h/loop/memory/core.md: "));
    assert_points(&core.pointed().to_string(), "core-memory-unreadable");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("system.md")).unwrap();
    let e = Baseline::assemble(dir.path(), "").unwrap_err();
    assert!(matches!(e, BaselineError::Read(..)));
    assert_points(&e.pointed().to_string(), "system-prompt-unreadable");
}

#[test]
fn turn_errors_point_at_their_entries() {
    assert_points(
        &TurnError::SessionFull {
            estimated: 10,
            budget: 5,
        }
        .line(),
        "session-full",
    );
    assert_points(&TurnError::TurnLimit(8).line(), "turn-limit");
    let infer = loopd::infer::InferError::Reply("x".to_string());
    assert_points(&TurnError::Infer(infer).line(), "inference-unavailable");
}

#[test]
fn the_selftest_failure_line_points_at_loopd_selftest_failed() {
    let home = support::home();
    let cfg = support::daemon::config(home.path(), "");
    let (code, out) = support::daemon::run(home.path(), &cfg, "selftest");
    assert_eq!(code, 1, "{out}");
    let line = out.lines().last().unwrap();
    assert!(line.starts_with("selftest: FAILED: "), "{line}");
    assert_points(line, "loopd-selftest-failed");
}

#[test]
fn the_daemon_s_refusals_point_at_their_entries() {
    // A configuration refused at start.
    let home = support::home();
    let mut d =
        support::daemon::Loopd::spawn(home.path(), "[paths]\nhome = \"relative\"\n", "serve");
    support::wait_until("loopd to refuse its configuration", || !d.running());
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("absolute"))
        .unwrap_or_else(|| panic!("{log}"));
    assert_points(line, "loopd-config-refused");
    // A state directory owned by nobody it knows: a file in its place.
    let home = support::home();
    std::fs::remove_dir_all(home.path().join("loop")).unwrap();
    std::fs::write(home.path().join("loop"), "").unwrap();
    let mut d = support::daemon::Loopd::spawn(
        home.path(),
        &support::daemon::config(home.path(), ""),
        "serve",
    );
    support::wait_until("loopd to refuse its state directory", || !d.running());
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("not a directory"))
        .unwrap_or_else(|| panic!("{log}"));
    assert_points(line, "state-dir-refused");
}

#[test]
fn a_model_failure_inferproxy_explains_is_shown_once_with_its_own_entry() {
    let detail = format!(
        "the provider cannot be reached: http://127.0.0.1:9/v1/chat/completions: refused; {}",
        bxcore::runbook::pointer("inference-unreachable")
    );
    let e =
        loopd::infer::InferError::Client(bxcore::client::ClientError::Remote(bxcore::WireError {
            code: bxcore::ErrorCode::Inference,
            detail: detail.clone(),
        }));
    assert_eq!(
        e.pointed().to_string(),
        format!("the model call failed: {detail}")
    );
    assert_eq!(e.anchor(), "inference-unreachable");
    assert_eq!(e.pointed().to_string().matches("see docs/").count(), 1);
}
