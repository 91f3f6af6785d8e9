//! A third-party peer: `fakellm` (a mock server that speaks both the OpenAI and the Anthropic
//! HTTP APIs from YAML rules) on loopback, driven through the real inferproxy daemon for a
//! two-turn tool flow with each API. `.ci/run` installs it into a virtualenv and sets
//! `FAKELLM`; without it the test says `skipped:` and why.

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bxcore::{CallId, ChatMessage, InferRequest, Message, ToolCall, ToolDef};
use common::*;
use serde_json::json;

const RULES: &str = r#"
version: 1
defaults:
  fallback: deterministic_echo
rules:
  - name: summarize
    when:
      tool_result_contains: "light rain"
    respond:
      content: "It is raining in Paris, take an umbrella."
  - name: weather
    when:
      messages_contain: "weather"
    respond:
      tool_calls:
        - name: get_weather
          arguments: {city: "Paris", units: "metric"}
"#;

/// The fakellm executable: `$FAKELLM`, else `fakellm` on `PATH`.
fn fakellm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FAKELLM") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("fakellm"))
            .find(|p| p.is_file())
    })
}

/// fakellm serving `RULES` on a loopback port; killed and reaped when dropped.
struct Fake {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Fake {
    fn start(exe: &PathBuf) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("fakellm.yaml");
        std::fs::write(&rules, RULES).unwrap();
        // fakellm takes a port number, not 0: ask the kernel for a free one.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(exe)
            .args([
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--config",
            ])
            .arg(&rules)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut f = Fake {
            child,
            port,
            _dir: dir,
        };
        let until = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = f.child.try_wait() {
                panic!("fakellm exited {status} before listening on {port}");
            }
            assert!(Instant::now() < until, "fakellm never listened on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        f
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        bxtest::reap(&mut self.child);
    }
}

fn config(kind: &str, base_url: &str) -> String {
    format!(
        r#"
[paths]
home = "{{home}}"

[provider]
kind = "{kind}"
base_url = "{base_url}"
api_key_file = "{{home}}/key"

[slots.main]
model = "gpt-4o-mini"
max_tokens = 200
context_tokens = 100000

[sandbox]
require = false
"#
    )
}

fn tools() -> Vec<ToolDef> {
    vec![ToolDef {
        name: "get_weather".into(),
        description: "Weather for a city".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    }]
}

fn final_reply(frames: &[bxcore::Envelope]) -> bxcore::InferReply {
    match &frames.last().unwrap().msg {
        Message::InferReply(r) => r.clone(),
        other => panic!("not a reply: {other:?}"),
    }
}

fn two_turns(kind: &str, base: &str) {
    let Some(exe) = fakellm() else {
        bxtest::skip("fakellm is not installed (set FAKELLM, or let .ci/run install it)");
        return;
    };
    let fake = Fake::start(&exe);
    let url = format!("http://127.0.0.1:{}{base}", fake.port);
    let d = Daemon::start_with(&config(kind, &url), &[("key", KEY)]).unwrap();

    // Turn 1: the model asks for a tool.
    let user = ChatMessage::User {
        text: "What's the weather in Paris?".into(),
    };
    let frames = d.ask(
        1,
        Message::InferRequest(InferRequest {
            slot: "main".into(),
            messages: vec![user.clone()],
            tools: tools(),
            first_call: CallId(21),
        }),
    );
    let call = ToolCall {
        call: CallId(21),
        tool: "get_weather".into(),
        args: json!({"city": "Paris", "units": "metric"}),
    };
    assert_eq!(
        final_reply(&frames).message,
        ChatMessage::Assistant {
            text: String::new(),
            tool_calls: vec![call.clone()]
        },
        "{}",
        d.log_text()
    );

    // Turn 2: the tool's result goes back; the model answers in streamed text.
    let frames = d.ask(
        2,
        Message::InferRequest(InferRequest {
            slot: "main".into(),
            messages: vec![
                user,
                ChatMessage::Assistant {
                    text: String::new(),
                    tool_calls: vec![call],
                },
                ChatMessage::Tool {
                    call: CallId(21),
                    text: "18°C, light rain".into(),
                },
            ],
            tools: tools(),
            first_call: CallId(22),
        }),
    );
    let deltas: Vec<&str> = frames
        .iter()
        .filter_map(|f| match &f.msg {
            Message::InferDelta(d) => Some(d.text.as_str()),
            _ => None,
        })
        .collect();
    assert!(deltas.len() > 1, "streamed in pieces: {deltas:?}");
    assert_eq!(deltas.concat(), "It is raining in Paris, take an umbrella.");
    assert_eq!(
        final_reply(&frames).message,
        ChatMessage::Assistant {
            text: "It is raining in Paris, take an umbrella.".into(),
            tool_calls: vec![]
        }
    );
}

#[test]
fn fakellm_speaks_openai_to_inferproxy() {
    two_turns("openai", "/v1");
}

#[test]
fn fakellm_speaks_anthropic_to_inferproxy() {
    two_turns("anthropic", "");
}
