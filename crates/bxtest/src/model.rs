//! A model server on loopback that behaves like a real one in time and shape: an
//! OpenAI-compatible `POST /v1/chat/completions` that streams its answer (server-sent events in
//! a chunked body, as llama.cpp's server and OpenAI send them) at a person's pace, or stays
//! silent before its first byte, and `GET /v1/models` as a provider lists its models. Every
//! request body is kept, so a test can read what the model was shown.
//!
//! An instant scripted model proves the wire; this proves that a turn survives a model that
//! takes a minute, which is what a local model on a small device does.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};

use crate::serve::{Server, read_http_request};

/// One answer: silent for `silence`, then `pieces` of text, one every `every`, then the tool
/// calls (`(tool, arguments)`), then the end of the stream.
#[derive(Debug, Clone, Default)]
pub struct Paced {
    pub silence: Duration,
    pub pieces: Vec<String>,
    pub every: Duration,
    pub tool_calls: Vec<(String, Value)>,
}

impl Paced {
    /// `text` whole, at once.
    pub fn text(text: &str) -> Paced {
        Paced {
            pieces: vec![text.to_string()],
            ..Paced::default()
        }
    }

    /// `n` pieces `piece0`, `piece1`, ... one every `every`.
    pub fn streaming(n: usize, every: Duration) -> Paced {
        Paced {
            pieces: (0..n).map(|i| format!("piece{i} ")).collect(),
            every,
            ..Paced::default()
        }
    }

    /// Nothing for `silence`, then `text`.
    pub fn silent_then(silence: Duration, text: &str) -> Paced {
        Paced {
            silence,
            ..Paced::text(text)
        }
    }

    /// One call of `tool` with `args`, no text.
    pub fn call(tool: &str, args: Value) -> Paced {
        Paced {
            tool_calls: vec![(tool.to_string(), args)],
            ..Paced::default()
        }
    }

    /// The whole text it streams.
    pub fn whole(&self) -> String {
        self.pieces.concat()
    }
}

/// The model server. Answers come in the order given; after the last, the last again.
#[derive(Debug)]
pub struct PacedModel {
    port: u16,
    seen: Arc<Mutex<Vec<Value>>>,
    _server: Server,
}

impl PacedModel {
    pub fn start(answers: Vec<Paced>) -> PacedModel {
        assert!(!answers.is_empty(), "a model needs at least one answer");
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let asked = Arc::clone(&seen);
        let answers = Arc::new(answers);
        let server = Server::each(listener, move |conn: TcpStream| {
            serve(conn, &answers, &asked);
        });
        PacedModel {
            port,
            seen,
            _server: server,
        }
    }

    /// The base URL an OpenAI-compatible provider takes (`http://127.0.0.1:<port>/v1`).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Every chat request's JSON body, in the order they came.
    pub fn requests(&self) -> Vec<Value> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn serve(conn: TcpStream, answers: &[Paced], seen: &Mutex<Vec<Value>>) {
    let Ok(clone) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(clone);
    let mut conn = conn;
    // Keep-alive: one request after another on the connection, as a real server allows.
    while let Ok(Some(req)) = read_http_request(&mut reader) {
        if req.method == "GET" && req.path.ends_with("/models") {
            let body = json!({"object": "list", "data": [{"id": "m", "object": "model"}]});
            let body = body.to_string();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            if conn.write_all(head.as_bytes()).is_err() || conn.write_all(body.as_bytes()).is_err()
            {
                return;
            }
            continue;
        }
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let n = {
            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
            s.push(body);
            s.len() - 1
        };
        let answer = &answers[n.min(answers.len() - 1)];
        if stream(&mut conn, answer).is_err() {
            return;
        }
    }
}

/// One streamed answer, as a chunked body of server-sent events.
fn stream(conn: &mut TcpStream, a: &Paced) -> std::io::Result<()> {
    thread::sleep(a.silence);
    conn.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n",
    )?;
    let chunk = |conn: &mut TcpStream, event: &Value| -> std::io::Result<()> {
        let data = format!("data: {event}\n\n");
        conn.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())?;
        conn.flush()
    };
    let start = json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]});
    chunk(conn, &start)?;
    for (i, piece) in a.pieces.iter().enumerate() {
        if i > 0 {
            thread::sleep(a.every);
        }
        chunk(
            conn,
            &json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]}),
        )?;
    }
    for (i, (tool, args)) in a.tool_calls.iter().enumerate() {
        chunk(
            conn,
            &json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": format!("t{i}"),
                    "type": "function", "function": {"name": tool, "arguments": args.to_string()}}]},
                    "finish_reason": null}]}),
        )?;
    }
    let reason = if a.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    chunk(
        conn,
        &json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
            "usage": {"prompt_tokens": 10, "completion_tokens": a.pieces.len()}}),
    )?;
    let done = "data: [DONE]\n\n";
    conn.write_all(format!("{:x}\r\n{done}\r\n0\r\n\r\n", done.len()).as_bytes())?;
    conn.flush()
}
