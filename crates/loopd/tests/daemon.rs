//! The real loopd binary: ping, a whole turn through its sockets, check, selftest, the peer
//! check, and the sandbox it runs in.

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bxcore::{CallId, Message, Outcome, TurnEvent};
use bxharden::proc_status::threads;
use serde_json::json;
use support::broker::{FakeBroker, tool};
use support::daemon::{Layout, Loopd, config, run};
use support::infer::{ScriptedInfer, Step};
use support::memory::FakeMemory;
use support::{channel_turn, last_msg, turn};

fn toml_path(p: &std::path::Path) -> String {
    format!("{:?}", p.display().to_string())
}

#[test]
fn ping_is_answered_by_loopd_with_its_version_and_protocol() {
    let home = support::home();
    Layout::new(home.path());
    let d = Loopd::start(home.path(), &config(home.path(), ""));
    let pong = bxcore::client::ping(&d.socket, support::WAIT).unwrap();
    assert_eq!(pong.daemon, "loopd");
    assert_eq!(pong.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(pong.protocol, bxcore::PROTOCOL_VERSION);
}

#[test]
fn a_turn_goes_through_the_broker_and_the_model_on_their_sockets() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let infer = ScriptedInfer::start(
        &layout.infer,
        vec![
            Step::Tools(vec![(
                "workspace_read".to_string(),
                json!({"path": "/srv/a.txt"}),
            )]),
            Step::Text("It says hello.".to_string()),
        ],
    );
    let broker = FakeBroker::ok(&layout.broker, vec![tool("workspace_read")]);
    let extra = format!("[broker]\nsocket = {}\n", toml_path(&layout.broker));
    let d = Loopd::start(home.path(), &config(home.path(), &extra));
    fs::write(home.path().join("loop/system.md"), "You are the box.").unwrap();
    fs::create_dir_all(home.path().join("loop/memory")).unwrap();
    fs::write(home.path().join("loop/memory/core.md"), "The owner is Ada.").unwrap();
    let frames = turn(&d.socket, 5, "real", false, "read a.txt");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{:?}",
        last_msg(&frames)
    );
    let events: Vec<TurnEvent> = frames
        .iter()
        .filter_map(|f| match &f.msg {
            Message::TurnEvent { event } => Some(event.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        events[1],
        TurnEvent::ToolResult {
            call: CallId(1),
            outcome: Outcome::Result,
            text: "ok workspace_read".to_string(),
            outage: None,
        }
    );
    let reqs = broker.tool_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].call, CallId(1));
    assert_eq!(reqs[0].session.as_str(), "real");
    let inferred = infer.requests();
    assert_eq!(inferred[0].slot, "main");
    assert!(matches!(&inferred[0].messages[0],
        bxcore::ChatMessage::System { text } if text.contains("You are the box.") && text.contains("The owner is Ada.")));
    assert_eq!(
        inferred[1].messages.last().unwrap(),
        &bxcore::ChatMessage::Tool {
            call: CallId(1),
            text: "ok workspace_read".to_string()
        }
    );
}

#[test]
fn check_prints_what_it_would_serve_and_refuses_a_bad_config() {
    let home = support::home();
    let (code, out) = run(home.path(), &config(home.path(), ""), "check");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("would serve turns on"), "{out}");
    assert!(out.contains("no tool broker is configured"), "{out}");
    assert!(out.trim_end().ends_with("check: ok"), "{out}");
    let (code, out) = run(
        home.path(),
        &config(home.path(), "[loop]\nrounds = 1\n"),
        "check",
    );
    assert_eq!(code, 1);
    assert!(out.starts_with("selftest: FAILED: "), "{out}");
    assert!(out.contains("unknown field"), "{out}");
}

#[test]
fn selftest_pings_every_configured_socket_and_lists_the_tools() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, vec![]);
    let broker = FakeBroker::ok(&layout.broker, vec![tool("a"), tool("b")]);
    let memory = FakeMemory::start(&layout.memory);
    let extra = format!(
        "[broker]\nsocket = {}\n[memory]\nsocket = {}\n",
        toml_path(&layout.broker),
        toml_path(&layout.memory)
    );
    let (code, out) = run(home.path(), &config(home.path(), &extra), "selftest");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("inferproxy 0.1.0 answers"), "{out}");
    assert!(out.contains("brokerd 0.1.0 answers"), "{out}");
    assert!(out.contains("memoryd 0.1.0 answers"), "{out}");
    assert!(out.contains("brokerd offers 2 tools"), "{out}");
    assert!(out.trim_end().ends_with("selftest: ok"), "{out}");
    // No model request was made, and nothing was filed.
    assert!(_infer.requests().is_empty());
    assert!(memory.filed().is_empty());
    assert!(broker.tool_requests().is_empty());
}

#[test]
fn selftest_fails_when_a_socket_is_served_by_the_wrong_daemon() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, vec![]);
    // memoryd's fake answers on the broker's socket.
    let _wrong = FakeMemory::start(&layout.broker);
    let extra = format!("[broker]\nsocket = {}\n", toml_path(&layout.broker));
    let (code, out) = run(home.path(), &config(home.path(), &extra), "selftest");
    assert_eq!(code, 1, "{out}");
    let line = out.lines().last().unwrap();
    assert!(line.starts_with("selftest: FAILED: "), "{line}");
    assert!(line.contains("not brokerd"), "{line}");
    assert!(line.ends_with("see docs/runbook.md#loopd-selftest-failed"));
}

#[test]
fn the_running_daemon_has_seccomp_and_no_new_privs_on_every_thread() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, vec![]);
    let d = Loopd::start(home.path(), &config(home.path(), ""));
    // A turn first: the threads it starts run under the same filter.
    let frames = turn(&d.socket, 1, "s", false, "hi");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    let threads = threads(d.pid()).unwrap();
    for t in &threads {
        assert_eq!(t.seccomp, 2, "{t}");
        assert!(t.no_new_privs, "{t}");
    }
    // The startup notice: the loopd profile, killing the process on any call off its list, so
    // every test that runs this binary runs under KillProcess.
    let log = d.log_text();
    let notice = log
        .lines()
        .find(|l| bxtest::without_time(l).starts_with("loopd: sandbox: "))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(notice.contains("seccomp loopd ("), "{notice}");
    assert!(notice.contains("otherwise kill)"), "{notice}");
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self").unwrap().uid() == 0
}

#[test]
fn as_root_it_drops_to_its_user_under_the_whole_sandbox() {
    if !is_root() {
        bxtest::skip("needs root");
        return;
    }
    let home = support::home();
    Layout::new(home.path());
    // The test home is given to nobody (uid 65534), and traversable to reach it.
    fs::set_permissions(home.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for entry in ["loop", "loop/sessions"] {
        std::os::unix::fs::chown(home.path().join(entry), Some(65534), Some(65534)).unwrap();
    }
    let extra = "[peers]\n\"loop.sock\" = [0]\n";
    let cfg = config(home.path(), extra).replace(
        "[sandbox]\nrequire = false\n",
        "[sandbox]\nuser = \"65534\"\ngroup = \"65534\"\n",
    );
    let d = Loopd::start(home.path(), &cfg);
    for t in threads(d.pid()).unwrap() {
        assert_eq!(t.problems(65534, 65534), Vec::<String>::new(), "{t}");
    }
    let pong = bxcore::client::ping(&d.socket, bxtest::DEADLINE).unwrap();
    assert_eq!(pong.daemon, "loopd");
}

#[test]
fn a_peer_not_in_peers_is_refused_with_forbidden_and_one_line() {
    // Serve only a uid that is not ours.
    let home2 = support::home();
    Layout::new(home2.path());
    let mut d = Loopd::spawn(
        home2.path(),
        &config(home2.path(), "[peers]\n\"loop.sock\" = [4242424]\n"),
        "serve",
    );
    support::wait_until("loopd to serve", || {
        assert!(d.running(), "{}", d.log_text());
        d.log_text().contains("serving turns on")
    });
    // The refusal comes before a byte is read: read it without sending anything.
    let c = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    let frames = support::read_all(&c);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].id, 0);
    assert_eq!(support::error_code(&frames), bxcore::ErrorCode::Forbidden);
    support::wait_until("the refusal line", || {
        d.log_text()
            .contains("see docs/runbook.md#socket-peer-refused")
    });
}

#[test]
fn a_damaged_session_is_refused_and_logged_with_its_anchor() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, vec![]);
    let d = Loopd::start(home.path(), &config(home.path(), ""));
    let frames = turn(&d.socket, 1, "s", false, "hi");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    let path = home.path().join("loop/sessions/s.jsonl");
    let text = fs::read_to_string(&path).unwrap();
    fs::write(&path, format!("{text}garbage\n{text}")).unwrap();
    let frames = turn(&d.socket, 2, "s", true, "again");
    assert_eq!(support::error_code(&frames), bxcore::ErrorCode::Internal);
    support::wait_until("the damaged line in the log", || {
        d.log_text().lines().any(|l| {
            bxtest::without_time(l).starts_with("loopd: session s: ")
                && l.ends_with("; see docs/runbook.md#session-log-damaged")
        })
    });
}

#[test]
fn a_turn_on_bridge_sock_runs_only_in_a_session_of_the_channels_prefix() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(
        &layout.infer,
        vec![Step::Text("Hello from the bridge.".to_string())],
    );
    let d = Loopd::start(home.path(), &config(home.path(), ""));
    let bridge = bxcore::layout::BRIDGE.path(home.path());
    // Another session's turn runs nothing, and says why with its pointer.
    let frames = channel_turn(&bridge, 3, "s1", false, "hello", "$e1");
    match last_msg(&frames) {
        Message::Error(e) => {
            assert_eq!(e.code, bxcore::ErrorCode::Forbidden);
            assert_eq!(
                e.detail,
                "the channel may run turns only in sessions named matrix-..., not s1; \
                 see docs/runbook.md#bridge-session-refused"
            );
        }
        o => panic!("{o:?}"),
    }
    assert!(!home.path().join("loop/sessions/s1.jsonl").exists());
    assert!(d.log_text().contains("runbook.md#bridge-session-refused"));
    // The channel's own session runs as on loop.sock.
    let frames = channel_turn(&bridge, 4, "matrix-00aa", false, "hello", "$e1");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{:?}",
        last_msg(&frames)
    );
    assert!(home.path().join("loop/sessions/matrix-00aa.jsonl").exists());
    // A plain `turn` is loop.sock's, not the channel's: refused, nothing run.
    let frames = turn(&bridge, 5, "matrix-00aa", true, "hello");
    assert_eq!(support::error_code(&frames), bxcore::ErrorCode::BadMessage);
}

#[test]
fn a_channel_message_handed_off_twice_runs_once_and_the_second_is_refused_turn_repeated() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let infer = ScriptedInfer::start(
        &layout.infer,
        vec![
            Step::Text("First answer.".to_string()),
            Step::Text("Second answer.".to_string()),
        ],
    );
    let broker = FakeBroker::ok(&layout.broker, vec![tool("workspace_read")]);
    let extra = format!("[broker]\nsocket = {}\n", toml_path(&layout.broker));
    let mut d = Loopd::start(home.path(), &config(home.path(), &extra));
    let bridge = bxcore::layout::BRIDGE.path(home.path());
    let frames = channel_turn(&bridge, 1, "matrix-00bb", false, "hello", "$ev1:hs");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{frames:?}"
    );
    // brokerd goes down: a repeated message is still answered as one, and asks it nothing.
    assert!(!broker.seen.lock().unwrap().requests.is_empty());
    drop(broker);
    let _ = fs::remove_file(&layout.broker);
    // The channel stopped before it remembered handing "$ev1:hs" off, and hands it off again.
    let frames = channel_turn(&bridge, 2, "matrix-00bb", true, "hello", "$ev1:hs");
    match last_msg(&frames) {
        Message::Error(e) => {
            assert_eq!(e.code, bxcore::ErrorCode::TurnRepeated);
            assert!(
                e.detail.contains("$ev1:hs")
                    && e.detail
                        .ends_with("see docs/runbook.md#channel-turn-repeated"),
                "{}",
                e.detail
            );
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(frames.len(), 1, "nothing streamed for a repeated message");
    assert_eq!(infer.requests().len(), 1, "the model is not asked again");
    let log = fs::read_to_string(home.path().join("loop/sessions/matrix-00bb.jsonl")).unwrap();
    let users = log
        .lines()
        .filter(|l| l.contains("\"type\":\"user\""))
        .count();
    assert_eq!(users, 1, "{log}");
    assert!(log.contains("\"key\":\"$ev1:hs\""), "{log}");
    assert!(d.log_text().contains("runbook.md#channel-turn-repeated"));
    // The key is kept across a restart of loopd (it is in the session log), and another message
    // of the room is a turn as ever.
    d.kill();
    let _broker = FakeBroker::ok(&layout.broker, vec![tool("workspace_read")]);
    let _d = Loopd::start(home.path(), &config(home.path(), &extra));
    let frames = channel_turn(&bridge, 3, "matrix-00bb", true, "hello", "$ev1:hs");
    assert_eq!(
        support::error_code(&frames),
        bxcore::ErrorCode::TurnRepeated
    );
    let frames = channel_turn(&bridge, 4, "matrix-00bb", true, "again", "$ev2:hs");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{frames:?}"
    );
    assert_eq!(infer.requests().len(), 2);
}

#[test]
fn a_descriptor_inherited_from_its_starter_is_closed_first_and_said() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let home = support::home();
    let layout = Layout::new(home.path());
    let _infer = ScriptedInfer::start(&layout.infer, vec![]);
    // A file of another's the starter held open for writing, handed down as descriptor 7.
    let held = fs::File::create(home.path().join("held-open")).unwrap();
    let raw = held.as_raw_fd();
    let cfg_path = home.path().join("loopd.toml");
    fs::write(&cfg_path, config(home.path(), "")).unwrap();
    let log = home.path().join("loopd-inherited.log");
    let mut cmd = bxtest::daemon_command(
        std::path::Path::new(env!("CARGO_BIN_EXE_loopd")),
        "serve",
        &cfg_path,
        &log,
    );
    // SAFETY: dup2 and fcntl only, between fork and exec: async-signal-safe, allocate nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(raw, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // dup2 onto itself (the file was opened as 7) keeps its close-on-exec flag: clear
            // it, so loopd is started holding 7 whatever number the file was given.
            if libc::fcntl(7, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut d = bxtest::Daemon::spawn_command(&mut cmd, &log);
    let socket = layout.channel.clone();
    d.wait_ready("loop.sock answering ping", || {
        bxcore::client::ping(&socket, Duration::from_secs(5)).is_ok()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let text = d.log_text();
    assert!(
        text.contains("loopd: closed descriptor 7 (")
            && text.contains("/held-open), which this daemon was started holding")
            && text.contains("see docs/runbook.md#descriptor-inherited"),
        "{text}"
    );
    // Its number may be given again to what loopd opens after (its stop pipe, a socket): the
    // file is what must be gone.
    let seven = fs::read_link(format!("/proc/{}/fd/7", d.pid()));
    assert!(
        !seven
            .as_ref()
            .is_ok_and(|p| p.to_string_lossy().ends_with("/held-open")),
        "the inherited file is still open in loopd as descriptor 7: {seven:?}"
    );
    // Whatever else the test runner handed down (a jobserver pipe) was closed too: each line
    // names a descriptor past stdio.
    for line in text.lines().filter(|l| l.contains("closed descriptor ")) {
        let fd: i32 = line["loopd: closed descriptor ".len()..]
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert!(fd > 2, "{line}");
    }
}
