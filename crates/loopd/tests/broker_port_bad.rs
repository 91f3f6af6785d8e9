//! BrokerPort against a broker that sends bytes that are not the protocol: every call still ends
//! with a plain failure and one line, never a panic, and leaves nothing behind for the next call.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bxcore::{CallId, DataClass, Message, ToolRequest, ToolResponse};
use loopd::broker_port::{BrokerPort, UNAVAILABLE, pointer, unavailable_line};
use loopd::tools::ToolPort;
use support::broker::{FakeBroker, send};
use support::{frame_of, sid};

fn request(call: u64) -> ToolRequest {
    ToolRequest {
        session: sid("s1"),
        call: CallId(call),
        tool: "workspace_read".to_string(),
        args: serde_json::json!({}),
    }
}

#[test]
fn a_broker_that_answers_with_garbage_gets_one_line_per_call_and_a_plain_failure() {
    let dir = tempfile::tempdir().unwrap();
    // The garbage, one kind per call id.
    let garbage: Vec<Vec<u8>> = vec![
        frame_of("not json"),
        frame_of(r#"{"v":2,"id":1,"final":true,"msg":{"kind":"ping"}}"#),
        frame_of(
            r#"{"v":1,"id":2,"final":true,"msg":{"kind":"tool_response","outcome":"failed","message":"m","extra":1}}"#,
        ),
        {
            let mut v = 100u32.to_be_bytes().to_vec();
            v.extend_from_slice(b"{\"v\":1");
            v
        },
        {
            let mut v = 2u32.to_be_bytes().to_vec();
            v.extend_from_slice(&[0xff, 0xfe]);
            v
        },
        frame_of(r#"{"v":1,"id":5,"final":true,"msg":{"kind":"tool_response","outcome":"maybe"}}"#),
    ];
    let n = garbage.len();
    let garbage = Arc::new(garbage);
    let g2 = Arc::clone(&garbage);
    let broker = FakeBroker::start(&dir.path().join("broker.sock"), move |s, env| {
        let _ = s.write_all(&g2[env.id as usize]);
    });
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = Arc::clone(&lines);
    let port = BrokerPort::with_log(
        broker.path.clone(),
        Duration::from_secs(20),
        Box::new(move |l| l2.lock().unwrap().push(l.to_string())),
    );
    for call in 0..n as u64 {
        let before = lines.lock().unwrap().len();
        let mut pendings = 0;
        let answer = port.call(&request(call), &mut |_| pendings += 1);
        assert_eq!(
            answer,
            ToolResponse::Failed {
                message: UNAVAILABLE.to_string()
            },
            "call {call}"
        );
        assert_eq!(pendings, 0);
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), before + 1, "call {call}: {lines:?}");
        let line = &lines[before];
        assert!(
            line.starts_with(&format!("loopd: {UNAVAILABLE}: bad frame: ")),
            "call {call}: {line}"
        );
        assert!(line.ends_with(&pointer()), "{line}");
    }
}

#[test]
fn a_failed_call_leaves_nothing_behind_for_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    // Odd calls are answered with the wrong id, even ones properly.
    let broker = FakeBroker::start(&dir.path().join("broker.sock"), |s, env| {
        let id = if env.id % 2 == 1 {
            env.id + 100
        } else {
            env.id
        };
        send(
            s,
            id,
            true,
            Message::ToolResponse(ToolResponse::Result {
                content: format!("answer {}", env.id),
                class: DataClass::Public,
                untrusted: false,
            }),
        );
    });
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = Arc::clone(&lines);
    let port = BrokerPort::with_log(
        broker.path.clone(),
        Duration::from_secs(20),
        Box::new(move |l| l2.lock().unwrap().push(l.to_string())),
    );
    for call in 1..=6u64 {
        let answer = port.call(&request(call), &mut |_| {});
        if call % 2 == 1 {
            assert_eq!(
                answer,
                ToolResponse::Failed {
                    message: UNAVAILABLE.to_string()
                }
            );
        } else {
            assert_eq!(
                answer,
                ToolResponse::Result {
                    content: format!("answer {call}"),
                    class: DataClass::Public,
                    untrusted: false
                }
            );
        }
    }
    let lines = lines.lock().unwrap();
    assert_eq!(
        *lines,
        vec![
            unavailable_line("an answer for request 101, not 1"),
            unavailable_line("an answer for request 103, not 3"),
            unavailable_line("an answer for request 105, not 5"),
        ]
    );
    assert_eq!(
        broker.tool_requests().len(),
        6,
        "one connection per call, no retries"
    );
}
