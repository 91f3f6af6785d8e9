//! The real `inferproxy` binary on a temporary home, over its real socket: `ping`,
//! `infer_request` streamed as `infer_delta` frames, every kind of bad input, refusals at start,
//! `check`, and the key never shown. Every daemon here runs under its seccomp list with
//! `KillProcess` (the default) and Landlock: a call missing from the list is a test failure.

mod common;

use bxtest::OutputBounded;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use bxcore::{
    ChatMessage, Envelope, ErrorCode, InferDelta, InferRequest, Message, read_frame, write_frame,
};
use common::*;
use serde_json::json;

const SCRIPT: &str = r#"
[[step]]
text = "Let me look that up."
tool_calls = [{ tool = "time_now" }]

[[rule]]
text = "Scripted reply."
"#;

fn infer(text: &str, first_call: u64) -> Message {
    Message::InferRequest(InferRequest {
        slot: "main".into(),
        messages: vec![bxcore::ChatMessage::User { text: text.into() }],
        tools: vec![],
        first_call: bxcore::CallId(first_call),
    })
}

fn script_daemon(extra: &str) -> Daemon {
    Daemon::start_with(&script_config(extra), &[("script.toml", SCRIPT)]).unwrap()
}

fn openai_config(provider: &Provider, extra: &str) -> String {
    format!(
        r#"
[paths]
home = "{{home}}"

[provider]
kind = "openai"
base_url = "{}"
api_key_file = "{{home}}/key"

[slots.main]
model = "gpt-test"
max_tokens = 100
context_tokens = 100000

[limits]
backoff_ms = 10

[sandbox]
require = false
{extra}
"#,
        provider.base_url("/v1")
    )
}

fn openai_stream(texts: &[&str]) -> Vec<String> {
    let mut chunks: Vec<String> = vec![
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]})
        .to_string(),
    ];
    for t in texts {
        chunks.push(
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"content": t}, "finish_reason": null}]})
            .to_string(),
        );
    }
    chunks.push(
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"}]})
        .to_string(),
    );
    chunks.push(
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}})
        .to_string(),
    );
    openai_events(&chunks.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn ping_answers_pong_with_the_daemons_name() {
    let d = script_daemon("");
    let p = bxcore::client::ping(&d.socket, bxtest::DEADLINE).unwrap();
    assert_eq!(p.daemon, "inferproxy");
    assert_eq!(p.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(p.protocol, bxcore::PROTOCOL_VERSION);
    assert!(!d.log_text().contains("ping"), "ping is never logged");
}

#[test]
fn the_startup_notice_says_what_is_in_force_and_served() {
    let d = script_daemon("");
    // The notice follows the accept thread's start, so ping may answer a moment before it.
    let log = d.wait_log("inferproxy: serving inference");
    assert!(log.contains("inferproxy: sandbox: uid "), "{log}");
    assert!(log.contains("seccomp inferproxy ("), "{log}");
    assert!(
        log.contains(&format!(
            "inferproxy: serving inference on {} by script",
            d.socket.display()
        )),
        "{log}"
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    assert!(status.contains("Seccomp:\t2"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
}

#[test]
fn a_scripted_request_streams_deltas_then_the_reply() {
    let d = script_daemon("");
    let frames = d.ask(7, infer("hi", 3));
    let (last, interim) = frames.split_last().unwrap();
    let texts: Vec<&str> = interim
        .iter()
        .map(|e| {
            assert_eq!((e.id, e.last), (7, false));
            match &e.msg {
                Message::InferDelta(InferDelta { text }) => text.as_str(),
                other => panic!("not a delta: {other:?}"),
            }
        })
        .collect();
    assert_eq!(texts, ["Let ", "me ", "look ", "that ", "up."]);
    assert_eq!((last.id, last.last), (7, true));
    assert_eq!(
        serde_json::to_value(&last.msg).unwrap(),
        json!({"kind": "infer_reply", "message": {"role": "assistant", "text": "Let me look that up.",
            "tool_calls": [{"call": 3, "tool": "time_now", "args": {}}]},
            "usage": {"input_tokens": 0, "output_tokens": 0}})
    );
    // The step is used; the rule answers from now on.
    let frames = d.ask(8, infer("again", 4));
    assert_eq!(
        serde_json::to_value(&frames.last().unwrap().msg).unwrap()["message"]["text"],
        "Scripted reply."
    );
}

#[test]
fn text_is_forwarded_as_it_arrives_not_when_the_reply_is_whole() {
    let events = openai_stream(&["first", " second"]);
    let gate = Gate::default();
    let p = Provider::start(vec![Answer::Gated {
        before: events[..2].to_vec(),
        after: events[2..].to_vec(),
        gate: gate.clone(),
    }]);
    let d = Daemon::start_with(&openai_config(&p, ""), &[("key", KEY)]).unwrap();
    let mut s = UnixStream::connect(&d.socket).unwrap();
    write_frame(&mut s, &Envelope::new(5, true, infer("go", 1))).unwrap();
    let until = Instant::now() + bxtest::DEADLINE;
    // The provider holds the rest of its stream until this first delta has arrived here.
    let first = read_frame(&mut bxcore::deadline::Deadline::new(&s, until)).unwrap();
    assert_eq!(
        first.msg,
        Message::InferDelta(InferDelta {
            text: "first".into()
        })
    );
    gate.open();
    let mut rest = Vec::new();
    loop {
        let env = read_frame(&mut bxcore::deadline::Deadline::new(&s, until)).unwrap();
        let last = env.last;
        rest.push(env.msg);
        if last {
            break;
        }
    }
    assert_eq!(
        rest[0],
        Message::InferDelta(InferDelta {
            text: " second".into()
        })
    );
    let Message::InferReply(r) = rest.last().unwrap() else {
        panic!("{rest:?}")
    };
    assert_eq!(r.usage.input_tokens, 11);
    assert_eq!(
        r.message,
        bxcore::ChatMessage::Assistant {
            text: "first second".into(),
            tool_calls: vec![]
        }
    );
}

#[test]
fn a_provider_failure_is_error_inference_with_its_runbook_line() {
    let p = Provider::start(vec![Answer::json(
        400,
        r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
    )]);
    let d = Daemon::start_with(&openai_config(&p, ""), &[("key", KEY)]).unwrap();
    let frames = d.ask(9, infer("go", 1));
    assert_eq!(frames.len(), 1);
    let detail = format!(
        "the provider refused the request (400 from {}): This model's maximum context length is \
         8192 tokens.; see docs/runbook.md#inference-request-refused",
        p.base_url("/v1/chat/completions")
    );
    assert_eq!(frames[0], Envelope::error(9, ErrorCode::Inference, &detail));
    let line = format!("inferproxy: slot main: {detail}");
    assert!(d.wait_log(&line).contains(&line), "{}", d.log_text());
}

#[test]
fn an_unknown_slot_is_error_inference() {
    let d = script_daemon("");
    let mut m = infer("x", 1);
    if let Message::InferRequest(r) = &mut m {
        r.slot = "big".into();
    }
    let frames = d.ask(2, m);
    assert_eq!(
        frames,
        [Envelope::error(
            2,
            ErrorCode::Inference,
            "no slot named \"big\" is configured; see docs/runbook.md#inference-slot"
        )]
    );
}

#[test]
fn a_kind_infer_sock_does_not_take_is_forbidden_and_logged() {
    let d = script_daemon("");
    let frames = d.ask(4, Message::ToolsList {});
    assert_eq!(
        frames,
        [Envelope::error(
            4,
            ErrorCode::Forbidden,
            "tools_list is not accepted on infer.sock"
        )]
    );
    let line = "inferproxy: refused the message kind tools_list on infer.sock; see docs/runbook.md#socket-forbidden";
    assert!(d.wait_log(line).contains(line));
}

/// Send raw bytes, return the answer frame (or why there is none).
fn raw(d: &Daemon, bytes: &[u8], close: bool) -> Result<Envelope, String> {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.write_all(bytes).unwrap();
    if close {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let until = Instant::now() + bxtest::DEADLINE;
    read_frame(&mut bxcore::deadline::Deadline::new(&s, until)).map_err(|e| e.to_string())
}

fn framed(body: &str) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body.as_bytes());
    v
}

#[test]
fn bad_input_gets_its_documented_answer_and_the_daemon_serves_on() {
    let d = script_daemon("[serve]\nfirst_frame_ms = 500\n");
    let code = |r: Result<Envelope, String>| match r {
        Ok(Envelope {
            id,
            msg: Message::Error(e),
            ..
        }) => (id, e.code),
        other => panic!("not an error frame: {other:?}"),
    };
    assert_eq!(
        code(raw(&d, &framed("not json"), false)),
        (0, ErrorCode::BadMessage)
    );
    assert_eq!(
        code(raw(
            &d,
            &framed(r#"{"v":2,"id":1,"final":true,"msg":{"kind":"ping"}}"#),
            false
        )),
        (0, ErrorCode::BadVersion)
    );
    assert_eq!(
        code(raw(
            &d,
            &framed(r#"{"v":1,"id":1,"final":true,"msg":{"kind":"dance"}}"#),
            false
        )),
        (0, ErrorCode::BadMessage)
    );
    assert_eq!(
        code(raw(
            &d,
            &framed(
                r#"{"v":1,"id":1,"final":true,"msg":{"kind":"infer_request","slot":"main","messages":[],"tools":[],"first_call":1,"model":"x"}}"#
            ),
            false
        )),
        (0, ErrorCode::BadMessage)
    );
    assert_eq!(
        code(raw(&d, &[0, 0, 0, 0], false)),
        (0, ErrorCode::BadFrame)
    );
    assert_eq!(
        code(raw(&d, &[0, 0x20, 0, 1], false)),
        (0, ErrorCode::BadFrame)
    );
    // A truncated frame, then the peer closes its side.
    assert_eq!(
        code(raw(&d, &[0, 0, 0, 50, b'{'], true)),
        (0, ErrorCode::BadFrame)
    );
    // A silent peer is dropped with bad_frame at first_frame_ms.
    let silent = raw(&d, &[], false);
    assert_eq!(code(silent), (0, ErrorCode::BadFrame));
    // A peer that trickles its frame a byte at a time cannot outlast the deadline: it is
    // answered before its frame is whole.
    let s = UnixStream::connect(&d.socket).unwrap();
    let body = framed(r#"{"v":1,"id":1,"final":true,"msg":{"kind":"ping"}}"#);
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut sent = 0;
        for b in &body {
            if w.write_all(&[*b]).is_err() {
                break;
            }
            sent += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        (sent, body.len())
    });
    let until = Instant::now() + bxtest::DEADLINE;
    let answer = read_frame(&mut bxcore::deadline::Deadline::new(&s, until)).unwrap();
    assert!(matches!(answer.msg, Message::Error(ref e) if e.code == ErrorCode::BadFrame));
    drop(s);
    let (sent, len) = bxtest::join(writer, "the trickling writer");
    assert!(sent < len, "the whole frame went through ({sent} of {len})");
    // A peer that closes at once gets nothing and harms nothing.
    drop(UnixStream::connect(&d.socket).unwrap());
    // And the daemon still serves.
    assert_eq!(
        bxcore::client::ping(&d.socket, bxtest::DEADLINE)
            .unwrap()
            .daemon,
        "inferproxy"
    );
    let frames = d.ask(3, infer("hi", 1));
    assert!(matches!(frames.last().unwrap().msg, Message::InferReply(_)));
}

#[test]
fn a_peer_that_goes_away_mid_stream_does_not_stop_the_daemon() {
    let events = openai_stream(&["a", "b"]);
    let gate = Gate::default();
    let p = Provider::start(vec![
        Answer::Gated {
            before: events[..2].to_vec(),
            after: events[2..].to_vec(),
            gate: gate.clone(),
        },
        Answer::sse(&events.iter().map(String::as_str).collect::<Vec<_>>()),
    ]);
    let d = Daemon::start_with(&openai_config(&p, ""), &[("key", KEY)]).unwrap();
    {
        let mut s = UnixStream::connect(&d.socket).unwrap();
        write_frame(&mut s, &Envelope::new(1, true, infer("go", 1))).unwrap();
        let until = Instant::now() + bxtest::DEADLINE;
        read_frame(&mut bxcore::deadline::Deadline::new(&s, until)).unwrap();
    }
    gate.open();
    let frames = d.ask(2, infer("go", 1));
    assert!(matches!(frames.last().unwrap().msg, Message::InferReply(_)));
    // The first was given up at its next event, quietly but for its line; the second answered.
    let log = d.wait_log("see docs/runbook.md#inference-abandoned");
    assert!(
        log.contains("loopd went away before the reply's end"),
        "{log}"
    );
    d.wait_log("a reply with 0 tool calls");
}

#[test]
fn a_cancelled_turn_stops_the_providers_stream_rather_than_reading_it_to_its_end() {
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let p = Provider::start(vec![Answer::Drip {
        every: Duration::from_millis(100),
        ended: ended.clone(),
    }]);
    let d = Daemon::start_with(&openai_config(&p, ""), &[("key", KEY)]).unwrap();
    let s = UnixStream::connect(&d.socket).unwrap();
    write_frame(&mut &s, &Envelope::new(1, true, infer("go", 1))).unwrap();
    let until = Instant::now() + bxtest::DEADLINE;
    let first = read_frame(&mut bxcore::deadline::Deadline::new(&s, until)).unwrap();
    assert!(matches!(first.msg, Message::InferDelta(_)), "{first:?}");
    // loopd's cancel: the connection shut down while the model still streams (for a minute).
    s.shutdown(std::net::Shutdown::Both).unwrap();
    bxtest::wait_for(
        "inferproxy to close the provider's connection",
        bxtest::DEADLINE,
        || ended.load(std::sync::atomic::Ordering::SeqCst),
    );
    let log = d.wait_log("see docs/runbook.md#inference-abandoned");
    assert!(log.contains("its connection closed"), "{log}");
}

#[test]
fn a_peer_not_on_the_list_is_refused() {
    let d = Daemon::start_env(
        &script_config("[peers]\n\"infer.sock\" = [4242424]\n"),
        &[("script.toml", SCRIPT)],
        &[],
        false,
    )
    .unwrap();
    let mut s = UnixStream::connect(&d.socket).unwrap();
    let until = Instant::now() + bxtest::DEADLINE;
    let env = read_frame(&mut bxcore::deadline::Deadline::new(&s, until)).unwrap();
    let me = nix::unistd::Uid::effective().as_raw();
    assert_eq!(
        env,
        Envelope::error(
            0,
            ErrorCode::Forbidden,
            format!("uid {me} may not connect to infer.sock")
        )
    );
    let mut rest = Vec::new();
    s.set_read_timeout(Some(bxtest::DEADLINE)).unwrap();
    let _ = s.read_to_end(&mut rest); // bounded: the read timeout above
    let line = format!(
        "inferproxy: refused a connection from uid {me} on infer.sock; see docs/runbook.md#socket-peer-refused"
    );
    assert!(d.wait_log(&line).contains(&line));
}

#[test]
fn the_key_never_appears_in_a_log_line_or_a_frame() {
    let body401 = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {KEY}.","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
    );
    let events = openai_stream(&["fine"]);
    let p = Provider::start(vec![
        Answer::sse(&events.iter().map(String::as_str).collect::<Vec<_>>()),
        Answer::json(401, &body401),
        Answer::json(500, &format!(r#"{{"error":{{"message":"{KEY}"}}}}"#)),
        Answer::json(500, &format!(r#"{{"error":{{"message":"{KEY}"}}}}"#)),
        Answer::json(500, &format!(r#"{{"error":{{"message":"{KEY}"}}}}"#)),
    ]);
    let d = Daemon::start_with(&openai_config(&p, ""), &[("key", &format!("  {KEY}\n"))]).unwrap();
    let mut frames = Vec::new();
    for id in 1..=3 {
        frames.extend(d.ask(id, infer("go", 1)));
    }
    frames.extend(d.ask(4, Message::ToolsList {}));
    // The provider got the key, in the auth header only.
    let seen = p.seen();
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    for s in &seen {
        assert_eq!(s.raw().matches(KEY).count(), 1, "{}", s.raw());
    }
    d.wait_log("answered 500 after 3 attempts");
    let log = d.log_text();
    assert!(log.contains("[redacted]"), "{log}");
    for line in log.lines() {
        assert!(!line.contains(KEY), "a log line shows the key: {line}");
    }
    for f in &frames {
        let text = serde_json::to_string(f).unwrap();
        assert!(!text.contains(KEY), "a frame shows the key: {text}");
    }
    // check prints what it would serve, and not the key either.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferproxy"))
        .args(["check", "--config"])
        .arg(&d.config)
        .output_bounded()
        .unwrap();
    assert!(out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("inferproxy: configuration ok"), "{all}");
    assert!(
        all.contains(&format!("key from {}/key", d.home.path().display())),
        "{all}"
    );
    assert!(!all.contains(KEY), "{all}");
}

#[test]
fn the_key_is_taken_from_the_credentials_directory() {
    let p = Provider::start(vec![Answer::sse(
        &openai_stream(&["ok"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )]);
    let config = openai_config(&p, "").replace("api_key_file = \"{home}/key\"\n", "");
    let creds = tempfile::tempdir().unwrap();
    write_private(&creds.path().join("api_key"), "sk-from-credentials\n");
    let d = Daemon::start_env(
        &config,
        &[],
        &[("CREDENTIALS_DIRECTORY", creds.path().display().to_string())],
        true,
    )
    .unwrap();
    d.ask(1, infer("go", 1));
    assert_eq!(
        p.seen()[0].header("authorization"),
        Some("Bearer sk-from-credentials")
    );
}

fn refused(config: &str, files: &[(&str, &str)]) -> String {
    match Daemon::start_with(config, files) {
        Ok(_) => panic!("it started"),
        Err(e) => e,
    }
}

#[test]
fn a_missing_key_file_refuses_to_start() {
    let p = Provider::start(vec![]);
    let e = refused(&openai_config(&p, ""), &[]);
    assert!(
        e.starts_with("inferproxy exited with exit status: 1"),
        "{e}"
    );
    assert!(
        e.contains("inferproxy: cannot read the API key file "),
        "{e}"
    );
    assert!(
        e.trim_end()
            .ends_with("see docs/runbook.md#inferproxy-key-missing"),
        "{e}"
    );
}

#[test]
fn an_empty_key_file_refuses_to_start() {
    let p = Provider::start(vec![]);
    let e = refused(&openai_config(&p, ""), &[("key", " \n")]);
    assert!(
        e.contains("/key is empty; see docs/runbook.md#inferproxy-key-missing"),
        "{e}"
    );
}

#[test]
fn a_key_file_others_may_read_refuses_to_start_with_its_pointer() {
    use std::os::unix::fs::PermissionsExt;
    let p = Provider::start(vec![]);
    let home = tempfile::tempdir().unwrap();
    let key = home.path().join("key");
    std::fs::write(&key, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = match Daemon::start_in(home, &openai_config(&p, ""), &[], true) {
        Ok(_) => panic!("it started with a key file of mode 0644"),
        Err(e) => e,
    };
    assert!(
        e.starts_with("inferproxy exited with exit status: 1"),
        "{e}"
    );
    assert!(e.contains("/key has mode 0644"), "{e}");
    assert!(
        e.trim_end()
            .ends_with("see docs/runbook.md#inferproxy-key-open"),
        "{e}"
    );
    assert!(!e.contains(KEY), "{e}");
    assert!(p.seen().is_empty());
}

/// The key as JSON writes it with every character escaped: `\u0073\u006b...`.
fn escaped(key: &str) -> String {
    key.chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect()
}

#[test]
fn a_key_json_escaped_in_a_401_body_reaches_no_log_line_and_no_frame() {
    let body = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {}.","type":"invalid_request_error","code":"invalid_api_key"}}}}"#,
        escaped(KEY)
    );
    let p = Provider::start(vec![Answer::json(401, &body)]);
    let d = Daemon::start_with(&openai_config(&p, ""), &[("key", KEY)]).unwrap();
    let frames = d.ask(1, infer("go", 1));
    let line = "the provider refused the API key (401): Incorrect API key provided: [redacted].";
    d.wait_log(line);
    let shown = format!("{}\n{frames:?}", d.log_text());
    assert!(shown.contains(line), "{shown}");
    for leak in [KEY.to_string(), escaped(KEY), escaped(&KEY[..8])] {
        assert!(!shown.contains(&leak), "{leak} is shown: {shown}");
    }
}

#[test]
fn a_key_split_across_two_stream_chunks_reaches_no_delta_and_no_reply() {
    let (head, tail) = KEY.split_at(7);
    let events = openai_stream(&["my key is ", head, tail, ", remember it"]);
    let p = Provider::start(vec![Answer::sse(
        &events.iter().map(String::as_str).collect::<Vec<_>>(),
    )]);
    let d = Daemon::start_with(&openai_config(&p, ""), &[("key", KEY)]).unwrap();
    let frames = d.ask(1, infer("go", 1));
    let deltas: String = frames
        .iter()
        .filter_map(|f| match &f.msg {
            Message::InferDelta(d) => Some(d.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, "my key is [redacted], remember it");
    for f in &frames {
        let text = serde_json::to_string(f).unwrap();
        assert!(!text.contains(KEY), "a frame shows the key: {text}");
        assert!(
            !text.contains(&format!("{head}\"")),
            "a frame ends in the key's first half: {text}"
        );
    }
    match &frames.last().unwrap().msg {
        Message::InferReply(r) => match &r.message {
            ChatMessage::Assistant { text, .. } => {
                assert_eq!(text, "my key is [redacted], remember it")
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_key_at_all_refuses_to_start() {
    let p = Provider::start(vec![]);
    let config = openai_config(&p, "").replace("api_key_file = \"{home}/key\"\n", "");
    let e = refused(&config, &[]);
    assert!(e.contains("no API key: set [provider] api_key_file"), "{e}");
}

#[test]
fn a_bad_config_refuses_to_start_and_check_says_why() {
    let config = script_config("[limits]\nretries = 99\n");
    let e = refused(&config, &[("script.toml", SCRIPT)]);
    assert!(e.contains("[limits] retries must be at most 10, not 99; see docs/runbook.md#inferproxy-config-invalid"), "{e}");
    let home = tempfile::tempdir().unwrap();
    let cfg = home.path().join("c.toml");
    std::fs::write(
        &cfg,
        config.replace("{home}", &home.path().display().to_string()),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferproxy"))
        .args(["check", "--config"])
        .arg(&cfg)
        .output_bounded()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("retries must be at most 10"));
}

#[test]
fn a_script_that_does_not_parse_refuses_to_start() {
    let e = refused(
        &script_config(""),
        &[("script.toml", "[[step]]\nwhat = 1\n")],
    );
    assert!(e.contains("the script "), "{e}");
    assert!(e.contains("unknown field"), "{e}");
}

#[test]
fn usage_errors_exit_2() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferproxy"))
        .arg("serve")
        .output_bounded()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_provider_named_localhost_is_resolved_inside_the_sandbox() {
    let p = Provider::start(vec![Answer::sse(
        &openai_stream(&["resolved"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )]);
    let config = openai_config(&p, "").replace("127.0.0.1", "localhost");
    let d = Daemon::start_with(&config, &[("key", KEY)]).unwrap();
    let frames = d.ask(1, infer("go", 1));
    assert!(
        matches!(frames.last().unwrap().msg, Message::InferReply(_)),
        "{frames:?}\n{}",
        d.log_text()
    );
}

#[test]
fn a_file_where_the_socket_goes_refuses_to_start() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("script.toml"), SCRIPT).unwrap();
    let dir = home.path().join("run/loop-infer");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(dir.join("infer.sock"), "not a socket").unwrap();
    let e = match Daemon::start_in(home, &script_config(""), &[], true) {
        Ok(_) => panic!("it started"),
        Err(e) => e,
    };
    assert!(e.contains("infer.sock"), "{e}");
    assert!(
        e.trim_end()
            .ends_with("see docs/runbook.md#socket-listen-failed"),
        "{e}"
    );
}

#[test]
fn an_own_directory_that_is_not_a_directory_refuses_to_start() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("script.toml"), SCRIPT).unwrap();
    std::fs::write(home.path().join("infer"), "a file").unwrap();
    let e = match Daemon::start_in(home, &script_config(""), &[], true) {
        Ok(_) => panic!("it started"),
        Err(e) => e,
    };
    assert!(
        e.contains("/infer: not a directory (a file or a symbolic link is in its place); see docs/runbook.md#state-dir-refused"),
        "{e}"
    );
}

#[test]
fn a_wide_own_directory_is_tightened_with_a_line() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("script.toml"), SCRIPT).unwrap();
    let own = home.path().join("infer");
    std::fs::create_dir(&own).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = Daemon::start_in(home, &script_config(""), &[], true).unwrap();
    let mode = std::fs::metadata(&own).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
    assert!(
        d.log_text()
            .contains("/infer: the directory was 0755, made 0700"),
        "{}",
        d.log_text()
    );
}

#[test]
fn a_slot_name_cannot_forge_a_log_line() {
    let d = script_daemon("");
    let mut m = infer("x", 1);
    if let Message::InferRequest(r) = &mut m {
        r.slot = format!("x\ninferproxy: forged; see docs/runbook.md#{}", "nothing");
    }
    let frames = d.ask(2, m);
    assert!(matches!(&frames[0].msg, Message::Error(e) if e.code == ErrorCode::Inference));
    let log = d.wait_log("inference-slot");
    assert!(
        !log.lines().any(|l| l.starts_with("inferproxy: forged")),
        "{log}"
    );
}

#[test]
fn many_requests_at_once_are_each_answered() {
    let d = script_daemon("");
    // The one step goes to whichever request comes first; the rule answers the rest. Fewer
    // than infer.sock's cap of 16: the start-up's ping holds a connection until its thread
    // lets go of it, a moment after its answer.
    let answers: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..12u64)
            .map(|i| {
                let d = &d;
                s.spawn(move || {
                    let frames = d.ask(100 + i, infer(&format!("q{i}"), 1));
                    let last = frames.last().unwrap();
                    assert_eq!((last.id, last.last), (100 + i, true));
                    let Message::InferReply(r) = &last.msg else {
                        panic!("{frames:?}")
                    };
                    let bxcore::ChatMessage::Assistant { text, .. } = &r.message else {
                        panic!("{r:?}")
                    };
                    text.clone()
                })
            })
            .collect();
        // bounded: each thread's ask reads to its deadline
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        answers
            .iter()
            .filter(|t| *t == "Let me look that up.")
            .count(),
        1
    );
    assert_eq!(
        answers.iter().filter(|t| *t == "Scripted reply.").count(),
        11
    );
}

#[test]
fn a_provider_that_stalls_one_request_does_not_hold_up_another() {
    let events = openai_stream(&["slow"]);
    let gate = Gate::default();
    let p = Provider::start(vec![
        Answer::Gated {
            before: events[..1].to_vec(),
            after: events[1..].to_vec(),
            gate: gate.clone(),
        },
        Answer::sse(
            &openai_stream(&["quick"])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        ),
    ]);
    let d = Daemon::start_with(&openai_config(&p, ""), &[("key", KEY)]).unwrap();
    let mut slow = UnixStream::connect(&d.socket).unwrap();
    write_frame(&mut slow, &Envelope::new(1, true, infer("slow", 1))).unwrap();
    // Wait until the provider holds the first request, then ask again.
    let until = Instant::now() + bxtest::DEADLINE;
    while p.seen().is_empty() {
        assert!(
            Instant::now() < until,
            "the first request never reached the provider"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let frames = d.ask(2, infer("quick", 1));
    let Message::InferReply(r) = &frames.last().unwrap().msg else {
        panic!("{frames:?}")
    };
    assert_eq!(
        r.message,
        bxcore::ChatMessage::Assistant {
            text: "quick".into(),
            tool_calls: vec![]
        }
    );
    gate.open();
    let until = Instant::now() + bxtest::DEADLINE;
    loop {
        let env = read_frame(&mut bxcore::deadline::Deadline::new(&slow, until)).unwrap();
        if env.last {
            assert!(matches!(env.msg, Message::InferReply(_)), "{env:?}");
            break;
        }
    }
}
