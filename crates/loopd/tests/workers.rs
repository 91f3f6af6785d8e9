//! One worker process per live session, as the real loopd runs them: each session in a process
//! of its own, confined (its own seccomp filter on the monitor's, no new privileges); at most
//! `[workers] max` at once, the idle longest ended for a new session and a turn refused with
//! its pointer when none is idle; an idle worker ended; a worker that dies mid-turn costs that
//! turn only, and its session's next turn starts a new one.

mod support;

use std::sync::mpsc;
use std::thread;

use bxcore::{ErrorCode, Message};
use support::daemon::{Layout, Loopd, config};
use support::infer::{ScriptedInfer, Step};
use support::{error_code, last_msg, turn, wait_until};

/// The `loopd worker` processes whose parent is `monitor`: (pid, session), by session.
fn workers_of(monitor: u32) -> Vec<(u32, String)> {
    let mut out = bxharden::proc_status::children_running(monitor, "worker");
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

fn status_field(pid: u32, field: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

fn texts(n: usize) -> Vec<Step> {
    (0..n).map(|i| Step::Text(format!("answer {i}"))).collect()
}

#[test]
fn each_session_runs_in_a_confined_worker_of_its_own() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, texts(3));
    let d = Loopd::start(home.path(), &config(home.path(), ""));
    for (i, (s, resume)) in [("a", false), ("b", false), ("a", true)]
        .into_iter()
        .enumerate()
    {
        let frames = turn(&d.socket, i as u64, s, resume, "hi");
        assert!(
            matches!(last_msg(&frames), Message::TurnDone(_)),
            "{frames:?}"
        );
    }
    let workers = workers_of(d.pid());
    let sessions: Vec<&str> = workers.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        sessions,
        ["a", "b"],
        "one worker per session, kept between turns"
    );
    for (pid, s) in &workers {
        assert_eq!(status_field(*pid, "NoNewPrivs"), "1", "{s}");
        assert_eq!(status_field(*pid, "Seccomp"), "2", "{s}");
        // Its own filters on the monitor's: more than the monitor has.
        let mine: u32 = status_field(*pid, "Seccomp_filters").parse().unwrap();
        let monitor: u32 = status_field(d.pid(), "Seccomp_filters").parse().unwrap();
        assert!(mine > monitor, "{s}: {mine} filters, the monitor {monitor}");
    }
    let log = d.log_text();
    assert!(log.contains("seccomp loopd-worker"), "{log}");
}

#[test]
fn past_its_bound_the_idle_worker_longest_ends_and_with_none_idle_the_turn_is_refused() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let (go, gate) = mpsc::channel();
    let script = vec![
        Step::Text("a's first".to_string()),
        Step::Gate(
            "thinking".to_string(),
            gate,
            Box::new(Step::Text("b's, at last".to_string())),
        ),
        Step::Text("a's second".to_string()),
    ];
    let _infer = ScriptedInfer::start(&layout.infer, script);
    let d = Loopd::start(home.path(), &config(home.path(), "[workers]\nmax = 1\n"));
    let frames = turn(&d.socket, 1, "a", false, "hi");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    // b's turn ends a's idle worker, and holds the only one while its model thinks.
    let socket = d.socket.clone();
    let b = thread::spawn(move || turn(&socket, 2, "b", false, "hi"));
    wait_until("b's worker in place of a's", || {
        workers_of(d.pid()).iter().map(|w| w.1.as_str()).eq(["b"])
    });
    let frames = turn(&d.socket, 3, "a", true, "again");
    assert_eq!(error_code(&frames), ErrorCode::Unavailable);
    let Message::Error(e) = last_msg(&frames) else {
        unreachable!()
    };
    assert!(
        e.detail.ends_with("see docs/runbook.md#loopd-workers-full")
            && e.detail.contains("[workers] max"),
        "{}",
        e.detail
    );
    wait_until("the refusal in loopd's log", || {
        d.log_text()
            .contains("loopd: session a: loopd runs at most 1 session(s) at once")
    });
    go.send(()).unwrap();
    let frames = bxtest::join(b, "b's turn");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    // Free again: a's turn runs, in a worker that reads a's log afresh.
    let frames = turn(&d.socket, 4, "a", true, "again");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{frames:?}"
    );
    let log = std::fs::read_to_string(home.path().join("loop/sessions/a.jsonl")).unwrap();
    assert!(
        log.contains("a's first") && log.contains("a's second"),
        "{log}"
    );
}

#[test]
fn an_idle_worker_ends_and_its_session_s_next_turn_starts_another() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, texts(2));
    let d = Loopd::start(
        home.path(),
        &config(home.path(), "[workers]\nidle_seconds = 1\n"),
    );
    let frames = turn(&d.socket, 1, "a", false, "hi");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    wait_until("the idle worker to end", || workers_of(d.pid()).is_empty());
    let frames = turn(&d.socket, 2, "a", true, "again");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{frames:?}"
    );
    assert!(
        !d.log_text().contains("loopd-worker-failed"),
        "{}",
        d.log_text()
    );
}

#[test]
fn a_worker_killed_mid_turn_costs_that_turn_and_the_session_goes_on() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let (_go, gate) = mpsc::channel::<()>();
    let script = vec![
        Step::Gate(
            "thinking".to_string(),
            gate,
            Box::new(Step::Text("never".to_string())),
        ),
        Step::Text("the second turn".to_string()),
    ];
    let _infer = ScriptedInfer::start(&layout.infer, script);
    let d = Loopd::start(home.path(), &config(home.path(), ""));
    let socket = d.socket.clone();
    let first = thread::spawn(move || {
        let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        let msg = Message::Turn(bxcore::Turn {
            session: support::sid("a"),
            resume: false,
            text: "hi".to_string(),
        });
        bxcore::write_frame(&mut s, &bxcore::Envelope::new(1, true, msg)).unwrap();
        // The answer ends without its final frame: read until the connection closes.
        let until = std::time::Instant::now() + support::WAIT;
        let mut finals = 0;
        while let Ok(env) = bxcore::read_frame(&mut bxcore::deadline::Deadline::new(&s, until)) {
            finals += usize::from(env.last);
        }
        finals
    });
    wait_until("a's worker", || !workers_of(d.pid()).is_empty());
    let (pid, _) = workers_of(d.pid())[0].clone();
    // SAFETY: a signal to a process of this test's own making.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    assert_eq!(bxtest::join(first, "the cut turn"), 0, "no final frame");
    wait_until("the line for the worker", || {
        d.log_text()
            .contains("see docs/runbook.md#loopd-worker-failed")
    });
    let frames = turn(&d.socket, 2, "a", true, "again");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{frames:?}"
    );
}
