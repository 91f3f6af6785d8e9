//! The Anthropic provider against a loopback server speaking the Messages API wire format: the
//! request as sent, and the streamed events in their documented order.

mod common;

use bxcore::runbook::Anchored;
use std::time::Duration;

use common::*;
use serde_json::json;

fn setup(
    answers: Vec<Answer>,
    limits: &str,
) -> (tempfile::TempDir, Provider, inferproxy::Inference) {
    let home = tempfile::tempdir().unwrap();
    let p = Provider::start(answers);
    let inf = inference(home.path(), "anthropic", &p.base_url(""), limits);
    (home, p, inf)
}

fn stream(events: &[&str]) -> Answer {
    let framed = anthropic_events(events);
    Answer::sse(&framed.iter().map(String::as_str).collect::<Vec<_>>())
}

const MESSAGE_START: &str = r#"{"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}"#;
const PING: &str = r#"{"type": "ping"}"#;

/// The text example of the streaming documentation: full event order, `ping` between.
fn text_events() -> Vec<&'static str> {
    vec![
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        PING,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
        r#"{"type":"message_stop"}"#,
    ]
}

/// Text, then a tool call whose input streams as `input_json_delta` fragments.
fn tool_events() -> Vec<&'static str> {
    vec![
        r#"{"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-sonnet-4-5","stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2},"content":[],"stop_reason":null}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        PING,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay, let's check the weather."}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"San"}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" Francisco, CA\"}"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_02","name":"time_now","input":{}}}"#,
        r#"{"type":"content_block_stop","index":2}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}"#,
        r#"{"type":"message_stop"}"#,
    ]
}

#[test]
fn a_whole_history_is_translated_to_the_messages_request() {
    let (_h, p, inf) = setup(vec![stream(&text_events())], "");
    run(&inf, &history_request()).0.unwrap();
    let seen = p.seen();
    let s = &seen[0];
    assert_eq!(
        (s.method.as_str(), s.path.as_str()),
        ("POST", "/v1/messages")
    );
    assert_eq!(s.header("x-api-key"), Some(KEY));
    assert_eq!(s.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        s.header("authorization"),
        None,
        "the key goes in x-api-key only"
    );
    assert_eq!(
        s.json(),
        json!({
            "model": "test-model",
            "max_tokens": 512,
            "temperature": 0.5,
            "stream": true,
            "system": "You are terse.",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "What's the weather in Paris and the time?"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "call_3", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "call_4", "name": "time_now", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_3", "content": "18°C, light rain"},
                    {"type": "tool_result", "tool_use_id": "call_4", "content": "2026-11-30T08:00:00Z"},
                    {"type": "text", "text": "Thanks. And tomorrow?"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_5", "name": "get_weather", "input": {"city": "Paris", "day": "tomorrow"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_5"}]}
            ],
            "tools": [
                {"name": "get_weather", "description": "Weather for a city",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
                {"name": "time_now", "description": "The time",
                 "input_schema": {"type": "object", "properties": {}}}
            ]
        })
    );
}

#[test]
fn empty_text_and_null_arguments_never_reach_the_api() {
    let req: bxcore::InferRequest = serde_json::from_value(json!({
        "slot": "main", "first_call": 9, "tools": [],
        "messages": [
            {"role": "system", "text": ""},
            {"role": "user", "text": "go"},
            {"role": "assistant", "text": "", "tool_calls": []},
            {"role": "user", "text": ""},
            {"role": "user", "text": "again"},
            {"role": "assistant", "text": "", "tool_calls": [{"call": 8, "tool": "time_now", "args": null}]},
            {"role": "tool", "call": 8, "text": "noon"}
        ]
    }))
    .unwrap();
    let (_h, p, inf) = setup(vec![stream(&text_events())], "");
    run(&inf, &req).0.unwrap();
    assert_eq!(
        p.seen()[0].json()["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "go"}, {"type": "text", "text": "again"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_8", "name": "time_now", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_8", "content": "noon"}]}
        ])
    );
    assert!(p.seen()[0].json().get("system").is_none());
}

#[test]
fn the_full_event_order_with_pings_streams_text() {
    let (_h, _p, inf) = setup(vec![stream(&text_events())], "");
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(pieces, ["Hello", "!"]);
    assert_eq!(
        serde_json::to_value(r.unwrap()).unwrap(),
        json!({"message": {"role": "assistant", "text": "Hello!", "tool_calls": []},
               "usage": {"input_tokens": 25, "output_tokens": 15}})
    );
}

#[test]
fn tool_use_blocks_become_numbered_calls() {
    let (_h, _p, inf) = setup(vec![stream(&tool_events())], "");
    let mut req = hello_request();
    req.first_call = bxcore::CallId(30);
    let (r, pieces) = run(&inf, &req);
    assert_eq!(pieces, ["Okay, let's check the weather."]);
    assert_eq!(
        serde_json::to_value(r.unwrap()).unwrap(),
        json!({"message": {"role": "assistant", "text": "Okay, let's check the weather.", "tool_calls": [
            {"call": 30, "tool": "get_weather", "args": {"city": "San Francisco, CA"}},
            {"call": 31, "tool": "time_now", "args": {}}
        ]}, "usage": {"input_tokens": 472, "output_tokens": 89}})
    );
}

#[test]
fn a_plain_message_reply_is_taken_whole() {
    let body = json!({
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": "Hi! My name is Claude."},
                    {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather", "input": {"location": "San Francisco, CA"}}],
        "model": "claude-sonnet-4-5", "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 2095, "output_tokens": 503}
    });
    let (_h, _p, inf) = setup(vec![Answer::json(200, &body.to_string())], "");
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(pieces, ["Hi! My name is Claude."]);
    assert_eq!(
        serde_json::to_value(r.unwrap()).unwrap(),
        json!({"message": {"role": "assistant", "text": "Hi! My name is Claude.", "tool_calls": [
            {"call": 1, "tool": "get_weather", "args": {"location": "San Francisco, CA"}}]},
            "usage": {"input_tokens": 2095, "output_tokens": 503}})
    );
}

#[test]
fn an_error_event_in_the_stream_is_an_inference_error() {
    let events = [
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}"#,
        r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
    ];
    let (_h, p, inf) = setup(
        vec![stream(&events), stream(&text_events())],
        "backoff_ms = 1",
    );
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(pieces, ["Hel"]);
    assert_eq!(
        r.unwrap_err().pointed().to_string(),
        "the provider reported overloaded_error in the stream: Overloaded; see docs/runbook.md#inference-provider-error"
    );
    assert_eq!(p.seen().len(), 1, "text was forwarded: no retry");
}

#[test]
fn an_overloaded_error_before_any_text_is_retried() {
    let events = [
        MESSAGE_START,
        PING,
        r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
    ];
    let (_h, p, inf) = setup(
        vec![stream(&events), stream(&text_events())],
        "backoff_ms = 1",
    );
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(r.unwrap().usage.output_tokens, 15);
    assert_eq!(pieces.concat(), "Hello!");
    assert_eq!(p.seen().len(), 2);
}

#[test]
fn a_529_overloaded_status_is_retried_with_retry_after() {
    let busy = Answer::json(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    )
    .with_header("retry-after", "1");
    let (_h, p, inf) = setup(vec![busy, stream(&text_events())], "backoff_ms = 1");
    run(&inf, &hello_request()).0.unwrap();
    let seen = p.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].at.duration_since(seen[0].at) >= Duration::from_millis(900));
}

#[test]
fn a_stream_cut_before_message_stop_is_an_error() {
    let mut events = text_events();
    events.truncate(5);
    let (_h, p, inf) = setup(vec![stream(&events)], "backoff_ms = 1");
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(pieces.concat(), "Hello!");
    let e = r.unwrap_err();
    assert_eq!(e.anchor(), "inference-malformed");
    assert!(e.pointed().to_string().contains("cut off"), "{e}");
    assert_eq!(p.seen().len(), 1);
}

#[test]
fn invalid_json_in_tool_input_is_an_error() {
    let events = [
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"run","input":{}}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"argv\": [\"rm\","}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let (_h, _p, inf) = setup(vec![stream(&events)], "");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(e.anchor(), "inference-malformed");
    assert!(
        e.pointed()
            .to_string()
            .contains("(\"run\") are not valid JSON"),
        "{e}"
    );
}

#[test]
fn a_tool_use_with_no_name_is_an_error() {
    let events = [
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","input":{}}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let (_h, _p, inf) = setup(vec![stream(&events)], "");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert!(
        e.pointed().to_string().contains("tool call 0 has no name"),
        "{e}"
    );
}

#[test]
fn an_unknown_event_is_an_error() {
    let events = [
        MESSAGE_START,
        r#"{"type":"content_block_teleport","index":0}"#,
    ];
    let (_h, _p, inf) = setup(vec![stream(&events)], "");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(
        e.pointed().to_string(),
        "the provider's reply is malformed: an unknown event \"content_block_teleport\"; see docs/runbook.md#inference-malformed"
    );
}

#[test]
fn a_wrong_key_is_an_auth_error_with_the_providers_message() {
    let (_h, p, inf) = setup(
        vec![Answer::json(
            401,
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#,
        )],
        "",
    );
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(
        e.pointed().to_string(),
        "the provider refused the API key (401): invalid x-api-key; see docs/runbook.md#inference-auth-refused"
    );
    assert_eq!(p.seen().len(), 1);
}

#[test]
fn a_slow_loris_provider_cannot_hold_a_request_past_its_deadline() {
    let (_h, _p, inf) = setup(
        vec![Answer::Trickle {
            every: Duration::from_millis(50),
        }],
        "timeout_ms = 1500\nretries = 0",
    );
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(e.anchor(), "inference-timeout", "{e}");
}

#[test]
fn tool_input_split_into_single_characters_is_joined() {
    let input = r#"{"path": "/srv/notes/ä file.txt", "lines": [1, 2]}"#;
    let mut events: Vec<String> = vec![
        MESSAGE_START.to_string(),
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_9","name":"workspace_read","input":{}}}"#.to_string(),
    ];
    for c in input.chars() {
        events.push(
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "input_json_delta", "partial_json": c.to_string()}})
            .to_string(),
        );
    }
    events.push(r#"{"type":"content_block_stop","index":0}"#.to_string());
    events.push(r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":40}}"#.to_string());
    events.push(r#"{"type":"message_stop"}"#.to_string());
    let refs: Vec<&str> = events.iter().map(String::as_str).collect();
    let (_h, _p, inf) = setup(vec![stream(&refs)], "");
    let r = run(&inf, &hello_request()).0.unwrap();
    assert_eq!(
        serde_json::to_value(r.message).unwrap()["tool_calls"],
        json!([{"call": 1, "tool": "workspace_read", "args": {"path": "/srv/notes/ä file.txt", "lines": [1, 2]}}])
    );
}
