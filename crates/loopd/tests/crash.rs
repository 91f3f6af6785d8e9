//! kill -9 loopd in the middle of a turn (during a tool call, during a stream), restart it, and
//! check the session opens, the next turn works and no call id is used twice.

mod support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Instant;

use bxcore::deadline::Deadline;
use bxcore::{
    CallId, ChatMessage, DataClass, Envelope, Message, ToolResponse, Turn, read_frame, write_frame,
};
use loopd::session::INTERRUPTED;
use serde_json::json;
use support::broker::{FakeBroker, send, tool};
use support::daemon::{Layout, Loopd, config};
use support::infer::{ScriptedInfer, Step};
use support::{WAIT, last_msg, sid, turn, wait_until};

/// Send a turn and return the open connection once its first frame arrived.
fn start_turn(socket: &std::path::Path, session: &str, resume: bool) -> UnixStream {
    let mut c = UnixStream::connect(socket).unwrap();
    write_frame(
        &mut c,
        &Envelope::new(
            1,
            true,
            Message::Turn(Turn {
                session: sid(session),
                resume,
                text: "go".to_string(),
            }),
        ),
    )
    .unwrap();
    let env = read_frame(&mut Deadline::new(&c, Instant::now() + WAIT)).unwrap();
    assert!(!env.last, "{env:?}");
    c
}

fn every_call_id(log: &str) -> Vec<u64> {
    let mut ids = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["type"] == "assistant" {
            for c in v["tool_calls"].as_array().unwrap() {
                ids.push(c["call"].as_u64().unwrap());
            }
        }
    }
    ids
}

#[test]
fn killed_during_a_tool_call_the_session_goes_on_and_the_call_id_is_not_reused() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let infer = ScriptedInfer::start(
        &layout.infer,
        vec![
            Step::Tools(vec![("slow".to_string(), json!({}))]),
            // After the restart:
            Step::Tools(vec![("slow".to_string(), json!({}))]),
            Step::Text("done".to_string()),
        ],
    );
    // The broker holds the first call until the test ends; later calls are answered.
    let (hold_tx, hold_rx) = mpsc::channel::<()>();
    let hold = Mutex::new(Some(hold_rx));
    let broker = FakeBroker::start(&layout.broker, move |s, env| match &env.msg {
        Message::ToolsList {} => send(
            s,
            env.id,
            true,
            Message::Tools(bxcore::Tools {
                tools: vec![tool("slow")],
                workspace: Vec::new(),
            }),
        ),
        Message::ToolRequest(_) => {
            let held = hold.lock().unwrap().take();
            if let Some(rx) = held {
                bxtest::gate(&rx);
                return;
            }
            send(
                s,
                env.id,
                true,
                Message::ToolResponse(ToolResponse::Result {
                    content: "slow result".to_string(),
                    class: DataClass::Public,
                    untrusted: false,
                }),
            );
        }
        _ => {}
    });
    let cfg = config(
        home.path(),
        &format!(
            "[broker]\nsocket = {:?}\n",
            layout.broker.display().to_string()
        ),
    );
    let mut d = Loopd::start(home.path(), &cfg);
    let _channel = start_turn(&d.socket, "crash", false);
    wait_until("the broker to hold the call", || {
        broker.tool_requests().len() == 1
    });
    d.kill();
    let held = broker.tool_requests()[0].call;
    assert_eq!(held, CallId(1));

    let d = Loopd::start(home.path(), &cfg);
    let frames = turn(&d.socket, 2, "crash", true, "again");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{:?}",
        last_msg(&frames)
    );
    let reqs = broker.tool_requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[1].call > held, "{:?} after {held:?}", reqs[1].call);
    // The model was told the first call was interrupted.
    let after = &infer.requests()[1];
    assert!(after.messages.contains(&ChatMessage::Tool {
        call: held,
        text: INTERRUPTED.to_string()
    }));
    assert!(after.first_call > held);
    let log = std::fs::read_to_string(home.path().join("loop/sessions/crash.jsonl")).unwrap();
    let ids = every_call_id(&log);
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(ids.len(), unique.len(), "no call id twice: {ids:?}");
    drop(hold_tx);
}

#[test]
fn killed_during_a_stream_the_torn_tail_is_cut_and_the_next_turn_works() {
    let home = support::home();
    let layout = Layout::new(home.path());
    let (gate_tx, gate_rx) = mpsc::channel();
    let infer = ScriptedInfer::start(
        &layout.infer,
        vec![
            Step::Tools(vec![("time_now".to_string(), json!({}))]),
            Step::Gate(
                "streaming".to_string(),
                gate_rx,
                Box::new(Step::Text("never finished".to_string())),
            ),
            // After the restart:
            Step::Tools(vec![("time_now".to_string(), json!({}))]),
            Step::Text("back".to_string()),
        ],
    );
    let cfg = config(home.path(), "");
    let mut d = Loopd::start(home.path(), &cfg);
    let c = start_turn(&d.socket, "stream", false);
    wait_until("the stream to start", || infer.requests().len() == 2);
    // Read until the delta of the held stream arrives.
    loop {
        let env = read_frame(&mut Deadline::new(&c, Instant::now() + WAIT)).unwrap();
        if matches!(&env.msg, Message::TurnEvent { event: bxcore::TurnEvent::AssistantText { text } } if text == "streaming")
        {
            break;
        }
    }
    d.kill();
    // A write torn by the crash: half a record at the end, no newline.
    let path = home.path().join("loop/sessions/stream.jsonl");
    let before = std::fs::read(&path).unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(br#"{"type":"assistant","text":"never fin"#)
        .unwrap();

    let d = Loopd::start(home.path(), &cfg);
    let frames = turn(&d.socket, 2, "stream", true, "again");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{:?}",
        last_msg(&frames)
    );
    assert!(
        d.log_text().contains(&format!(
            "loopd: {}: a torn last record was cut off; see docs/runbook.md#session-log-torn-tail",
            path.display()
        )),
        "{}",
        d.log_text()
    );
    let log = std::fs::read(&path).unwrap();
    assert!(log.starts_with(&before), "nothing whole was lost");
    let text = String::from_utf8(log).unwrap();
    assert!(!text.contains("never fin"));
    let ids = every_call_id(&text);
    assert_eq!(ids, vec![1, 2], "the turn after the restart used a new id");
    drop(gate_tx);
}
