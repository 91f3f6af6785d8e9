//! BrokerPort: each of the eleven exits, by name, against a fake broker socket.

mod support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bxcore::{
    ApprovalId, CallId, DataClass, Envelope, Message, Timestamp, ToolRequest, ToolResponse,
    WireError, write_frame,
};
use loopd::broker_port::{
    BrokerPort, NOT_CONFIGURED, NoBroker, TOO_LARGE, UNAVAILABLE, not_configured_line, pointer,
    unavailable_line,
};
use loopd::tools::{Pending, ToolPort};
use serde_json::json;
use support::broker::{FakeBroker, hold, send};
use support::sid;

struct Outcome {
    answer: ToolResponse,
    lines: Vec<String>,
    pending: Vec<Pending>,
}

fn request(call: u64) -> ToolRequest {
    ToolRequest {
        session: sid("s1"),
        call: CallId(call),
        tool: "workspace_read".to_string(),
        args: json!({"path": "/srv/notes/a.txt"}),
    }
}

fn call_with(socket: &std::path::Path, timeout: Duration, req: &ToolRequest) -> Outcome {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = Arc::clone(&lines);
    let port = BrokerPort::with_log(
        socket.to_path_buf(),
        timeout,
        Box::new(move |l| l2.lock().unwrap().push(l.to_string())),
    );
    let mut pending = Vec::new();
    let answer = port.call(req, &mut |p| pending.push(p.clone()));
    let lines = lines.lock().unwrap().clone();
    Outcome {
        answer,
        lines,
        pending,
    }
}

/// Start a fake broker with `script` and make one call with `timeout`.
fn call<F>(timeout: Duration, script: F) -> Outcome
where
    F: Fn(&mut UnixStream, &Envelope) + Send + Sync + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let broker = FakeBroker::start(&dir.path().join("broker.sock"), script);
    call_with(&broker.path, timeout, &request(7))
}

fn failed_unavailable() -> ToolResponse {
    ToolResponse::Failed {
        message: UNAVAILABLE.to_string(),
    }
}

/// The exit is a U exit with exactly this reason, logged once.
fn assert_unavailable(o: &Outcome, why: &str) {
    assert_eq!(o.answer, failed_unavailable());
    assert_eq!(o.lines, vec![unavailable_line(why)]);
}

fn result(content: &str) -> Message {
    Message::ToolResponse(ToolResponse::Result {
        content: content.to_string(),
        class: DataClass::Private,
        untrusted: false,
    })
}

fn pending_msg(expires: Timestamp) -> Message {
    Message::ToolResponse(ToolResponse::PendingApproval {
        approval: ApprovalId::new("9f2c4a1b0d3e5f67").unwrap(),
        expires,
    })
}

const SHORT: Duration = Duration::from_millis(400);
const LONG: Duration = Duration::from_secs(20);

#[test]
fn the_lines_are_exactly_as_the_runbook_quotes_them() {
    assert_eq!(
        unavailable_line("no answer in time"),
        "loopd: the tool broker is unavailable: no answer in time; see docs/runbook.md#broker-unavailable"
    );
    assert_eq!(
        not_configured_line(),
        "loopd: no tool broker is configured: every tool call except the core ones will fail; see docs/runbook.md#broker-unavailable"
    );
    assert_eq!(pointer(), "see docs/runbook.md#broker-unavailable");
}

#[test]
fn exit_1_a_timeout_past_the_clock_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let o = call_with(&dir.path().join("none.sock"), Duration::MAX, &request(1));
    assert_unavailable(&o, "the timeout is too large");
}

#[test]
fn exit_2_a_socket_that_cannot_be_reached_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let o = call_with(&path, LONG, &request(1));
    assert_eq!(o.answer, failed_unavailable());
    assert_eq!(o.lines.len(), 1);
    let prefix = format!(
        "loopd: {UNAVAILABLE}: cannot connect to {}: ",
        path.display()
    );
    assert!(o.lines[0].starts_with(&prefix), "{}", o.lines[0]);
    assert!(o.lines[0].ends_with(&pointer()));
}

#[test]
fn exit_3_a_zero_timeout_cannot_be_set_and_is_unavailable() {
    let o = call(Duration::ZERO, |_, _| {});
    assert_eq!(o.answer, failed_unavailable());
    assert_eq!(o.lines.len(), 1);
    assert!(
        o.lines[0].starts_with(&format!("loopd: {UNAVAILABLE}: cannot set a timeout: ")),
        "{}",
        o.lines[0]
    );
}

#[test]
fn exit_4_a_request_too_large_fails_plainly_and_logs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = FakeBroker::start(&dir.path().join("broker.sock"), |_, _| {});
    let mut req = request(1);
    req.args = json!({"text": "x".repeat(bxcore::MAX_FRAME)});
    let o = call_with(&broker.path, LONG, &req);
    assert_eq!(
        o.answer,
        ToolResponse::Failed {
            message: TOO_LARGE.to_string()
        }
    );
    assert!(o.lines.is_empty(), "{:?}", o.lines);
}

#[test]
fn exit_4_a_request_the_broker_does_not_take_in_time_is_unavailable() {
    // A broker that never reads: a request larger than the socket's buffer cannot be written
    // within the timeout.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let (gave_up, wait) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let s = bxtest::accept(&listener, "loopd's broker port");
        // Held unread until the port has given up, however long it took to.
        bxtest::gate(&wait);
        drop(s);
    });
    let mut req = request(1);
    req.args = json!({"text": "x".repeat(900_000)});
    let o = call_with(&path, SHORT, &req);
    drop(gave_up);
    bxtest::join(holder, "the broker that never reads");
    assert_eq!(o.answer, failed_unavailable());
    assert_eq!(o.lines.len(), 1);
    assert!(
        o.lines[0].starts_with(&format!("loopd: {UNAVAILABLE}: cannot send the request: ")),
        "{}",
        o.lines[0]
    );
}

#[test]
fn exit_5_a_close_before_the_final_answer_is_unavailable() {
    let o = call(LONG, |_, _| {});
    assert_unavailable(&o, "the connection closed before the final answer");
}

#[test]
fn exit_5_a_silent_broker_is_no_answer_in_time() {
    let o = call(SHORT, |s, _| hold(s));
    assert_unavailable(&o, "no answer in time");
}

#[test]
fn exit_5_a_bad_frame_is_unavailable() {
    let o = call(LONG, |s, _| {
        s.write_all(&[0, 0, 0, 0]).unwrap();
    });
    assert_unavailable(&o, "bad frame: a frame of zero length");
}

#[test]
fn exit_5_a_frame_over_the_limit_is_a_bad_frame() {
    let o = call(LONG, |s, _| {
        s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    });
    assert_unavailable(
        &o,
        &format!(
            "bad frame: a frame of {} bytes is over the limit of {}",
            u32::MAX,
            bxcore::MAX_FRAME
        ),
    );
}

#[test]
fn exit_6_an_answer_for_another_request_is_unavailable() {
    let o = call(LONG, |s, env| send(s, env.id + 1, true, result("x")));
    assert_unavailable(&o, "an answer for request 8, not 7");
}

#[test]
fn exit_7_an_error_frame_is_the_broker_reporting_an_error() {
    let o = call(LONG, |s, env| {
        send(
            s,
            env.id,
            true,
            Message::Error(WireError {
                code: bxcore::ErrorCode::Internal,
                detail: "the audit chain is not writable".to_string(),
            }),
        )
    });
    assert_unavailable(
        &o,
        "the broker reported an error: the audit chain is not writable",
    );
}

#[test]
fn exit_7_a_message_that_is_not_a_tool_response_is_unexpected() {
    let o = call(LONG, |s, env| {
        send(s, env.id, true, Message::pong("brokerd", "0.1.0"))
    });
    assert_unavailable(&o, "an unexpected message");
}

#[test]
fn exit_8_a_pending_frame_marked_final_is_unavailable() {
    let o = call(LONG, |s, env| {
        send(
            s,
            env.id,
            true,
            pending_msg(Timestamp::now().plus_millis(1000)),
        )
    });
    assert_unavailable(&o, "a pending frame marked final");
    assert!(o.pending.is_empty());
}

#[test]
fn exit_9_an_answer_not_marked_final_is_unavailable() {
    for msg in [
        result("x"),
        Message::ToolResponse(ToolResponse::Failed {
            message: "m".into(),
        }),
        Message::ToolResponse(ToolResponse::Denied { reason: "r".into() }),
    ] {
        let o = call(LONG, move |s, env| send(s, env.id, false, msg.clone()));
        assert_unavailable(&o, "an answer not marked final");
    }
}

#[test]
fn exit_10_a_second_pending_frame_is_unavailable() {
    let o = call(LONG, |s, env| {
        send(
            s,
            env.id,
            false,
            pending_msg(Timestamp::now().plus_millis(1000)),
        );
        send(
            s,
            env.id,
            false,
            pending_msg(Timestamp::now().plus_millis(1000)),
        );
    });
    assert_unavailable(&o, "a second pending frame");
    assert_eq!(o.pending.len(), 1, "on_pending is called once");
}

#[test]
fn exit_10_an_expiry_far_in_the_future_is_too_far_away() {
    // u64::MAX would overflow an Instant; more than 24 hours away is refused too.
    for expires in [
        Timestamp(u64::MAX),
        Timestamp::now().plus_millis(24 * 60 * 60 * 1000 + 60_000),
    ] {
        let o = call(LONG, move |s, env| {
            send(s, env.id, false, pending_msg(expires))
        });
        assert_unavailable(&o, "an expiry too far away");
        assert!(o.pending.is_empty());
    }
}

#[test]
fn exit_10_then_11_a_pending_frame_then_the_answer_is_returned() {
    let expires = Timestamp::now().plus_millis(2_000);
    let o = call(LONG, move |s, env| {
        send(s, env.id, false, pending_msg(expires));
        send(s, env.id, true, result("approved content"));
    });
    assert_eq!(
        o.answer,
        ToolResponse::Result {
            content: "approved content".to_string(),
            class: DataClass::Private,
            untrusted: false
        }
    );
    assert!(o.lines.is_empty());
    assert_eq!(
        o.pending,
        vec![Pending {
            approval: ApprovalId::new("9f2c4a1b0d3e5f67").unwrap(),
            expires
        }]
    );
}

#[test]
fn exit_10_the_frame_after_a_pending_one_is_checked_like_the_first() {
    let o = call(LONG, |s, env| {
        send(
            s,
            env.id,
            false,
            pending_msg(Timestamp::now().plus_millis(1000)),
        );
        send(s, env.id + 3, true, result("x"));
    });
    assert_unavailable(&o, "an answer for request 10, not 7");
    assert_eq!(o.pending.len(), 1);
}

#[test]
fn exit_11_a_final_answer_is_returned_unchanged_and_nothing_is_logged() {
    for msg in [
        result("the file's text"),
        Message::ToolResponse(ToolResponse::Failed {
            message: "no such file".into(),
        }),
        Message::ToolResponse(ToolResponse::Denied {
            reason: "the owner denied it".into(),
        }),
    ] {
        let Message::ToolResponse(want) = msg.clone() else {
            unreachable!()
        };
        let o = call(LONG, move |s, env| send(s, env.id, true, msg.clone()));
        assert_eq!(o.answer, want);
        assert!(o.lines.is_empty(), "{:?}", o.lines);
    }
}

#[test]
fn the_request_is_one_final_frame_with_the_call_id_as_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let broker = FakeBroker::start(&dir.path().join("broker.sock"), |s, env| {
        send(s, env.id, true, result("x"))
    });
    let req = request(42);
    call_with(&broker.path, LONG, &req);
    let seen = broker.seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 1);
    let env = &seen.requests[0];
    assert_eq!(env.id, 42);
    assert!(env.last);
    assert_eq!(env.v, bxcore::PROTOCOL_VERSION);
    assert_eq!(env.msg, Message::ToolRequest(req));
}

#[test]
fn the_timeout_is_a_deadline_for_the_frame_not_for_each_read() {
    // One byte every 100 ms, each read well within a 600 ms timeout, the frame never whole.
    let started = Instant::now();
    let o = call(Duration::from_millis(600), |s, env| {
        let body = serde_json::to_vec(&Envelope::new(env.id, true, result("x"))).unwrap();
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend(body);
        for b in bytes {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    assert_unavailable(&o, "no answer in time");
    // The frame would take many seconds to trickle in; the port gave up at its deadline.
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn an_expiry_in_the_past_leaves_the_timeout() {
    let o = call(SHORT, |s, env| {
        send(s, env.id, false, pending_msg(Timestamp(1)));
        hold(s);
    });
    assert_unavailable(&o, "no answer in time");
    assert_eq!(o.pending.len(), 1);
}

#[test]
fn a_pending_frame_without_expires_is_a_bad_frame() {
    let o = call(LONG, |s, env| {
        let body = format!(
            r#"{{"v":1,"id":{},"final":false,"msg":{{"kind":"tool_response","outcome":"pending_approval","approval":"9f2c4a1b0d3e5f67"}}}}"#,
            env.id
        );
        s.write_all(&support::frame_of(&body)).unwrap();
    });
    assert_eq!(o.answer, failed_unavailable());
    assert_eq!(o.lines.len(), 1);
    assert!(
        o.lines[0].starts_with(&format!("loopd: {UNAVAILABLE}: bad frame: ")),
        "{}",
        o.lines[0]
    );
    assert!(o.lines[0].contains("expires"), "{}", o.lines[0]);
    assert!(o.pending.is_empty());
}

#[test]
fn no_broker_fails_every_call_plainly_and_prints_nothing() {
    let mut called = false;
    let answer = NoBroker.call(&request(1), &mut |_| called = true);
    assert_eq!(
        answer,
        ToolResponse::Failed {
            message: NOT_CONFIGURED.to_string()
        }
    );
    assert!(!called);
    assert!(NoBroker.list().unwrap().tools.is_empty());
}

#[test]
fn the_tool_list_comes_from_tools_list_and_an_outage_is_an_error_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let broker = FakeBroker::ok(
        &dir.path().join("broker.sock"),
        vec![support::broker::tool("workspace_read")],
    );
    let port = BrokerPort::new(broker.path.clone(), LONG);
    assert_eq!(
        port.list().unwrap().tools,
        vec![support::broker::tool("workspace_read")]
    );

    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = Arc::clone(&lines);
    let gone = BrokerPort::with_log(
        dir.path().join("absent.sock"),
        LONG,
        Box::new(move |l| l2.lock().unwrap().push(l.to_string())),
    );
    let why = gone.list().unwrap_err();
    assert!(why.contains("absent.sock"), "{why}");
    let lines = lines.lock().unwrap();
    assert_eq!(lines.len(), 1);
    assert!(lines[0].ends_with(&pointer()), "{}", lines[0]);
}

#[test]
fn an_answer_followed_at_once_by_a_close_is_returned_whole() {
    // The broker answers and shuts the connection at once: the answer is whole and counts.
    let o = call(LONG, |s, env| {
        let _ = write_frame(s, &Envelope::new(env.id, true, result("x")));
        let _ = s.shutdown(std::net::Shutdown::Both);
    });
    assert!(matches!(o.answer, ToolResponse::Result { .. }));
}
