//! A fake broker socket: each connection's request frame is read and handed, with the stream, to
//! the test's script, which answers however the test needs (right, wrong, slowly, not at all).

use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bxcore::deadline::Deadline;
use bxcore::{Envelope, Message, ToolDef, ToolResponse, Tools, read_frame, write_frame};

use super::WAIT;

/// What the fake broker saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub requests: Vec<Envelope>,
}

/// A broker socket served by a script, on its own thread, until it is dropped.
pub struct FakeBroker {
    pub path: PathBuf,
    pub seen: Arc<Mutex<Seen>>,
    _server: bxtest::Server,
}

impl FakeBroker {
    /// Serve `path`: for each connection, read one frame, record it, call `script`.
    pub fn start<F>(path: &Path, script: F) -> FakeBroker
    where
        F: Fn(&mut UnixStream, &Envelope) + Send + Sync + 'static,
    {
        let listener = UnixListener::bind(path).unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s2 = Arc::clone(&seen);
        let server = bxtest::Server::each(listener, move |mut stream: UnixStream| {
            let Ok(env) = read_frame(&mut Deadline::new(&stream, Instant::now() + WAIT)) else {
                return;
            };
            s2.lock().unwrap().requests.push(env.clone());
            script(&mut stream, &env);
        });
        FakeBroker {
            path: path.to_path_buf(),
            seen,
            _server: server,
        }
    }

    /// A broker that offers `tools` and answers every call with `result: ok <tool>`.
    pub fn ok(path: &Path, tools: Vec<ToolDef>) -> FakeBroker {
        FakeBroker::start(path, move |s, env| match &env.msg {
            Message::ToolsList {} => send(
                s,
                env.id,
                true,
                Message::Tools(Tools {
                    tools: tools.clone(),
                    workspace: Vec::new(),
                }),
            ),
            Message::ToolRequest(r) => send(
                s,
                env.id,
                true,
                Message::ToolResponse(ToolResponse::Result {
                    content: format!("ok {}", r.tool),
                    class: bxcore::DataClass::Public,
                    untrusted: false,
                }),
            ),
            Message::Ping {} => send(s, env.id, true, Message::pong("brokerd", "0.1.0")),
            _ => {}
        })
    }

    /// The tool requests seen, in order.
    pub fn tool_requests(&self) -> Vec<bxcore::ToolRequest> {
        self.seen
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter_map(|e| match &e.msg {
                Message::ToolRequest(r) => Some(r.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Answer nothing until loopd's end of the connection closes (its port gave up), at most the
/// connection's deadline: a silent broker that does not depend on how fast the port is.
pub fn hold(s: &mut UnixStream) {
    let _ = s.read(&mut [0u8; 1]);
}

/// Write one frame; a failure is ignored (the port may have gone).
pub fn send(s: &mut UnixStream, id: u64, last: bool, msg: Message) {
    let _ = write_frame(s, &Envelope::new(id, last, msg));
}

/// A tool definition with an open schema.
pub fn tool(name: &str) -> ToolDef {
    ToolDef {
        name: name.to_string(),
        description: format!("the {name} tool"),
        parameters: serde_json::json!({"type": "object"}),
    }
}
