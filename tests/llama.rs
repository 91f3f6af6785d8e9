//! A real llama.cpp server answers a turn through the box (issue 25): llama-cpp-python's
//! OpenAI-compatible server, built by the gate (`.ci/llama-up`; `LLAMA_SERVER` names its
//! virtualenv's Python), serving a tiny llama-architecture GGUF this test writes with seeded
//! random weights (`tests/peers/tiny_gguf.py`). The box reaches it as the README's local
//! llama.cpp: `--provider openai --base-url http://127.0.0.1:PORT/v1`, keyless.
//!
//! The model's words are random: the test asserts the shape of the turn (it ends, with text,
//! in the session's log, and `status` finds the provider), never what was said.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use boxmaker_e2e::{DEADLINE, DevBox, said};
use bxtest::Bounded;
use serde_json::Value;

/// The environment variable naming the Python of a virtualenv with llama-cpp-python's server
/// and gguf (`.ci/peers` sets it).
const LLAMA_SERVER: &str = "LLAMA_SERVER";

/// The slot's `max_tokens`: the model never ends an answer by itself (tiny_gguf.py), so every
/// answer is this long.
const MAX_TOKENS: i64 = 24;

fn llama_python() -> Option<PathBuf> {
    match std::env::var(LLAMA_SERVER) {
        Ok(p) if !p.trim().is_empty() => Some(PathBuf::from(p.trim())),
        _ => {
            bxtest::skip(
                "LLAMA_SERVER is not set: no llama-cpp-python server to test against \
                 (.ci/peers builds one with .ci/llama-up; see docs/testing.md)",
            );
            None
        }
    }
}

/// The tiny model, written to `model` by the virtualenv's Python.
fn tiny_gguf(python: &Path, model: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/tiny_gguf.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script).arg(model);
    let out = bxtest::run(&mut cmd, "tiny_gguf.py", DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "tiny_gguf.py: {}", said(&out));
}

/// Whether an HTTP server on `port` answers `GET /v1/models` with 200.
fn models_answer(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let limit = Some(Duration::from_secs(10));
    if s.set_read_timeout(limit).is_err() || s.set_write_timeout(limit).is_err() {
        return false;
    }
    let req =
        format!("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut got = Vec::new();
    // bounded: the read timeout set above.
    let _ = s.read_to_end(&mut got);
    got.starts_with(b"HTTP/1.1 200")
}

/// llama-cpp-python's server on a loopback port of its own, serving `model` as `m`, its output
/// in `log`; reaped (its whole process group) when dropped.
struct LlamaServer {
    port: u16,
    log: PathBuf,
    _child: Bounded,
}

impl LlamaServer {
    fn start(python: &Path, model: &Path, log: &Path) -> LlamaServer {
        // A port is free when asked for and taken again when the server binds it; another
        // process may take it in between, so a server that could not bind it starts again.
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a loopback port")
                .port();
            let mut cmd = Command::new(python);
            cmd.args(["-m", "llama_cpp.server", "--model"])
                .arg(model)
                .args(["--model_alias", "m", "--host", "127.0.0.1"])
                .args(["--port", &port.to_string()])
                // The box's first prompt is some 1300 of this vocabulary's tokens, over the
                // server's default 2048 with the answer once a session grows; the chat
                // template is the model's own (tokenizer.chat_template).
                .args(["--n_ctx", "8192", "--n_threads", "1", "--seed", "25"])
                .stdin(Stdio::null());
            let file = fs::File::create(log).unwrap();
            cmd.stdout(file.try_clone().unwrap()).stderr(file);
            let mut child =
                Bounded::spawn(&mut cmd, "llama_cpp.server").unwrap_or_else(|e| panic!("{e}"));
            let up = bxtest::try_wait_for(
                "llama_cpp.server to answer GET /v1/models",
                DEADLINE,
                || child.exited().is_some() || models_answer(port),
            );
            if up.is_ok() && child.exited().is_none() {
                return LlamaServer {
                    port,
                    log: log.to_path_buf(),
                    _child: child,
                };
            }
            let status = child.kill_and_collect().status;
            let text = fs::read_to_string(log).unwrap_or_default();
            if up.is_ok() && text.contains("address already in use") {
                continue;
            }
            let why = up
                .err()
                .unwrap_or_else(|| format!("llama_cpp.server ended: {status}"));
            panic!("{why}; it said:\n{text}");
        }
        panic!("llama_cpp.server found its port taken three times");
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// What the server has said so far.
    fn said(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The turn's frames from `bxctl chat --json`, one JSON document a line.
fn frames(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn a_llama_cpp_server_answers_a_turn_through_the_box() {
    let Some(python) = llama_python() else {
        return;
    };
    let b = DevBox::new();
    let model = b.beside("tiny.gguf");
    tiny_gguf(&python, &model);
    let server = LlamaServer::start(&python, &model, &b.beside("llama-server.log"));
    let url = server.base_url();
    b.up(&["--provider", "openai", "--base-url", &url, "--model", "m"]);

    // A short answer: the slot's max_tokens, then the box again with it.
    let config = b.home().join("etc/inferproxy.toml");
    let mut t: toml::Table = fs::read_to_string(&config).unwrap().parse().unwrap();
    t["slots"]["main"]
        .as_table_mut()
        .expect("[slots.main]")
        .insert("max_tokens".into(), toml::Value::Integer(MAX_TOKENS));
    fs::write(&config, toml::to_string(&t).unwrap()).unwrap();
    let out = b.bxctl(&["dev", "restart"]);
    assert!(out.status.success(), "dev restart: {}", said(&out));

    let message = "Hello! What is on my todo list?";
    let out = b.bxctl(&["chat", "--json", "--session", "llama", message]);
    let f = frames(&out.stdout);
    assert!(
        out.status.success(),
        "{}\nthe server said: {}",
        said(&out),
        server.said()
    );
    let last = f.last().expect("at least the turn's end");
    assert_eq!(last["msg"]["kind"], "turn_done", "{f:?}");
    let text: String = f
        .iter()
        .filter(|f| f["msg"]["event"]["type"] == "assistant_text")
        .filter_map(|f| f["msg"]["event"]["text"].as_str())
        .collect();
    assert!(!text.trim().is_empty(), "the model said something: {f:?}");

    // The session's log has the turn: the owner's message and the model's answer.
    let log = fs::read_to_string(b.home().join("loop/sessions/llama.jsonl")).unwrap();
    let records: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let strings = |v: &Value| -> Vec<String> {
        let mut all = Vec::new();
        collect_strings(v, &mut all);
        all
    };
    assert!(
        records
            .iter()
            .any(|r| strings(r).iter().any(|s| s == message)),
        "the owner's message is in the log:\n{log}"
    );
    assert!(
        records
            .iter()
            .any(|r| strings(r).iter().any(|s| s == &text)),
        "the answer is in the log:\n{log}"
    );
    assert!(!log.contains(r#""error""#), "the turn ended well:\n{log}");

    // Health: every check passes, the provider's among them, asked of the real server.
    let out = b.bxctl(&["status", "--json"]);
    assert!(out.status.success(), "status: {}", said(&out));
    let s: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(s["problems"].as_array().map(Vec::len), Some(0), "{s}");
    let out = b.bxctl(&["status"]);
    let human = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(human.ends_with("status: healthy\n"), "{human}");
    drop(server);
}

fn collect_strings(v: &Value, all: &mut Vec<String>) {
    match v {
        Value::String(s) => all.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|v| collect_strings(v, all)),
        Value::Object(m) => m.values().for_each(|v| collect_strings(v, all)),
        _ => {}
    }
}
