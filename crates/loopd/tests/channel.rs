//! The channel server on loop.sock: one turn in, events out as they happen, one final frame; one
//! turn per session at a time; the error mapping.

mod support;

use bxharden::daemon::DaemonConfig;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;

use bxcore::{
    CallId, Envelope, ErrorCode, Message, Outcome, ToolResponse, Turn, TurnEvent, Usage,
    write_frame,
};
use loopd::channel::Context;
use loopd::config::Config;
use loopd::infer::Client;
use loopd::tools::Registry;
use serde_json::json;
use support::fake_tools::FakeTools;
use support::infer::{ScriptedInfer, Step};
use support::{error_code, frame_of, last_msg, raw_exchange, sid, turn, wait_until};

struct Server {
    home: tempfile::TempDir,
    socket: PathBuf,
    infer: ScriptedInfer,
    tools: Arc<FakeTools>,
    ctx: Arc<Context>,
}

struct Shared(Arc<FakeTools>);

impl loopd::tools::ToolPort for Shared {
    fn call(
        &self,
        request: &bxcore::ToolRequest,
        on_pending: &mut dyn FnMut(&loopd::tools::Pending),
    ) -> ToolResponse {
        self.0.call(request, on_pending)
    }
    fn list(&self) -> Result<bxcore::Tools, String> {
        self.0.list()
    }
}

fn server_in(home: tempfile::TempDir, script: Vec<Step>, tools: FakeTools, extra: &str) -> Server {
    let cfg = Config::parse(&format!(
        "[paths]\nhome = {:?}\n{extra}\n",
        home.path().display().to_string()
    ))
    .unwrap();
    let infer = ScriptedInfer::start(&home.path().join("infer.sock"), script);
    let client = Client::new(infer.path.clone(), cfg.inference_timeout());
    let tools = Arc::new(tools);
    let ctx = Context::new(
        cfg,
        client,
        Box::new(Shared(Arc::clone(&tools))),
        Registry::new(),
    );
    let socket = home.path().join("loop.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let ctx = Arc::new(ctx);
    let limits = bxharden::serve::Limits::of(&bxcore::layout::LOOP);
    support::serve_turns(listener, Arc::clone(&ctx), limits);
    Server {
        home,
        socket,
        infer,
        tools,
        ctx,
    }
}

fn server(script: Vec<Step>, tools: FakeTools, extra: &str) -> Server {
    server_in(support::home(), script, tools, extra)
}

fn events(frames: &[Envelope]) -> Vec<TurnEvent> {
    frames
        .iter()
        .filter_map(|f| match &f.msg {
            Message::TurnEvent { event } => Some(event.clone()),
            _ => None,
        })
        .collect()
}

fn session_log(s: &Server, id: &str) -> String {
    std::fs::read_to_string(s.home.path().join(format!("loop/sessions/{id}.jsonl"))).unwrap()
}

#[test]
fn a_turn_streams_its_events_as_they_happen_then_turn_done() {
    let mut tools = FakeTools::new(&[("workspace_read", FakeTools::ok("the notes"))]);
    tools.pending = vec!["workspace_read".to_string()];
    let s = server(
        vec![
            Step::Tools(vec![
                ("time_now".to_string(), json!({})),
                ("workspace_read".to_string(), json!({"path": "/srv/a.txt"})),
            ]),
            Step::Text("Hello there".to_string()),
        ],
        tools,
        "",
    );
    let frames = turn(&s.socket, 7, "s1", false, "hi");
    for f in &frames {
        assert_eq!(f.id, 7);
        assert_eq!(f.v, bxcore::PROTOCOL_VERSION);
    }
    let (last, interim) = frames.split_last().unwrap();
    assert!(last.last);
    assert!(interim.iter().all(|f| !f.last));
    assert_eq!(
        last.msg,
        Message::TurnDone(bxcore::TurnDone {
            session: sid("s1"),
            usage: Usage {
                input_tokens: 20,
                output_tokens: 4
            }
        })
    );
    let ev = events(&frames);
    assert!(
        matches!(&ev[0], TurnEvent::ToolCall { call: CallId(1), tool, .. } if tool == "time_now")
    );
    assert!(
        matches!(&ev[1], TurnEvent::ToolResult { call: CallId(1), outcome: Outcome::Result, text, outage: None } if text.contains("unix_ms"))
    );
    assert!(
        matches!(&ev[2], TurnEvent::ToolCall { call: CallId(2), tool, args } if tool == "workspace_read" && args == &json!({"path": "/srv/a.txt"}))
    );
    assert!(
        matches!(&ev[3], TurnEvent::ToolPending { call: CallId(2), approval, .. } if approval.as_str() == "00112233aabbccdd")
    );
    assert_eq!(
        ev[4],
        TurnEvent::ToolResult {
            call: CallId(2),
            outcome: Outcome::Result,
            text: "the notes".to_string(),
            outage: None,
        }
    );
    let text: Vec<&str> = ev[5..]
        .iter()
        .map(|e| match e {
            TurnEvent::AssistantText { text } => text.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(text, vec!["Hell", "o th", "ere"]);
    // Only the broker's tool went to the port; the core tool ran in loopd.
    let seen = s.tools.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].call, CallId(2));
    assert_eq!(seen[0].session, sid("s1"));
    // The model was offered the core tools and the port's.
    let offered: Vec<String> = s.infer.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(offered, vec!["time_now", "session_info", "workspace_read"]);
}

#[test]
fn a_malformed_first_frame_is_answered_with_its_code_and_the_server_goes_on() {
    let s = server(vec![], FakeTools::default(), "");
    let too_long = (bxcore::MAX_FRAME as u32 + 1).to_be_bytes().to_vec();
    let mut not_utf8 = 2u32.to_be_bytes().to_vec();
    not_utf8.extend_from_slice(&[0xc3, 0x28]);
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        ("zero length", vec![0, 0, 0, 0], ErrorCode::BadFrame),
        ("over MAX_FRAME", too_long, ErrorCode::BadFrame),
        ("not UTF-8", not_utf8, ErrorCode::BadFrame),
        ("not JSON", frame_of("{not json"), ErrorCode::BadMessage),
        (
            "another version",
            frame_of(r#"{"v":9,"id":3,"final":true,"msg":{"kind":"ping"}}"#),
            ErrorCode::BadVersion,
        ),
        (
            "an unknown key",
            frame_of(
                r#"{"v":1,"id":3,"final":true,"msg":{"kind":"turn","session":"s","resume":false,"text":"x","extra":1}}"#,
            ),
            ErrorCode::BadMessage,
        ),
        (
            "an invalid session id",
            frame_of(
                r#"{"v":1,"id":3,"final":true,"msg":{"kind":"turn","session":"../etc","resume":false,"text":"x"}}"#,
            ),
            ErrorCode::BadMessage,
        ),
    ];
    for (what, bytes, code) in cases {
        let env = raw_exchange(&s.socket, &bytes);
        assert_eq!(env.id, 0, "{what}");
        assert!(env.last, "{what}");
        match env.msg {
            Message::Error(e) => assert_eq!(e.code, code, "{what}: {}", e.detail),
            other => panic!("{what}: {other:?}"),
        }
    }
    // A frame cut short: the length says 100, 5 bytes come, then the writer closes.
    let mut c = UnixStream::connect(&s.socket).unwrap();
    let mut bytes = 100u32.to_be_bytes().to_vec();
    bytes.extend_from_slice(b"{\"v\":");
    c.write_all(&bytes).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let frames = support::read_all(&c);
    assert_eq!(error_code(&frames), ErrorCode::BadFrame);
    // Nothing was created, and the server still serves.
    assert!(
        std::fs::read_dir(s.home.path().join("loop/sessions"))
            .unwrap()
            .next()
            .is_none()
    );
    let frames = turn(&s.socket, 1, "after", false, "hi");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
}

#[test]
fn a_kind_other_than_turn_is_bad_message_with_the_request_id() {
    let s = server(vec![], FakeTools::default(), "");
    let mut c = UnixStream::connect(&s.socket).unwrap();
    write_frame(&mut c, &Envelope::new(12, true, Message::ToolsList {})).unwrap();
    let frames = support::read_all(&c);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].id, 12);
    assert_eq!(error_code(&frames), ErrorCode::BadMessage);
}

#[test]
fn a_busy_session_is_refused_with_session_busy_and_others_go_on() {
    let (tx, rx) = mpsc::channel();
    let s = server(
        vec![Step::Gate(
            "thinking".to_string(),
            rx,
            Box::new(Step::Text("first".to_string())),
        )],
        FakeTools::default(),
        "",
    );
    // The first turn streams one delta and waits in inference.
    let mut first = UnixStream::connect(&s.socket).unwrap();
    write_frame(
        &mut first,
        &Envelope::new(
            1,
            true,
            Message::Turn(Turn {
                session: sid("busy"),
                resume: false,
                text: "one".to_string(),
            }),
        ),
    )
    .unwrap();
    let env = bxcore::read_frame(&mut bxcore::deadline::Deadline::new(
        &first,
        std::time::Instant::now() + support::WAIT,
    ))
    .unwrap();
    assert!(matches!(env.msg, Message::TurnEvent { .. }));
    // The same session meanwhile: busy, whichever `resume` it asks.
    let frames = turn(&s.socket, 2, "busy", true, "two");
    assert_eq!(error_code(&frames), ErrorCode::SessionBusy);
    assert_eq!(frames[0].id, 2);
    let frames = turn(&s.socket, 3, "busy", false, "two");
    assert_eq!(error_code(&frames), ErrorCode::SessionBusy);
    // Another session runs.
    let frames = turn(&s.socket, 4, "other", false, "three");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    tx.send(()).unwrap();
    let rest = support::read_all(&first);
    assert!(matches!(last_msg(&rest), Message::TurnDone(_)));
}

#[test]
fn resume_and_create_are_checked() {
    let s = server(vec![], FakeTools::default(), "");
    let frames = turn(&s.socket, 1, "s1", true, "hello");
    assert_eq!(error_code(&frames), ErrorCode::NoSuchSession);
    assert!(!s.home.path().join("loop/sessions/s1.jsonl").exists());
    let frames = turn(&s.socket, 2, "s1", false, "hello");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    let before = session_log(&s, "s1");
    let frames = turn(&s.socket, 3, "s1", false, "again");
    assert_eq!(error_code(&frames), ErrorCode::SessionExists);
    assert_eq!(
        session_log(&s, "s1"),
        before,
        "a refused create changes nothing"
    );
    let frames = turn(&s.socket, 4, "s1", true, "again");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
}

#[test]
fn the_next_turn_finds_the_session_free_the_moment_the_final_frame_is_read() {
    for run in 0..10 {
        let s = server(vec![], FakeTools::default(), "");
        let frames = turn(&s.socket, 1, "s", false, "first");
        assert!(
            matches!(last_msg(&frames), Message::TurnDone(_)),
            "run {run}"
        );
        for i in 0..5 {
            let frames = turn(&s.socket, 2 + i, "s", true, "next");
            assert!(
                matches!(last_msg(&frames), Message::TurnDone(_)),
                "run {run}, turn {i}: {:?}",
                last_msg(&frames)
            );
        }
    }
}

#[test]
fn a_full_session_is_session_full() {
    let s = server(
        vec![],
        FakeTools::default(),
        "[loop]\ncontext_tokens = 10\n",
    );
    let frames = turn(&s.socket, 1, "s", false, "hello there, this is long enough");
    assert_eq!(error_code(&frames), ErrorCode::SessionFull);
    assert!(s.infer.requests().is_empty(), "no model call was made");
}

#[test]
fn a_turn_past_its_rounds_is_turn_limit() {
    let s = server(
        vec![
            Step::Tools(vec![("time_now".to_string(), json!({}))]),
            Step::Tools(vec![("time_now".to_string(), json!({}))]),
        ],
        FakeTools::default(),
        "[loop]\nmax_tool_rounds = 2\n",
    );
    let frames = turn(&s.socket, 1, "s", false, "loop");
    assert_eq!(error_code(&frames), ErrorCode::TurnLimit);
    assert_eq!(s.infer.requests().len(), 2);
    // The log ends the turn with its code.
    let log = session_log(&s, "s");
    assert!(
        log.lines()
            .last()
            .unwrap()
            .contains(r#""error":"turn_limit""#),
        "{log}"
    );
}

#[test]
fn an_inference_failure_is_inference() {
    for step in [
        Step::Error(ErrorCode::Inference, "the provider said 500".to_string()),
        Step::BadIds,
        Step::Close,
    ] {
        let s = server(vec![step], FakeTools::default(), "");
        let frames = turn(&s.socket, 1, "s", false, "hi");
        assert_eq!(error_code(&frames), ErrorCode::Inference);
        let Message::Error(e) = last_msg(&frames) else {
            unreachable!()
        };
        assert!(
            e.detail
                .ends_with("see docs/runbook.md#inference-unavailable"),
            "{}",
            e.detail
        );
        // The session is whole and takes the next turn.
        let frames = turn(&s.socket, 2, "s", true, "again");
        assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    }
}

#[test]
fn no_inference_socket_is_inference() {
    let home = support::home();
    let s = server_in(home, vec![], FakeTools::default(), "");
    std::fs::remove_file(&s.infer.path).unwrap();
    let frames = turn(&s.socket, 1, "s", false, "hi");
    assert_eq!(error_code(&frames), ErrorCode::Inference);
}

#[test]
fn a_damaged_session_log_is_internal_with_its_line() {
    let s = server(vec![], FakeTools::default(), "");
    let frames = turn(&s.socket, 1, "s", false, "hi");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    let path = s.home.path().join("loop/sessions/s.jsonl");
    let mut lines: Vec<String> = session_log(&s, "s").lines().map(String::from).collect();
    lines.insert(1, "{damaged".to_string());
    let damaged = lines.join("\n") + "\n";
    std::fs::write(&path, &damaged).unwrap();
    let frames = turn(&s.socket, 2, "s", true, "again");
    assert_eq!(error_code(&frames), ErrorCode::Internal);
    let Message::Error(e) = last_msg(&frames) else {
        unreachable!()
    };
    assert!(
        e.detail.starts_with(&format!("{}:2: ", path.display())),
        "{}",
        e.detail
    );
    assert!(
        e.detail
            .ends_with("; see docs/runbook.md#session-log-damaged")
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        damaged,
        "left as it was"
    );
}

#[test]
fn an_unreadable_core_memory_is_internal_and_creates_nothing() {
    let s = server(vec![], FakeTools::default(), "");
    // A directory where the file should be cannot be read, whoever runs the test.
    std::fs::create_dir_all(s.home.path().join("loop/memory/core.md")).unwrap();
    let frames = turn(&s.socket, 1, "s", false, "hi");
    assert_eq!(error_code(&frames), ErrorCode::Internal);
    let Message::Error(e) = last_msg(&frames) else {
        unreachable!()
    };
    assert!(
        e.detail
            .ends_with("; see docs/runbook.md#core-memory-unreadable"),
        "{}",
        e.detail
    );
    assert!(!s.home.path().join("loop/sessions/s.jsonl").exists());
}

#[test]
fn the_channel_going_away_mid_turn_cancels_it_with_its_log_whole_and_the_session_free() {
    let (tx, rx) = mpsc::channel();
    let s = server(
        vec![
            Step::Gate(
                "thinking".to_string(),
                rx,
                Box::new(Step::Tools(vec![("time_now".to_string(), json!({}))])),
            ),
            Step::Text("the rest of a long answer".to_string()),
        ],
        FakeTools::default(),
        "",
    );
    {
        let mut c = UnixStream::connect(&s.socket).unwrap();
        write_frame(
            &mut c,
            &Envelope::new(
                1,
                true,
                Message::Turn(Turn {
                    session: sid("gone"),
                    resume: false,
                    text: "hi".to_string(),
                }),
            ),
        )
        .unwrap();
        let env = bxcore::read_frame(&mut bxcore::deadline::Deadline::new(
            &c,
            std::time::Instant::now() + support::WAIT,
        ))
        .unwrap();
        assert!(matches!(env.msg, Message::TurnEvent { .. }));
    } // the channel goes away: the turn is cancelled (docs/protocol.md, "Cancelling")
    // The model call in flight is abandoned; the fake model may have given up already.
    let _ = tx.send(());
    let path = s.home.path().join("loop/sessions/gone.jsonl");
    wait_until("the turn to end in the log", || {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .contains("turn_end")
    });
    let log = std::fs::read_to_string(&path).unwrap();
    for line in log.lines() {
        serde_json::from_str::<loopd::session::Record>(line).unwrap();
    }
    assert!(log.ends_with('\n'));
    assert!(
        log.contains(r#""error":"cancelled""#),
        "the turn ended cancelled: {log}"
    );
    // The model's answer may have come in before the cancel was seen: its call was then not
    // started, but recorded as failed.
    assert!(
        !log.contains(r#""tool":"time_now""#) || log.contains(loopd::turn::CANCELLED_CALL),
        "no tool call was started after the cancel: {log}"
    );
    // The session is free once the turn's end is written and its busy mark released (no final
    // frame tells a channel that went away).
    wait_until("the session to be free", || !s.ctx.is_busy(&sid("gone")));
    let mut frames = Vec::new();
    wait_until("the session to take the next turn", || {
        frames = turn(&s.socket, 2, "gone", true, "still there?");
        !matches!(last_msg(&frames), Message::Error(e) if e.code == ErrorCode::SessionBusy)
    });
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{:?}",
        last_msg(&frames)
    );
}

#[test]
fn call_ids_are_unique_across_turns_and_a_new_server_on_the_same_home() {
    let script = || {
        vec![
            Step::Tools(vec![
                ("time_now".to_string(), json!({})),
                ("session_info".to_string(), json!({})),
            ]),
            Step::Text("ok".to_string()),
        ]
    };
    let s = server(script(), FakeTools::default(), "");
    turn(&s.socket, 1, "ids", false, "one");
    let reqs = s.infer.requests();
    assert_eq!(reqs[0].first_call, CallId(1));
    assert_eq!(reqs[1].first_call, CallId(3));
    // A new server (a restart) on the same home goes on from the log.
    let Server { home, .. } = s;
    std::fs::remove_file(home.path().join("loop.sock")).unwrap();
    std::fs::remove_file(home.path().join("infer.sock")).unwrap();
    let s2 = server_in(home, script(), FakeTools::default(), "");
    turn(&s2.socket, 2, "ids", true, "two");
    let reqs = s2.infer.requests();
    assert_eq!(reqs[0].first_call, CallId(3));
    assert_eq!(reqs[1].first_call, CallId(5));
}

#[test]
fn a_tool_that_was_not_offered_fails_without_reaching_the_port() {
    let s = server(
        vec![Step::Tools(vec![("rm_rf".to_string(), json!({}))])],
        FakeTools::default(),
        "",
    );
    let frames = turn(&s.socket, 1, "s", false, "hi");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
    let ev = events(&frames);
    assert!(
        matches!(&ev[1], TurnEvent::ToolResult { outcome: Outcome::Failed, text, .. } if text.contains("rm_rf"))
    );
    assert!(s.tools.seen.lock().unwrap().is_empty());
}

#[test]
fn a_connection_that_closes_before_a_frame_gets_no_answer() {
    use std::io::Read;
    let s = server(vec![], FakeTools::default(), "");
    let mut c = UnixStream::connect(&s.socket).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    c.set_read_timeout(Some(support::WAIT)).unwrap();
    let mut buf = Vec::new();
    c.read_to_end(&mut buf).unwrap(); // bounded: the read timeout above
    assert!(buf.is_empty(), "{buf:?}");
    let frames = turn(&s.socket, 1, "s", false, "hi");
    assert!(matches!(last_msg(&frames), Message::TurnDone(_)));
}

#[test]
fn an_event_too_large_for_a_frame_is_sent_without_its_bulk_and_the_turn_goes_on() {
    let big = "x".repeat(bxcore::MAX_FRAME);
    let s = server(
        vec![Step::Tools(vec![("huge".to_string(), json!({}))])],
        FakeTools::new(&[("huge", FakeTools::ok(&big))]),
        "[loop]\ncontext_tokens = 100000000\n",
    );
    let frames = turn(&s.socket, 1, "s", false, "hi");
    let ev = events(&frames);
    assert!(
        matches!(&ev[1], TurnEvent::ToolResult { outcome: Outcome::Result, text, .. }
            if text.contains("too large for one frame")),
        "{:?}",
        ev.get(1)
            .map(|e| format!("{e:?}").chars().take(200).collect::<String>())
    );
    // The log holds the result whole; the next inference could not carry it, and says so.
    assert_eq!(error_code(&frames), ErrorCode::Inference);
    assert!(session_log(&s, "s").contains(&big));
}
