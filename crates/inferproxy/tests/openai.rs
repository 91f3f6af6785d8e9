//! The OpenAI-compatible provider against a loopback server speaking the chat completions wire
//! format: the request as sent, and every shape of streamed reply.

mod common;

use std::time::Duration;

use bxcore::runbook::Anchored;
use common::*;
use serde_json::{Value, json};

/// A chat.completion.chunk as OpenAI streams it, with this choice delta and finish reason.
fn chunk(delta: Value, finish: Option<&str>) -> String {
    json!({
        "id": "chatcmpl-AbC123", "object": "chat.completion.chunk", "created": 1764489600,
        "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
    })
    .to_string()
}

/// The usage chunk `stream_options.include_usage` asks for: no choices.
fn usage_chunk(prompt: u64, completion: u64) -> String {
    json!({
        "id": "chatcmpl-AbC123", "object": "chat.completion.chunk", "created": 1764489600,
        "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_44709d6fcb", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}}
    })
    .to_string()
}

fn stream(chunks: &[String]) -> Answer {
    let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let events = openai_events(&refs);
    Answer::sse(&events.iter().map(String::as_str).collect::<Vec<_>>())
}

fn text_stream() -> Vec<String> {
    vec![
        chunk(
            json!({"role": "assistant", "content": "", "refusal": null}),
            None,
        ),
        chunk(json!({"content": "Hel"}), None),
        chunk(json!({"content": "lo"}), None),
        chunk(json!({"content": ", world."}), None),
        chunk(json!({}), Some("stop")),
        usage_chunk(9, 4),
    ]
}

fn setup(
    answers: Vec<Answer>,
    limits: &str,
) -> (tempfile::TempDir, Provider, inferproxy::Inference) {
    let home = tempfile::tempdir().unwrap();
    let p = Provider::start(answers);
    let inf = inference(home.path(), "openai", &p.base_url("/v1"), limits);
    (home, p, inf)
}

#[test]
fn a_whole_history_is_translated_to_the_chat_completions_request() {
    let (_h, p, inf) = setup(vec![stream(&text_stream())], "");
    let (r, _) = run(&inf, &history_request());
    r.unwrap();
    let seen = p.seen();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(
        (s.method.as_str(), s.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(
        s.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(s.header("content-type"), Some("application/json"));
    assert_eq!(
        s.json(),
        json!({
            "model": "test-model",
            "max_tokens": 512,
            "temperature": 0.5,
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What's the weather in Paris and the time?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_3", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_4", "type": "function",
                     "function": {"name": "time_now", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_3", "content": "18°C, light rain"},
                {"role": "tool", "tool_call_id": "call_4", "content": "2026-11-30T08:00:00Z"},
                {"role": "user", "content": "Thanks. And tomorrow?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_5", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"day\":\"tomorrow\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_5", "content": ""}
            ],
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
                {"type": "function", "function": {"name": "time_now", "description": "The time",
                    "parameters": {"type": "object", "properties": {}}}}
            ]
        })
    );
}

#[test]
fn no_tools_means_no_tools_key() {
    let (_h, p, inf) = setup(vec![stream(&text_stream())], "");
    run(&inf, &hello_request()).0.unwrap();
    let body = p.seen()[0].json();
    assert!(body.get("tools").is_none(), "{body}");
}

#[test]
fn streamed_text_is_forwarded_piece_by_piece_and_the_usage_is_kept() {
    let (_h, _p, inf) = setup(vec![stream(&text_stream())], "");
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(pieces, ["Hel", "lo", ", world."]);
    assert_eq!(
        serde_json::to_value(r.unwrap()).unwrap(),
        json!({"message": {"role": "assistant", "text": "Hello, world.", "tool_calls": []},
               "usage": {"input_tokens": 9, "output_tokens": 4}})
    );
}

#[test]
fn a_plain_json_reply_is_taken_whole() {
    let body = json!({
        "id": "chatcmpl-123", "object": "chat.completion", "created": 1677652288, "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, how may I assist you today?", "refusal": null},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}
    });
    let (_h, _p, inf) = setup(vec![Answer::json(200, &body.to_string())], "");
    let (r, pieces) = run(&inf, &hello_request());
    let r = r.unwrap();
    assert_eq!(pieces, ["Hello there, how may I assist you today?"]);
    assert_eq!(r.usage.input_tokens, 9);
    assert_eq!(r.usage.output_tokens, 12);
}

#[test]
fn a_plain_json_reply_with_tool_calls_is_numbered_from_first_call() {
    let body = json!({
        "id": "chatcmpl-abc123", "object": "chat.completion", "created": 1699896916, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_abc123", "type": "function", "function": {"name": "get_weather", "arguments": "{\n\"city\": \"Boston\"\n}"}}
        ]}, "logprobs": null, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99}
    });
    let (_h, _p, inf) = setup(vec![Answer::json(200, &body.to_string())], "");
    let mut req = hello_request();
    req.first_call = bxcore::CallId(40);
    let (r, pieces) = run(&inf, &req);
    assert!(pieces.is_empty());
    assert_eq!(
        serde_json::to_value(r.unwrap().message).unwrap(),
        json!({"role": "assistant", "text": "", "tool_calls": [{"call": 40, "tool": "get_weather", "args": {"city": "Boston"}}]})
    );
}

/// One tool call, streamed the way OpenAI does: id and name first, arguments in fragments.
fn one_call_stream() -> Vec<String> {
    vec![
        chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "type": "function",
             "function": {"name": "get_weather", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "city"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\":\""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "Paris"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        usage_chunk(81, 17),
    ]
}

#[test]
fn one_streamed_tool_call_is_assembled_and_numbered() {
    let (_h, _p, inf) = setup(vec![stream(&one_call_stream())], "");
    let mut req = hello_request();
    req.first_call = bxcore::CallId(12);
    let (r, pieces) = run(&inf, &req);
    assert!(pieces.is_empty());
    assert_eq!(
        serde_json::to_value(r.unwrap()).unwrap(),
        json!({"message": {"role": "assistant", "text": "", "tool_calls": [
            {"call": 12, "tool": "get_weather", "args": {"city": "Paris"}}]},
            "usage": {"input_tokens": 81, "output_tokens": 17}})
    );
}

#[test]
fn several_tool_calls_and_text_come_back_in_order() {
    let chunks = vec![
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": "Looking both up."}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": \"Oslo\"}"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
            "function": {"name": "time_now", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 2, "id": "call_c", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 2, "function": {"arguments": ": \"Lima\"}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        usage_chunk(100, 30),
    ];
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(pieces, ["Looking both up."]);
    assert_eq!(
        serde_json::to_value(r.unwrap().message).unwrap(),
        json!({"role": "assistant", "text": "Looking both up.", "tool_calls": [
            {"call": 1, "tool": "get_weather", "args": {"city": "Oslo"}},
            {"call": 2, "tool": "time_now", "args": {}},
            {"call": 3, "tool": "get_weather", "args": {"city": "Lima"}}
        ]})
    );
}

#[test]
fn arguments_split_across_many_chunks_are_joined() {
    let args =
        r#"{"path": "/srv/notes/a long file name.txt", "lines": [1, 2, 3], "note": "ünïcødé ✓"}"#;
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_x",
            "type": "function", "function": {"name": "workspace_read", "arguments": ""}}]}),
        None,
    )];
    // One character per chunk.
    for c in args.chars() {
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": c.to_string()}}]}),
            None,
        ));
    }
    chunks.push(chunk(json!({}), Some("tool_calls")));
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let (r, _) = run(&inf, &hello_request());
    let r = r.unwrap();
    let bxcore::ChatMessage::Assistant { tool_calls, .. } = r.message else {
        panic!("not an assistant message");
    };
    assert_eq!(
        tool_calls[0].args,
        serde_json::from_str::<Value>(args).unwrap()
    );
}

#[test]
fn an_id_and_name_repeated_on_every_delta_is_one_call() {
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    for part in ["{\"ci", "ty\": ", "\"Rome\"}"] {
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_same", "type": "function",
                "function": {"name": "get_weather", "arguments": part}}]}),
            None,
        ));
    }
    chunks.push(chunk(json!({}), Some("tool_calls")));
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let (r, _) = run(&inf, &hello_request());
    assert_eq!(
        serde_json::to_value(r.unwrap().message).unwrap(),
        json!({"role": "assistant", "text": "", "tool_calls": [
            {"call": 1, "tool": "get_weather", "args": {"city": "Rome"}}]})
    );
}

#[test]
fn empty_content_chunks_forward_nothing() {
    let chunks = vec![
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": ""}), None),
        chunk(json!({"content": "x"}), None),
        chunk(json!({"content": ""}), None),
        chunk(json!({"content": null}), None),
        chunk(json!({}), Some("stop")),
    ];
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(pieces, ["x"]);
    // No usage chunk: zeros.
    assert_eq!(r.unwrap().usage, bxcore::Usage::default());
}

#[test]
fn keep_alive_comments_are_skipped() {
    let c = text_stream();
    let pieces: Vec<String> = vec![
        ": OPENROUTER PROCESSING\n\n".into(),
        format!("data: {}\n\n", c[0]),
        ": keep-alive\n\n".into(),
        format!("data: {}\r\n\r\n", c[1]),
        ":\n\n".into(),
        format!("data: {}\n\n", c[2]),
        format!("data: {}\n\n", c[3]),
        format!("data: {}\n\n", c[4]),
        ": ping\n\n".into(),
        format!("data: {}\n\n", c[5]),
        "data: [DONE]\n\n".into(),
    ];
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let (_h, _p, inf) = setup(vec![Answer::sse(&refs)], "");
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(pieces.concat(), "Hello, world.");
    assert_eq!(r.unwrap().usage.output_tokens, 4);
}

#[test]
fn an_event_split_across_network_chunks_is_joined() {
    let whole: String =
        openai_events(&text_stream().iter().map(String::as_str).collect::<Vec<_>>()).concat();
    // Cut into 7-byte pieces, each its own HTTP chunk.
    let bytes = whole.as_bytes();
    let pieces: Vec<String> = bytes
        .chunks(7)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    // The payload is ASCII, so the byte cuts are character cuts.
    assert!(whole.is_ascii());
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let (_h, _p, inf) = setup(vec![Answer::sse(&refs)], "");
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(pieces.concat(), "Hello, world.");
    assert_eq!(r.unwrap().usage.input_tokens, 9);
}

#[test]
fn usage_on_every_chunk_keeps_the_last() {
    let mut chunks = Vec::new();
    for (i, t) in ["a", "b", "c"].iter().enumerate() {
        let mut v: Value = serde_json::from_str(&chunk(json!({"content": t}), None)).unwrap();
        v["usage"] = json!({"prompt_tokens": 5, "completion_tokens": i + 1});
        chunks.push(v.to_string());
    }
    let mut last: Value = serde_json::from_str(&chunk(json!({}), Some("stop"))).unwrap();
    last["usage"] = json!({"prompt_tokens": 5, "completion_tokens": 3});
    chunks.push(last.to_string());
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let r = run(&inf, &hello_request()).0.unwrap();
    assert_eq!(
        r.usage,
        bxcore::Usage {
            input_tokens: 5,
            output_tokens: 3
        }
    );
}

#[test]
fn a_429_with_retry_after_is_retried_after_the_wait() {
    let busy = Answer::json(
        429,
        r#"{"error":{"message":"Rate limit reached for gpt-4o-mini","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
    )
    .with_header("retry-after", "1");
    let (_h, p, inf) = setup(
        vec![busy, stream(&text_stream())],
        "backoff_ms = 1\nretries = 2",
    );
    let (r, pieces) = run(&inf, &hello_request());
    assert_eq!(r.unwrap().usage.output_tokens, 4);
    assert_eq!(pieces.concat(), "Hello, world.");
    let seen = p.seen();
    assert_eq!(seen.len(), 2);
    // The provider's wait was honoured, not the 1 ms backoff.
    assert!(seen[1].at.duration_since(seen[0].at) >= Duration::from_millis(900));
    assert_eq!(seen[0].body, seen[1].body, "the same request is sent again");
}

#[test]
fn a_500_three_times_is_a_failure_after_three_attempts() {
    let err = || {
        Answer::json(
            500,
            r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#,
        )
    };
    let (_h, p, inf) = setup(
        vec![err(), err(), err(), stream(&text_stream())],
        "backoff_ms = 10\nretries = 2",
    );
    let (r, pieces) = run(&inf, &hello_request());
    let e = r.unwrap_err();
    assert!(pieces.is_empty());
    assert_eq!(e.anchor(), "inference-overloaded");
    assert_eq!(
        e.pointed().to_string(),
        "the provider answered 500 after 3 attempts: The server had an error while processing \
         your request.; see docs/runbook.md#inference-overloaded"
    );
    assert_eq!(
        p.seen().len(),
        3,
        "retries = 2 is three attempts, no fourth"
    );
}

#[test]
fn a_retry_after_past_the_deadline_fails_at_once() {
    let busy = Answer::json(429, r#"{"error":{"message":"slow down"}}"#)
        .with_header("retry-after", "3600");
    let (_h, p, inf) = setup(
        vec![busy, stream(&text_stream())],
        "timeout_ms = 20000\nretries = 2",
    );
    let (r, _) = run(&inf, &hello_request());
    assert_eq!(r.unwrap_err().anchor(), "inference-overloaded");
    assert_eq!(p.seen().len(), 1);
}

#[test]
fn a_stream_cut_in_the_middle_is_an_error_and_not_retried_after_text_was_forwarded() {
    let c = text_stream();
    let pieces = [
        format!("data: {}\n\n", c[0]),
        format!("data: {}\n\n", c[1]),
        "data: {\"id\":\"chatcmpl-AbC123\",\"cho".into(),
    ];
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let (_h, p, inf) = setup(
        vec![Answer::sse_cut(&refs), stream(&text_stream())],
        "backoff_ms = 1\nretries = 2",
    );
    let (r, forwarded) = run(&inf, &hello_request());
    assert_eq!(forwarded, ["Hel"]);
    let e = r.unwrap_err();
    assert_eq!(e.anchor(), "inference-malformed", "{e}");
    assert!(e.pointed().to_string().contains("cut off"), "{e}");
    assert_eq!(p.seen().len(), 1, "never retried once text was forwarded");
}

#[test]
fn a_stream_that_ends_without_done_is_cut_off() {
    let c = text_stream();
    let pieces: Vec<String> = c.iter().map(|c| format!("data: {c}\n\n")).collect();
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let (_h, _p, inf) = setup(vec![Answer::sse(&refs)], "retries = 0");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert!(
        e.pointed().to_string().contains("cut off before its end"),
        "{e}"
    );
}

#[test]
fn a_cut_before_any_text_is_retried() {
    let c = text_stream();
    let first = [format!("data: {}\n\n", c[0])];
    let refs: Vec<&str> = first.iter().map(String::as_str).collect();
    let (_h, p, inf) = setup(
        vec![Answer::sse_cut(&refs), stream(&text_stream())],
        "backoff_ms = 1",
    );
    let (r, pieces) = run(&inf, &hello_request());
    r.unwrap();
    assert_eq!(pieces.concat(), "Hello, world.");
    assert_eq!(p.seen().len(), 2);
}

#[test]
fn invalid_json_in_arguments_is_an_error_not_a_tool_call() {
    let chunks = vec![
        chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_1",
            "type": "function", "function": {"name": "run", "arguments": "{\"argv\": [\"ls\""}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
    ];
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(e.anchor(), "inference-malformed");
    assert!(
        e.pointed()
            .to_string()
            .contains("the arguments of tool call 0 (\"run\") are not valid JSON"),
        "{e}"
    );
}

#[test]
fn a_tool_call_with_no_name_is_an_error() {
    let chunks = vec![
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"arguments": "{}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
    ];
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert!(
        e.pointed().to_string().contains("tool call 0 has no name"),
        "{e}"
    );
}

#[test]
fn a_chunk_that_is_not_json_is_an_error() {
    let (_h, _p, inf) = setup(vec![Answer::sse(&["data: {not json}\n\n"])], "retries = 0");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(e.anchor(), "inference-malformed");
    assert!(
        e.pointed().to_string().contains("a chunk is not JSON"),
        "{e}"
    );
}

#[test]
fn a_slow_loris_provider_cannot_hold_a_request_past_its_deadline() {
    let (_h, _p, inf) = setup(
        vec![Answer::Trickle {
            every: Duration::from_millis(50),
        }],
        "timeout_ms = 1500\nretries = 0",
    );
    let started = std::time::Instant::now();
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(e.anchor(), "inference-timeout", "{e}");
    assert!(
        e.pointed().to_string().contains("deadline of 1500 ms"),
        "{e}"
    );
    // Generous: the point is that it ended, not how fast.
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_wrong_key_is_an_auth_error_with_the_providers_message_and_no_key() {
    let body = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {KEY}. You can find your API key at the usual place.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}}}"#
    );
    let (_h, p, inf) = setup(vec![Answer::json(401, &body)], "");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(e.anchor(), "inference-auth-refused");
    let s = e.pointed().to_string();
    assert!(
        s.starts_with(
            "the provider refused the API key (401): Incorrect API key provided: [redacted]."
        ),
        "{s}"
    );
    assert!(!s.contains(KEY));
    assert_eq!(p.seen().len(), 1, "a refused key is not retried");
}

#[test]
fn another_4xx_is_refused_with_the_providers_message() {
    let (_h, p, inf) = setup(
        vec![Answer::json(
            404,
            r#"{"error":{"message":"The model `test-model` does not exist","type":"invalid_request_error","code":"model_not_found"}}"#,
        )],
        "",
    );
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(
        e.pointed().to_string(),
        format!(
            "the provider refused the request (404 from {}): The model `test-model` does not \
             exist; see docs/runbook.md#inference-request-refused",
            p.base_url("/v1/chat/completions")
        )
    );
}

#[test]
fn a_provider_that_is_not_there_is_unreachable_after_retries() {
    let home = tempfile::tempdir().unwrap();
    // A port nothing listens on: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let inf = inference(
        home.path(),
        "openai",
        &format!("http://127.0.0.1:{port}/v1"),
        "backoff_ms = 1",
    );
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(e.anchor(), "inference-unreachable", "{e}");
}

#[test]
fn an_unknown_slot_and_an_oversized_request_are_refused_before_sending() {
    let (_h, p, inf) = setup(vec![], "");
    let mut req = hello_request();
    req.slot = "huge".into();
    assert_eq!(
        run(&inf, &req).0.unwrap_err().pointed().to_string(),
        "no slot named \"huge\" is configured; see docs/runbook.md#inference-slot"
    );
    let mut req = hello_request();
    req.messages = vec![bxcore::ChatMessage::User {
        text: "x".repeat(500_000),
    }];
    let e = run(&inf, &req).0.unwrap_err();
    assert!(
        e.pointed()
            .to_string()
            .contains("over slot \"main\"'s context_tokens of 100000"),
        "{e}"
    );
    assert!(p.seen().is_empty());
}

#[test]
fn a_redirect_is_not_followed_and_the_key_goes_nowhere_else() {
    let other = Provider::start(vec![stream(&text_stream())]);
    let redirect = Answer::Whole {
        status: 307,
        headers: vec![("location".into(), other.base_url("/v1/chat/completions"))],
        body: String::new(),
    };
    let (_h, p, inf) = setup(vec![redirect], "retries = 0");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert_eq!(p.seen().len(), 1);
    assert!(other.seen().is_empty(), "the redirect was followed");
    assert_eq!(
        e.pointed().to_string(),
        format!(
            "the provider refused the request (307 from {}): (no message); see \
             docs/runbook.md#inference-request-refused",
            p.base_url("/v1/chat/completions")
        )
    );
}

#[test]
fn a_long_reply_whose_framing_dwarfs_its_text_is_taken_whole() {
    // 20 000 one-word chunks: over 4 MiB of events for 100 kB of text.
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    for _ in 0..20_000 {
        chunks.push(chunk(json!({"content": "word "}), None));
    }
    chunks.push(chunk(json!({}), Some("stop")));
    let events = openai_events(&chunks.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(events.iter().map(String::len).sum::<usize>() > 4 << 20);
    // Sent in large HTTP chunks, so the test server is quick about it.
    let pieces: Vec<String> = events.chunks(500).map(|c| c.concat()).collect();
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let (_h, _p, inf) = setup(vec![Answer::sse(&refs)], "");
    let (r, forwarded) = run(&inf, &hello_request());
    let r = r.unwrap();
    assert_eq!(forwarded.len(), 20_000);
    let bxcore::ChatMessage::Assistant { text, .. } = r.message else {
        panic!("not assistant")
    };
    assert_eq!(text.len(), 100_000);
}

#[test]
fn a_reply_over_the_frame_limit_is_refused() {
    let big = "y".repeat(64 * 1024);
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    for _ in 0..17 {
        chunks.push(chunk(json!({"content": big}), None));
    }
    chunks.push(chunk(json!({}), Some("stop")));
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let e = run(&inf, &hello_request()).0.unwrap_err();
    assert!(
        e.pointed()
            .to_string()
            .contains("the reply grew past 1048576 bytes"),
        "{e}"
    );
}

#[test]
fn a_key_echoed_where_the_message_is_cut_leaves_no_prefix_of_it() {
    // The excerpt keeps 200 characters; the key starts at 190, straddling the cut.
    let body = format!(
        r#"{{"error":{{"message":"{}{KEY} is not valid"}}}}"#,
        "x".repeat(190)
    );
    let (_h, _p, inf) = setup(vec![Answer::json(401, &body)], "");
    let e = run(&inf, &hello_request())
        .0
        .unwrap_err()
        .pointed()
        .to_string();
    assert!(!e.contains(&KEY[..6]), "{e}");
}

#[test]
fn a_key_echoed_inside_the_stream_is_redacted() {
    let chunks = vec![
        chunk(json!({"role": "assistant", "content": ""}), None),
        json!({"error": {"message": format!("bad key {KEY}"), "type": "invalid_request_error"}})
            .to_string(),
    ];
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let e = run(&inf, &hello_request())
        .0
        .unwrap_err()
        .pointed()
        .to_string();
    assert!(e.contains("bad key [redacted]"), "{e}");
    assert!(!e.contains(KEY), "{e}");
    // And in a chunk that breaks the format, quoted in the error.
    let (_h, _p, inf) = setup(
        vec![Answer::sse(&[&format!("data: {{{KEY}\n\n")])],
        "retries = 0",
    );
    let e = run(&inf, &hello_request())
        .0
        .unwrap_err()
        .pointed()
        .to_string();
    assert!(!e.contains(KEY), "{e}");
}

#[test]
fn provider_text_in_an_error_cannot_forge_a_log_line() {
    let chunks = vec![
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "c", "type": "function",
            "function": {"name": format!("x\ninferproxy: all is well; see docs/runbook.md#{}", "nothing"), "arguments": "{"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
    ];
    let (_h, _p, inf) = setup(vec![stream(&chunks)], "");
    let e = run(&inf, &hello_request())
        .0
        .unwrap_err()
        .pointed()
        .to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(
        e.ends_with("see docs/runbook.md#inference-malformed"),
        "{e}"
    );
}

#[test]
fn max_completion_tokens_replaces_max_tokens_when_configured() {
    let home = tempfile::tempdir().unwrap();
    let p = Provider::start(vec![stream(&text_stream())]);
    let inf = inference_with(
        home.path(),
        "openai",
        &p.base_url("/v1"),
        "max_tokens_key = \"max_completion_tokens\"",
        "",
    );
    run(&inf, &hello_request()).0.unwrap();
    let body = p.seen()[0].json();
    assert_eq!(body["max_completion_tokens"], 512);
    assert!(body.get("max_tokens").is_none(), "{body}");
}

#[test]
fn a_404_shows_the_url_the_request_went_to_and_never_the_key() {
    // A doubled /v1 in base_url, say: a web server's own 404, with no API error body.
    let not_found = Answer::Whole {
        status: 404,
        headers: vec![("content-type".into(), "text/plain; charset=utf-8".into())],
        body: "404 page not found".into(),
    };
    let (_h, p, inf) = setup(vec![not_found], "");
    let e = run(&inf, &hello_request())
        .0
        .unwrap_err()
        .pointed()
        .to_string();
    let url = p.base_url("/v1/chat/completions");
    assert!(e.contains(&format!("(404 from {url})")), "{e}");
    assert!(e.contains("404 page not found"), "{e}");
    assert!(!e.contains(KEY), "{e}");
    assert!(
        e.ends_with("see docs/runbook.md#inference-request-refused"),
        "{e}"
    );
    assert_eq!(p.seen().len(), 1, "a 404 is not retried");
}

#[test]
fn an_html_page_with_200_is_named_as_such_with_the_url_not_as_a_cut_stream() {
    let page = Answer::Whole {
        status: 200,
        headers: vec![("content-type".into(), "text/html; charset=utf-8".into())],
        body: "<!doctype html><html><body>Welcome to nginx!</body></html>".into(),
    };
    let (_h, p, inf) = setup(vec![page], "");
    let e = run(&inf, &hello_request())
        .0
        .unwrap_err()
        .pointed()
        .to_string();
    assert!(e.contains("answered 200 with an HTML page"), "{e}");
    assert!(e.contains(&p.base_url("/v1/chat/completions")), "{e}");
    assert!(!e.contains("cut off"), "{e}");
    assert!(
        e.ends_with("see docs/runbook.md#inference-malformed"),
        "{e}"
    );
    assert_eq!(p.seen().len(), 1, "a web page is not retried");
}
