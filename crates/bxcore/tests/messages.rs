//! Every message kind round-trips, and its JSON is exactly the documented shape.

use bxcore::*;
use serde_json::{Value, json};

/// `env` serializes to exactly `expected`, `expected` deserializes to `env`, and the envelope
/// survives a trip through a frame.
fn exact(env: Envelope, expected: Value) {
    assert_eq!(
        serde_json::to_value(&env).unwrap(),
        expected,
        "serialized shape"
    );
    let back: Envelope = serde_json::from_value(expected.clone()).unwrap();
    assert_eq!(back, env, "deserialized from the literal");
    let mut buf = Vec::new();
    write_frame(&mut buf, &env).unwrap();
    assert_eq!(
        read_frame(&mut buf.as_slice()).unwrap(),
        env,
        "through a frame"
    );
    assert_eq!(
        expected["msg"]["kind"].as_str().unwrap(),
        env.msg.kind(),
        "Message::kind names the wire kind"
    );
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn aid() -> ApprovalId {
    ApprovalId::new("9f2c4a1b0d3e5f67").unwrap()
}

#[test]
fn ping() {
    exact(
        Envelope::new(0, true, Message::Ping {}),
        json!({"v":1,"id":0,"final":true,"msg":{"kind":"ping"}}),
    );
}

#[test]
fn pong() {
    exact(
        Envelope::new(0, true, Message::pong("brokerd", "0.1.0")),
        json!({"v":1,"id":0,"final":true,"msg":{"kind":"pong","daemon":"brokerd","version":"0.1.0","protocol":1}}),
    );
}

#[test]
fn turn() {
    exact(
        Envelope::new(
            7,
            true,
            Message::Turn(Turn {
                session: sid("s1"),
                resume: false,
                text: "hello".into(),
            }),
        ),
        json!({"v":1,"id":7,"final":true,"msg":{"kind":"turn","session":"s1","resume":false,"text":"hello"}}),
    );
}

#[test]
fn channel_turn() {
    exact(
        Envelope::new(
            7,
            true,
            Message::ChannelTurn(ChannelTurn {
                session: sid("matrix-00aa"),
                resume: true,
                text: "hello".into(),
                key: TurnKey::new("$Yz1b:example.org").unwrap(),
            }),
        ),
        json!({"v":1,"id":7,"final":true,"msg":{"kind":"channel_turn","session":"matrix-00aa","resume":true,"text":"hello","key":"$Yz1b:example.org"}}),
    );
}

#[test]
fn a_channel_turn_without_a_key_or_with_a_key_out_of_bounds_is_refused() {
    let with = |key: Value| json!({"v":1,"id":7,"final":true,"msg":{"kind":"channel_turn","session":"matrix-00aa","resume":true,"text":"hi","key":key}});
    for key in [
        json!(""),
        json!("$a b"),
        json!("$a\nb"),
        json!("$\u{e9}"),
        json!("x".repeat(256)),
        json!(7),
    ] {
        assert!(
            serde_json::from_value::<Envelope>(with(key.clone())).is_err(),
            "{key}"
        );
    }
    let mut no_key = with(json!("$k"));
    no_key["msg"].as_object_mut().unwrap().remove("key");
    assert!(serde_json::from_value::<Envelope>(no_key).is_err());
    assert!(serde_json::from_value::<Envelope>(with(json!("x".repeat(255)))).is_ok());
    assert_eq!(
        TurnKey::new("$a b").unwrap_err().to_string(),
        "a turn key is 1 to 255 printable ASCII characters without a space, not \"$a b\""
    );
}

#[test]
fn turn_event_assistant_text() {
    exact(
        Envelope::new(
            7,
            false,
            Message::TurnEvent {
                event: TurnEvent::AssistantText { text: "Hel".into() },
            },
        ),
        json!({"v":1,"id":7,"final":false,"msg":{"kind":"turn_event","event":{"type":"assistant_text","text":"Hel"}}}),
    );
}

#[test]
fn turn_event_tool_call() {
    exact(
        Envelope::new(
            7,
            false,
            Message::TurnEvent {
                event: TurnEvent::ToolCall {
                    call: CallId(3),
                    tool: "workspace_read".into(),
                    args: json!({"path":"/srv/notes/a.txt"}),
                },
            },
        ),
        json!({"v":1,"id":7,"final":false,"msg":{"kind":"turn_event","event":{"type":"tool_call","call":3,"tool":"workspace_read","args":{"path":"/srv/notes/a.txt"}}}}),
    );
}

#[test]
fn turn_event_tool_pending() {
    exact(
        Envelope::new(
            7,
            false,
            Message::TurnEvent {
                event: TurnEvent::ToolPending {
                    call: CallId(3),
                    approval: aid(),
                    expires: Timestamp(1764489600000),
                },
            },
        ),
        json!({"v":1,"id":7,"final":false,"msg":{"kind":"turn_event","event":{"type":"tool_pending","call":3,"approval":"9f2c4a1b0d3e5f67","expires":1764489600000u64}}}),
    );
}

#[test]
fn turn_event_tool_result() {
    exact(
        Envelope::new(
            7,
            false,
            Message::TurnEvent {
                event: TurnEvent::ToolResult {
                    call: CallId(3),
                    outcome: Outcome::Failed,
                    text: "the tool broker is unavailable".into(),
                    outage: None,
                },
            },
        ),
        json!({"v":1,"id":7,"final":false,"msg":{"kind":"turn_event","event":{"type":"tool_result","call":3,"outcome":"failed","text":"the tool broker is unavailable"}}}),
    );
    for (outcome, name) in [
        (Outcome::Result, "result"),
        (Outcome::Failed, "failed"),
        (Outcome::Denied, "denied"),
    ] {
        assert_eq!(serde_json::to_value(outcome).unwrap(), json!(name));
    }
}

#[test]
fn turn_done() {
    exact(
        Envelope::new(
            7,
            true,
            Message::TurnDone(TurnDone {
                session: sid("s1"),
                usage: Usage {
                    input_tokens: 812,
                    output_tokens: 40,
                },
            }),
        ),
        json!({"v":1,"id":7,"final":true,"msg":{"kind":"turn_done","session":"s1","usage":{"input_tokens":812,"output_tokens":40}}}),
    );
}

#[test]
fn tool_request() {
    exact(
        Envelope::new(
            3,
            true,
            Message::ToolRequest(ToolRequest {
                session: sid("s1"),
                call: CallId(3),
                tool: "workspace_read".into(),
                args: json!({"path":"/srv/notes/a.txt"}),
            }),
        ),
        json!({"v":1,"id":3,"final":true,"msg":{"kind":"tool_request","session":"s1","call":3,"tool":"workspace_read","args":{"path":"/srv/notes/a.txt"}}}),
    );
}

#[test]
fn tool_response_pending_approval() {
    exact(
        Envelope::new(
            3,
            false,
            Message::ToolResponse(ToolResponse::PendingApproval {
                approval: aid(),
                expires: Timestamp(1764489600000),
            }),
        ),
        json!({"v":1,"id":3,"final":false,"msg":{"kind":"tool_response","outcome":"pending_approval","approval":"9f2c4a1b0d3e5f67","expires":1764489600000u64}}),
    );
}

#[test]
fn tool_response_result() {
    exact(
        Envelope::new(
            3,
            true,
            Message::ToolResponse(ToolResponse::Result {
                content: "...".into(),
                class: DataClass::Private,
                untrusted: false,
            }),
        ),
        json!({"v":1,"id":3,"final":true,"msg":{"kind":"tool_response","outcome":"result","content":"...","class":"private","untrusted":false}}),
    );
}

#[test]
fn tool_response_failed() {
    exact(
        Envelope::new(
            3,
            true,
            Message::ToolResponse(ToolResponse::Failed {
                message: "no gateway is configured".into(),
            }),
        ),
        json!({"v":1,"id":3,"final":true,"msg":{"kind":"tool_response","outcome":"failed","message":"no gateway is configured"}}),
    );
}

#[test]
fn tool_response_denied() {
    exact(
        Envelope::new(
            3,
            true,
            Message::ToolResponse(ToolResponse::Denied {
                reason: "the owner denied it".into(),
            }),
        ),
        json!({"v":1,"id":3,"final":true,"msg":{"kind":"tool_response","outcome":"denied","reason":"the owner denied it"}}),
    );
}

#[test]
fn tools_list() {
    exact(
        Envelope::new(4, true, Message::ToolsList {}),
        json!({"v":1,"id":4,"final":true,"msg":{"kind":"tools_list"}}),
    );
}

#[test]
fn tools() {
    exact(
        Envelope::new(
            4,
            true,
            Message::Tools(Tools {
                tools: vec![ToolDef {
                    name: "workspace_read".into(),
                    description: "Read a file".into(),
                    parameters: json!({"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}),
                }],
                workspace: vec![WorkspaceRoot {
                    name: "notes".into(),
                    path: "/srv/notes".into(),
                    class: DataClass::Private,
                    writable: true,
                    untrusted: false,
                }],
            }),
        ),
        json!({"v":1,"id":4,"final":true,"msg":{"kind":"tools","tools":[{"name":"workspace_read","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}],"workspace":[{"name":"notes","path":"/srv/notes","class":"private","writable":true,"untrusted":false}]}}),
    );
}

#[test]
fn health() {
    exact(
        Envelope::new(2, true, Message::Health {}),
        json!({"v":1,"id":2,"final":true,"msg":{"kind":"health"}}),
    );
}

#[test]
fn health_report() {
    exact(
        Envelope::new(
            2,
            true,
            Message::HealthReport(HealthReport {
                checks: vec![HealthCheck {
                    part: "provider".into(),
                    ok: false,
                    detail: "http://127.0.0.1:8080/v1/models could not be reached".into(),
                }],
            }),
        ),
        json!({"v":1,"id":2,"final":true,"msg":{"kind":"health_report","checks":[{"part":"provider","ok":false,"detail":"http://127.0.0.1:8080/v1/models could not be reached"}]}}),
    );
}

#[test]
fn provider_probe() {
    exact(
        Envelope::new(1, true, Message::ProviderProbe {}),
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"provider_probe"}}),
    );
}

#[test]
fn provider_report() {
    exact(
        Envelope::new(
            1,
            true,
            Message::ProviderReport(ProviderReport {
                provider: "openai at http://127.0.0.1:8080/v1/chat/completions".into(),
                reachable: true,
                detail: "http://127.0.0.1:8080/v1/models answered 200".into(),
            }),
        ),
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"provider_report","provider":"openai at http://127.0.0.1:8080/v1/chat/completions","reachable":true,"detail":"http://127.0.0.1:8080/v1/models answered 200"}}),
    );
}

#[test]
fn hosts_list() {
    exact(
        Envelope::new(1, true, Message::HostsList {}),
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"hosts_list"}}),
    );
}

#[test]
fn hosts() {
    exact(
        Envelope::new(
            1,
            true,
            Message::Hosts(Hosts {
                hosts: vec!["example.org".into(), "*.wikipedia.org".into()],
            }),
        ),
        json!({"v":1,"id":1,"final":true,"msg":{"kind":"hosts","hosts":["example.org","*.wikipedia.org"]}}),
    );
}

#[test]
fn approvals_list() {
    exact(
        Envelope::new(5, true, Message::ApprovalsList {}),
        json!({"v":1,"id":5,"final":true,"msg":{"kind":"approvals_list"}}),
    );
}

fn an_approval() -> Approval {
    Approval {
        approval: aid(),
        session: sid("s1"),
        call: CallId(3),
        tool: "workspace_write".into(),
        args: json!({"path":"/w/a","content":"x"}),
        digest: "ab".repeat(32),
        taint: DataClass::Private,
        untrusted: true,
        rule: "untrusted_effect".into(),
        reason: "the session has read untrusted content".into(),
        lease_scope: "workspace_write calls in root notes, in this session for 1 h".into(),
        requested: Timestamp(1764489000000),
        expires: Timestamp(1764489600000),
    }
}

#[test]
fn approvals() {
    exact(
        Envelope::new(
            5,
            true,
            Message::Approvals(Approvals {
                pending: vec![an_approval().summary()],
            }),
        ),
        json!({"v":1,"id":5,"final":true,"msg":{"kind":"approvals","pending":[{
            "approval":"9f2c4a1b0d3e5f67","session":"s1","call":3,"tool":"workspace_write",
            "args_bytes":29,"digest":"ab".repeat(32),"taint":"private",
            "untrusted":true,"rule":"untrusted_effect","reason":"the session has read untrusted content",
            "lease_scope":"workspace_write calls in root notes, in this session for 1 h",
            "requested":1764489000000u64,"expires":1764489600000u64}]}}),
    );
}

#[test]
fn approval_show() {
    exact(
        Envelope::new(
            7,
            true,
            Message::ApprovalShow(ApprovalShow { approval: aid() }),
        ),
        json!({"v":1,"id":7,"final":true,"msg":{"kind":"approval_show","approval":"9f2c4a1b0d3e5f67"}}),
    );
}

#[test]
fn approval() {
    exact(
        Envelope::new(7, true, Message::Approval(an_approval())),
        json!({"v":1,"id":7,"final":true,"msg":{"kind":"approval",
            "approval":"9f2c4a1b0d3e5f67","session":"s1","call":3,"tool":"workspace_write",
            "args":{"path":"/w/a","content":"x"},"digest":"ab".repeat(32),"taint":"private",
            "untrusted":true,"rule":"untrusted_effect","reason":"the session has read untrusted content",
            "lease_scope":"workspace_write calls in root notes, in this session for 1 h",
            "requested":1764489000000u64,"expires":1764489600000u64}}),
    );
}

#[test]
fn a_summary_names_the_arguments_by_size_and_cuts_long_texts() {
    let mut a = an_approval();
    a.reason = "é".repeat(SUMMARY_TEXT_MAX);
    let s = a.summary();
    assert_eq!(
        s.args_bytes,
        canonical::to_string(&a.args).len() as u64,
        "the size of the canonical JSON"
    );
    assert!(s.reason.len() <= SUMMARY_TEXT_MAX && s.reason.len() > SUMMARY_TEXT_MAX - 2);
    assert!(
        s.reason.chars().all(|c| c == 'é'),
        "cut on a character boundary"
    );
    assert_eq!(s.digest, a.digest);
}

#[test]
fn approval_decision() {
    exact(
        Envelope::new(
            6,
            true,
            Message::ApprovalDecision(ApprovalDecision {
                approval: aid(),
                allow: true,
                lease: false,
                approver: None,
            }),
        ),
        json!({"v":1,"id":6,"final":true,"msg":{"kind":"approval_decision","approval":"9f2c4a1b0d3e5f67","allow":true}}),
    );
}

#[test]
fn approval_ack() {
    exact(
        Envelope::new(
            6,
            true,
            Message::ApprovalAck(ApprovalAck { approval: aid() }),
        ),
        json!({"v":1,"id":6,"final":true,"msg":{"kind":"approval_ack","approval":"9f2c4a1b0d3e5f67"}}),
    );
}

#[test]
fn approval_decision_with_a_lease() {
    exact(
        Envelope::new(
            6,
            true,
            Message::ApprovalDecision(ApprovalDecision {
                approval: aid(),
                allow: true,
                lease: true,
                approver: None,
            }),
        ),
        json!({"v":1,"id":6,"final":true,"msg":{"kind":"approval_decision","approval":"9f2c4a1b0d3e5f67","allow":true,"lease":true}}),
    );
}

fn lid() -> LeaseId {
    LeaseId::new("0a1b2c3d4e5f6071").unwrap()
}

#[test]
fn leases_list() {
    exact(
        Envelope::new(10, true, Message::LeasesList {}),
        json!({"v":1,"id":10,"final":true,"msg":{"kind":"leases_list"}}),
    );
}

#[test]
fn leases() {
    exact(
        Envelope::new(
            10,
            true,
            Message::Leases(Leases {
                leases: vec![Lease {
                    lease: lid(),
                    session: sid("s1"),
                    tool: "workspace_write".into(),
                    scope: "root notes".into(),
                    rule: "untrusted-effect".into(),
                    by: "uid 1000".into(),
                    granted: Timestamp(1764489000000),
                    expires: Timestamp(1764492600000),
                }],
            }),
        ),
        json!({"v":1,"id":10,"final":true,"msg":{"kind":"leases","leases":[{"lease":"0a1b2c3d4e5f6071","session":"s1","tool":"workspace_write","scope":"root notes","rule":"untrusted-effect","by":"uid 1000","granted":1764489000000u64,"expires":1764492600000u64}]}}),
    );
}

#[test]
fn lease_revoke() {
    exact(
        Envelope::new(11, true, Message::LeaseRevoke(LeaseRef { lease: lid() })),
        json!({"v":1,"id":11,"final":true,"msg":{"kind":"lease_revoke","lease":"0a1b2c3d4e5f6071"}}),
    );
}

#[test]
fn lease_revoked() {
    exact(
        Envelope::new(11, true, Message::LeaseRevoked(LeaseRef { lease: lid() })),
        json!({"v":1,"id":11,"final":true,"msg":{"kind":"lease_revoked","lease":"0a1b2c3d4e5f6071"}}),
    );
}

#[test]
fn audit_verify() {
    exact(
        Envelope::new(8, true, Message::AuditVerify {}),
        json!({"v":1,"id":8,"final":true,"msg":{"kind":"audit_verify"}}),
    );
}

#[test]
fn audit_report() {
    exact(
        Envelope::new(
            8,
            true,
            Message::AuditReport(AuditReport {
                records: 12,
                head: "0".repeat(64),
                ok: true,
                detail: "the chain verifies".into(),
            }),
        ),
        json!({"v":1,"id":8,"final":true,"msg":{"kind":"audit_report","records":12,"head":"0".repeat(64),"ok":true,"detail":"the chain verifies"}}),
    );
}

#[test]
fn session_state() {
    exact(
        Envelope::new(
            9,
            true,
            Message::SessionState(SessionQuery { session: sid("s1") }),
        ),
        json!({"v":1,"id":9,"final":true,"msg":{"kind":"session_state","session":"s1"}}),
    );
}

#[test]
fn session_state_reply() {
    exact(
        Envelope::new(
            9,
            true,
            Message::SessionStateReply(Label {
                class: DataClass::Secret,
                untrusted: true,
            }),
        ),
        json!({"v":1,"id":9,"final":true,"msg":{"kind":"session_state_reply","class":"secret","untrusted":true}}),
    );
}

#[test]
fn infer_request() {
    exact(
        Envelope::new(
            11,
            true,
            Message::InferRequest(InferRequest {
                slot: "main".into(),
                messages: vec![
                    ChatMessage::System {
                        text: "be brief".into(),
                    },
                    ChatMessage::User {
                        text: "read a".into(),
                    },
                    ChatMessage::Assistant {
                        text: "".into(),
                        tool_calls: vec![ToolCall {
                            call: CallId(1),
                            tool: "workspace_read".into(),
                            args: json!({"path":"/w/a"}),
                        }],
                    },
                    ChatMessage::Tool {
                        call: CallId(1),
                        text: "contents".into(),
                    },
                ],
                tools: vec![],
                first_call: CallId(2),
            }),
        ),
        json!({"v":1,"id":11,"final":true,"msg":{"kind":"infer_request","slot":"main","messages":[
            {"role":"system","text":"be brief"},
            {"role":"user","text":"read a"},
            {"role":"assistant","text":"","tool_calls":[{"call":1,"tool":"workspace_read","args":{"path":"/w/a"}}]},
            {"role":"tool","call":1,"text":"contents"}],"tools":[],"first_call":2}}),
    );
}

#[test]
fn infer_delta() {
    exact(
        Envelope::new(
            11,
            false,
            Message::InferDelta(InferDelta { text: "Hel".into() }),
        ),
        json!({"v":1,"id":11,"final":false,"msg":{"kind":"infer_delta","text":"Hel"}}),
    );
}

#[test]
fn infer_reply() {
    exact(
        Envelope::new(
            11,
            true,
            Message::InferReply(InferReply {
                message: ChatMessage::Assistant {
                    text: "Hello".into(),
                    tool_calls: vec![],
                },
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 2,
                },
            }),
        ),
        json!({"v":1,"id":11,"final":true,"msg":{"kind":"infer_reply","message":{"role":"assistant","text":"Hello","tool_calls":[]},"usage":{"input_tokens":10,"output_tokens":2}}}),
    );
}

#[test]
fn turn_record() {
    exact(
        Envelope::new(
            12,
            true,
            Message::TurnRecord(TurnRecord {
                session: sid("s1"),
                turn: 1,
                messages: vec![
                    ChatMessage::User { text: "hi".into() },
                    ChatMessage::Assistant {
                        text: "hello".into(),
                        tool_calls: vec![],
                    },
                ],
            }),
        ),
        json!({"v":1,"id":12,"final":true,"msg":{"kind":"turn_record","session":"s1","turn":1,"messages":[
            {"role":"user","text":"hi"},{"role":"assistant","text":"hello","tool_calls":[]}]}}),
    );
}

#[test]
fn turn_filed() {
    exact(
        Envelope::new(
            12,
            true,
            Message::TurnFiled(TurnFiled {
                session: sid("s1"),
                turn: 1,
            }),
        ),
        json!({"v":1,"id":12,"final":true,"msg":{"kind":"turn_filed","session":"s1","turn":1}}),
    );
}

#[test]
fn fetch_request() {
    exact(
        Envelope::new(
            13,
            true,
            Message::FetchRequest(FetchRequest {
                url: "https://example.org/".into(),
                method: "GET".into(),
                headers: vec![Header {
                    name: "accept".into(),
                    value: "text/html".into(),
                }],
                body: "".into(),
                max_bytes: 65536,
            }),
        ),
        json!({"v":1,"id":13,"final":true,"msg":{"kind":"fetch_request","url":"https://example.org/","method":"GET","headers":[{"name":"accept","value":"text/html"}],"body":"","max_bytes":65536}}),
    );
}

#[test]
fn fetch_reply() {
    exact(
        Envelope::new(
            13,
            true,
            Message::FetchReply(FetchReply {
                url: "https://example.org/".into(),
                status: 200,
                headers: vec![],
                body: "<html>".into(),
                truncated: false,
            }),
        ),
        json!({"v":1,"id":13,"final":true,"msg":{"kind":"fetch_reply","url":"https://example.org/","status":200,"headers":[],"body":"<html>","truncated":false}}),
    );
}

#[test]
fn error() {
    exact(
        Envelope::error(
            0,
            ErrorCode::BadMessage,
            "expected value at line 1 column 1",
        ),
        json!({"v":1,"id":0,"final":true,"msg":{"kind":"error","code":"bad_message","detail":"expected value at line 1 column 1"}}),
    );
}

#[test]
fn a_cancelled_turn_ends_with_a_cancelled_error_frame_with_the_turns_id() {
    exact(
        Envelope::error(
            7,
            ErrorCode::Cancelled,
            "the turn was cancelled by its channel; no model or tool call was started after that",
        ),
        json!({"v":1,"id":7,"final":true,"msg":{"kind":"error","code":"cancelled","detail":"the turn was cancelled by its channel; no model or tool call was started after that"}}),
    );
}

#[test]
fn every_error_code_has_its_wire_name() {
    let codes = [
        (ErrorCode::BadFrame, "bad_frame"),
        (ErrorCode::BadMessage, "bad_message"),
        (ErrorCode::BadVersion, "bad_version"),
        (ErrorCode::Forbidden, "forbidden"),
        (ErrorCode::SessionBusy, "session_busy"),
        (ErrorCode::SessionExists, "session_exists"),
        (ErrorCode::NoSuchSession, "no_such_session"),
        (ErrorCode::SessionFull, "session_full"),
        (ErrorCode::TurnLimit, "turn_limit"),
        (ErrorCode::Inference, "inference"),
        (ErrorCode::Unavailable, "unavailable"),
        (ErrorCode::Internal, "internal"),
        (ErrorCode::Cancelled, "cancelled"),
        (ErrorCode::TurnRepeated, "turn_repeated"),
    ];
    for (code, name) in codes {
        assert_eq!(serde_json::to_value(code).unwrap(), json!(name));
        assert_eq!(code.as_str(), name);
        assert_eq!(
            serde_json::from_value::<ErrorCode>(json!(name)).unwrap(),
            code
        );
    }
}

#[test]
fn the_documented_example_frames_parse() {
    // The examples of docs/protocol.md, verbatim.
    let examples = [
        r#"{"v":1,"id":0,"final":true,"msg":{"kind":"ping"}}"#,
        r#"{"v":1,"id":0,"final":true,"msg":{"kind":"pong","daemon":"brokerd","version":"0.1.0","protocol":1}}"#,
        r#"{"v":1,"id":7,"final":true,"msg":{"kind":"turn","session":"s1","resume":false,"text":"hello"}}"#,
        r#"{"v":1,"id":7,"final":false,"msg":{"kind":"turn_event","event":{"type":"assistant_text","text":"Hel"}}}"#,
        r#"{"v":1,"id":7,"final":false,"msg":{"kind":"turn_event","event":{"type":"tool_result","call":3,"outcome":"failed","text":"the tool broker is unavailable"}}}"#,
        r#"{"v":1,"id":7,"final":true,"msg":{"kind":"turn_done","session":"s1","usage":{"input_tokens":812,"output_tokens":40}}}"#,
        r#"{"v":1,"id":3,"final":true,"msg":{"kind":"tool_request","session":"s1","call":3,"tool":"workspace_read","args":{"path":"/srv/notes/a.txt"}}}"#,
        r#"{"v":1,"id":3,"final":false,"msg":{"kind":"tool_response","outcome":"pending_approval","approval":"9f2c4a1b0d3e5f67","expires":1764489600000}}"#,
        r#"{"v":1,"id":3,"final":true,"msg":{"kind":"tool_response","outcome":"result","content":"...","class":"private","untrusted":false}}"#,
        r#"{"v":1,"id":3,"final":true,"msg":{"kind":"tool_response","outcome":"denied","reason":"the owner denied it"}}"#,
        r#"{"v":1,"id":5,"final":true,"msg":{"kind":"approvals","pending":[{"approval":"9f2c4a1b0d3e5f67","session":"s1","call":3,"tool":"workspace_write","args_bytes":29,"digest":"<64 hex>","taint":"private","untrusted":true,"rule":"untrusted_effect","reason":"the session has read untrusted content","lease_scope":"workspace_write calls in root notes while the session has read third-party content, in this session for 1 h","requested":1764489000000,"expires":1764489600000}]}}"#,
        r#"{"v":1,"id":7,"final":true,"msg":{"kind":"approval_show","approval":"9f2c4a1b0d3e5f67"}}"#,
        r#"{"v":1,"id":7,"final":true,"msg":{"kind":"approval","approval":"9f2c4a1b0d3e5f67","session":"s1","call":3,"tool":"workspace_write","args":{"path":"/w/a","content":"x"},"digest":"<64 hex>","taint":"private","untrusted":true,"rule":"untrusted_effect","reason":"the session has read untrusted content","lease_scope":"workspace_write calls in root notes while the session has read third-party content, in this session for 1 h","requested":1764489000000,"expires":1764489600000}}"#,
        r#"{"v":1,"id":9,"final":true,"msg":{"kind":"session_state","session":"s1"}}"#,
        r#"{"v":1,"id":9,"final":true,"msg":{"kind":"session_state_reply","class":"secret","untrusted":true}}"#,
        r#"{"v":1,"id":0,"final":true,"msg":{"kind":"error","code":"bad_message","detail":"expected value at line 1 column 1"}}"#,
    ];
    for text in examples {
        let env: Envelope = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        // And it writes back as the same value.
        let again = serde_json::to_value(&env).unwrap();
        assert_eq!(
            again,
            serde_json::from_str::<Value>(text).unwrap(),
            "{text}"
        );
    }
}

#[test]
fn data_classes_are_ordered() {
    assert!(DataClass::Public < DataClass::Private);
    assert!(DataClass::Private < DataClass::Secret);
    assert_eq!(DataClass::Private.max(DataClass::Secret), DataClass::Secret);
    assert_eq!(
        serde_json::to_value(DataClass::Secret).unwrap(),
        json!("secret")
    );
    assert!(serde_json::from_value::<DataClass>(json!("Secret")).is_err());
}

#[test]
fn approval_ids_are_16_lowercase_hex_and_random() {
    let a = ApprovalId::random();
    let b = ApprovalId::random();
    assert_ne!(a, b);
    for id in [&a, &b] {
        assert_eq!(id.as_str().len(), 16);
        assert!(ApprovalId::new(id.as_str()).is_ok());
    }
    for bad in [
        "",
        "9F2C4A1B0D3E5F67",
        "9f2c4a1b0d3e5f6",
        "9f2c4a1b0d3e5f678",
        "9f2c4a1b0d3e5f6g",
    ] {
        assert!(ApprovalId::new(bad).is_err(), "{bad:?}");
        assert!(
            serde_json::from_value::<ApprovalId>(json!(bad)).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn the_memory_frames_of_the_protocol_doc_parse_and_write_back_the_same() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let frames: Vec<&str> = doc
        .lines()
        .filter(|l| l.starts_with(r#"{"v":1"#) && l.contains(r#""kind":"memor"#))
        .collect();
    assert!(frames.len() >= 8, "{frames:?}");
    for text in frames {
        let env: Envelope = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            serde_json::to_value(&env).unwrap(),
            serde_json::from_str::<Value>(text).unwrap(),
            "{text}"
        );
    }
}

#[test]
fn a_memory_route_is_one_of_three_names_and_nothing_else() {
    for (name, r) in [
        ("main", bxcore::MemoryRoute::Main),
        ("quarantine", bxcore::MemoryRoute::Quarantine),
        ("local", bxcore::MemoryRoute::Local),
    ] {
        assert_eq!(serde_json::to_value(r).unwrap(), json!(name));
        assert_eq!(bxcore::MemoryRoute::from_name(name), Some(r));
    }
    let bad = r#"{"v":1,"id":1,"final":true,"msg":{"kind":"memory_recent","route":"elsewhere","limit":1}}"#;
    assert!(serde_json::from_str::<Envelope>(bad).is_err());
}

#[test]
fn the_channel_frames_of_the_protocol_doc_parse_and_write_back_the_same() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let frames: Vec<&str> = doc
        .lines()
        .filter(|l| {
            l.starts_with(r#"{"v":1"#)
                && (l.contains(r#""kind":"channel_"#) || l.contains(r#""approver":"#))
        })
        .collect();
    assert!(frames.len() >= 5, "{frames:?}");
    for text in frames {
        let env: Envelope = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            serde_json::to_value(&env).unwrap(),
            serde_json::from_str::<Value>(text).unwrap(),
            "{text}"
        );
    }
}

#[test]
fn the_protocol_doc_has_an_example_frame_of_every_kind_a_socket_accepts() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol.md");
    let doc = std::fs::read_to_string(path).unwrap();
    for spec in bxcore::layout::SOCKETS {
        for kind in spec.accepts.iter().chain(&["ping"]) {
            assert!(
                doc.contains(&format!(r#""kind":"{kind}""#)),
                "docs/protocol.md has no example frame of {kind} ({})",
                spec.file()
            );
        }
    }
}
