//! A model provider on loopback for the tests: a small HTTP/1.1 server that records every
//! request and answers each with the next scripted response, in the providers' real wire
//! formats (chunked server-sent events, JSON errors, `Retry-After`).

#![allow(dead_code)]

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Header names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the request body is JSON")
    }
    /// The request's head and body as text, for greps.
    pub fn raw(&self) -> String {
        let mut s = format!("{} {}\r\n", self.method, self.path);
        for (n, v) in &self.headers {
            s.push_str(&format!("{n}: {v}\r\n"));
        }
        s.push_str(&String::from_utf8_lossy(&self.body));
        s
    }
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A status, extra headers and a whole body (`Content-Length`).
    Whole {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// `200`, `text/event-stream`, each piece its own chunk; `cut` stops before the last
    /// chunk and closes the connection.
    Stream { pieces: Vec<String>, cut: bool },
    /// `200`, `text/event-stream`: `before` sent, then nothing until `gate` opens, then `after`.
    Gated {
        before: Vec<String>,
        after: Vec<String>,
        gate: Gate,
    },
    /// `200` event-stream headers, then one byte every `every` for ever (until the client
    /// goes away or a minute has passed).
    Trickle { every: Duration },
    /// A model that streams for a minute: an OpenAI text chunk every `every`, until the client
    /// goes away (then `ended` is set) or the minute has passed.
    Drip {
        every: Duration,
        ended: Arc<std::sync::atomic::AtomicBool>,
    },
}

impl Answer {
    pub fn json(status: u16, body: &str) -> Answer {
        Answer::Whole {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string(),
        }
    }
    pub fn with_header(mut self, name: &str, value: &str) -> Answer {
        if let Answer::Whole { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }
    /// An event stream of these pieces of text, each sent as it is.
    pub fn sse(pieces: &[&str]) -> Answer {
        Answer::Stream {
            pieces: pieces.iter().map(|p| (*p).to_string()).collect(),
            cut: false,
        }
    }
    /// The same, cut off after the pieces.
    pub fn sse_cut(pieces: &[&str]) -> Answer {
        Answer::Stream {
            pieces: pieces.iter().map(|p| (*p).to_string()).collect(),
            cut: true,
        }
    }
}

/// OpenAI's `data: {...}\n\n` framing for each chunk, then `data: [DONE]`.
pub fn openai_events(chunks: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    v.push("data: [DONE]\n\n".into());
    v
}

/// Anthropic's `event: <type>\ndata: {...}\n\n` framing.
pub fn anthropic_events(events: &[&str]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).expect("test event is JSON");
            format!("event: {}\ndata: {e}\n\n", v["type"].as_str().unwrap())
        })
        .collect()
}

/// The server: answers in order; once the script is used up, every request gets a 599. It
/// serves until dropped.
pub struct Provider {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    _server: bxtest::Server,
}

impl Provider {
    pub fn start(answers: Vec<Answer>) -> Provider {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let queue = Arc::new(Mutex::new(answers.into_iter()));
        let s = seen.clone();
        let server = bxtest::Server::each(listener, move |conn| {
            let _ = serve(conn, &s, &queue);
        });
        Provider {
            addr,
            seen,
            _server: server,
        }
    }

    pub fn base_url(&self, suffix: &str) -> String {
        format!("http://{}{suffix}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(
    conn: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    queue: &Mutex<std::vec::IntoIter<Answer>>,
) -> std::io::Result<()> {
    // Reads and writes give up at bxtest's deadline (bxtest::Server).
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    loop {
        // bounded: the connection's read timeout (bxtest::Server)
        let Some(bxtest::HttpRequest {
            method,
            path,
            headers,
            body,
        }) = bxtest::read_http_request(&mut reader)?
        else {
            return Ok(());
        };
        // The answer is taken before the request is recorded: once a test sees a request, its
        // answer is spoken for.
        let answer = queue.lock().unwrap().next().unwrap_or(Answer::json(
            599,
            r#"{"error":{"message":"the test script has no more answers"}}"#,
        ));
        seen.lock().unwrap().push(Seen {
            method,
            path,
            headers,
            body,
            at: Instant::now(),
        });
        match answer {
            Answer::Whole {
                status,
                headers,
                body,
            } => {
                let mut head = format!(
                    "HTTP/1.1 {status} Status\r\ncontent-length: {}\r\n",
                    body.len()
                );
                for (n, v) in headers {
                    head.push_str(&format!("{n}: {v}\r\n"));
                }
                head.push_str("\r\n");
                out.write_all(head.as_bytes())?;
                out.write_all(body.as_bytes())?;
                out.flush()?;
            }
            Answer::Stream { pieces, cut } => {
                out.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n\
                      transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n",
                )?;
                for p in pieces {
                    out.write_all(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes())?;
                    out.flush()?;
                }
                if cut {
                    out.shutdown(std::net::Shutdown::Both)?;
                    return Ok(());
                }
                out.write_all(b"0\r\n\r\n")?;
                out.flush()?;
            }
            Answer::Gated {
                before,
                after,
                gate,
            } => {
                out.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                      transfer-encoding: chunked\r\n\r\n",
                )?;
                for p in before {
                    out.write_all(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes())?;
                    out.flush()?;
                }
                gate.wait(); // bounded: Gate::wait gives up after a minute
                for p in after {
                    out.write_all(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes())?;
                    out.flush()?;
                }
                out.write_all(b"0\r\n\r\n")?;
                out.flush()?;
            }
            Answer::Drip { every, ended } => {
                out.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                      transfer-encoding: chunked\r\n\r\n",
                )?;
                let chunk = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\
                             \"choices\":[{\"index\":0,\"delta\":{\"content\":\"word \"}}]}\n\n";
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(60) {
                    let sent = out
                        .write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes())
                        .and_then(|()| out.flush());
                    if sent.is_err() {
                        ended.store(true, std::sync::atomic::Ordering::SeqCst);
                        return Ok(());
                    }
                    thread::sleep(every);
                }
                return Ok(());
            }
            Answer::Trickle { every } => {
                out.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                      transfer-encoding: chunked\r\n\r\n",
                )?;
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(60) {
                    // One comment byte at a time: a keep-alive that never ends an event.
                    out.write_all(b"1\r\n:\r\n")?;
                    out.flush()?;
                    thread::sleep(every);
                }
                return Ok(());
            }
        }
    }
}

/// The key every test provider is configured with.
pub const KEY: &str = "sk-test-KEY-4f9c2a7e1b";

pub use bxtest::write_private;

/// An `Inference` for `kind` at `base_url`, with the key in a file in `home` and fast retries.
pub fn inference(
    home: &std::path::Path,
    kind: &str,
    base_url: &str,
    limits: &str,
) -> inferproxy::Inference {
    inference_with(home, kind, base_url, "", limits)
}

/// The same, with more `[provider]` keys.
pub fn inference_with(
    home: &std::path::Path,
    kind: &str,
    base_url: &str,
    provider: &str,
    limits: &str,
) -> inferproxy::Inference {
    let key = home.join("api_key");
    write_private(&key, &format!("{KEY}\n"));
    let text = format!(
        r#"
[paths]
home = "{home}"

[provider]
kind = "{kind}"
base_url = "{base_url}"
api_key_file = "{key}"
{provider}

[slots.main]
model = "test-model"
max_tokens = 512
context_tokens = 100000
temperature = 0.5

[limits]
{limits}
"#,
        home = home.display(),
        key = key.display(),
    );
    let cfg =
        bxharden::daemon::parse::<inferproxy::Config>(std::path::Path::new("test.toml"), &text)
            .unwrap();
    inferproxy::Inference::from_config(&cfg, None).unwrap()
}

/// The request every translation test sends: a whole history with tool calls and results.
pub fn history_request() -> bxcore::InferRequest {
    serde_json::from_value(serde_json::json!({
        "slot": "main",
        "first_call": 6,
        "messages": [
            {"role": "system", "text": "You are terse."},
            {"role": "user", "text": "What's the weather in Paris and the time?"},
            {"role": "assistant", "text": "Checking.", "tool_calls": [
                {"call": 3, "tool": "get_weather", "args": {"city": "Paris"}},
                {"call": 4, "tool": "time_now", "args": {}}
            ]},
            {"role": "tool", "call": 3, "text": "18°C, light rain"},
            {"role": "tool", "call": 4, "text": "2026-11-30T08:00:00Z"},
            {"role": "user", "text": "Thanks. And tomorrow?"},
            {"role": "assistant", "text": "", "tool_calls": [
                {"call": 5, "tool": "get_weather", "args": {"city": "Paris", "day": "tomorrow"}}
            ]},
            {"role": "tool", "call": 5, "text": ""}
        ],
        "tools": [
            {"name": "get_weather", "description": "Weather for a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            {"name": "time_now", "description": "The time",
             "parameters": {"type": "object", "properties": {}}}
        ]
    }))
    .unwrap()
}

/// A one-message request.
pub fn hello_request() -> bxcore::InferRequest {
    serde_json::from_value(serde_json::json!({
        "slot": "main", "first_call": 1, "tools": [],
        "messages": [{"role": "user", "text": "Say hello."}]
    }))
    .unwrap()
}

/// Run one inference, collecting the forwarded text pieces.
pub fn run(
    inf: &inferproxy::Inference,
    req: &bxcore::InferRequest,
) -> (
    Result<bxcore::InferReply, inferproxy::InferError>,
    Vec<String>,
) {
    let mut pieces = Vec::new();
    let r = inf.infer(req, &mut |t| pieces.push(t.to_string()));
    (r, pieces)
}

/// A gate a test opens once, for a server thread waiting on it (at most a minute).
#[derive(Debug, Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, std::sync::Condvar)>);

impl Gate {
    pub fn open(&self) {
        *self.0.0.lock().unwrap() = true;
        self.0.1.notify_all();
    }
    pub fn wait(&self) {
        let (lock, cv) = &*self.0;
        let g = lock.lock().unwrap();
        let _ = cv
            .wait_timeout_while(g, Duration::from_secs(60), |open| !*open)
            .unwrap();
    }
}

/// The real `inferproxy serve` on a temporary home, killed and reaped when dropped. Its stderr
/// goes to `<home>/inferproxy.log`.
pub struct Daemon {
    pub home: tempfile::TempDir,
    pub config: std::path::PathBuf,
    pub socket: std::path::PathBuf,
    pub log: std::path::PathBuf,
    daemon: bxtest::Daemon,
}

impl Daemon {
    /// Write `config` (with `{home}` replaced) into a fresh home and start the daemon; `Err`
    /// with its log when it exits before serving.
    pub fn start(config: &str) -> Result<Daemon, String> {
        Daemon::start_with(config, &[])
    }

    /// The same, with `files` (name, text) written into the home first.
    pub fn start_with(config: &str, files: &[(&str, &str)]) -> Result<Daemon, String> {
        Daemon::start_env(config, files, &[], true)
    }

    /// The same, with environment variables, and waiting for `ping` or (`ping = false`, for a
    /// daemon that refuses the test's uid) for the serving notice.
    pub fn start_env(
        config: &str,
        files: &[(&str, &str)],
        env: &[(&str, String)],
        ping: bool,
    ) -> Result<Daemon, String> {
        let home = tempfile::tempdir().unwrap();
        for (name, text) in files {
            write_private(&home.path().join(name), text);
        }
        Daemon::start_in(home, config, env, ping)
    }

    pub fn start_in(
        home: tempfile::TempDir,
        config: &str,
        env: &[(&str, String)],
        ping: bool,
    ) -> Result<Daemon, String> {
        let text = config.replace("{home}", &home.path().display().to_string());
        let cfg = home.path().join("inferproxy.toml");
        std::fs::write(&cfg, text).unwrap();
        let log = home.path().join("inferproxy.log");
        let bin = std::path::Path::new(env!("CARGO_BIN_EXE_inferproxy"));
        let daemon = bxtest::Daemon::spawn_command(
            bxtest::daemon_command(bin, "serve", &cfg, &log)
                .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
            &log,
        );
        let socket = home.path().join("run/loop-infer/infer.sock");
        let mut d = Daemon {
            home,
            config: cfg,
            socket,
            log,
            daemon,
        };
        if ping {
            let socket = d.socket.clone();
            d.daemon.wait_ready("ping", || {
                bxcore::client::ping(&socket, Duration::from_secs(5)).is_ok()
            })?;
        } else {
            let log = d.log.clone();
            d.daemon.wait_ready("its serving notice", || {
                bxtest::without_times(&std::fs::read_to_string(&log).unwrap_or_default())
                    .contains("inferproxy: serving inference")
            })?;
        }
        Ok(d)
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    /// What it logged, each line without the time it starts with.
    pub fn log_text(&self) -> String {
        self.daemon.log_text()
    }

    /// Send one request; every frame of the answer, the final one last.
    pub fn ask(&self, id: u64, msg: bxcore::Message) -> Vec<bxcore::Envelope> {
        use bxcore::{read_frame, write_frame};
        let mut s = std::os::unix::net::UnixStream::connect(&self.socket).unwrap();
        write_frame(&mut s, &bxcore::Envelope::new(id, true, msg)).unwrap();
        let until = Instant::now() + bxtest::DEADLINE;
        let mut out = Vec::new();
        loop {
            let env = read_frame(&mut bxcore::deadline::Deadline::new(&s, until)).unwrap();
            let last = env.last;
            out.push(env);
            if last {
                return out;
            }
        }
    }

    /// Wait until the log has a line containing `needle`: the whole log.
    pub fn wait_log(&self, needle: &str) -> String {
        self.daemon.wait_log(needle)
    }

    /// Wait until the log holds `needle` at least `n` times.
    pub fn wait_log_n(&self, needle: &str, n: usize) -> String {
        self.daemon.wait_log_n(needle, n)
    }
}

/// A config for the daemon with the script provider at `{home}/script.toml` (`{home}` is
/// replaced by the home).
pub fn script_config(extra: &str) -> String {
    format!(
        r#"
[paths]
home = "{{home}}"

[provider]
kind = "script"
script = "{{home}}/script.toml"

[slots.main]
model = "scripted"
max_tokens = 100
context_tokens = 100000

[sandbox]
require = false
{extra}
"#
    )
}
