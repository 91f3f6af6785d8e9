//! A scripted inference socket: each `infer_request` takes the next step of the script, numbers
//! its tool calls from the request's `first_call` as inferproxy does, and streams its text as
//! `infer_delta` frames. An exhausted script answers plain text "done".

use std::collections::VecDeque;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bxcore::deadline::Deadline;
use bxcore::{
    CallId, ChatMessage, ErrorCode, InferDelta, InferReply, InferRequest, Message, ToolCall, Usage,
    read_frame,
};
use serde_json::Value;

use super::WAIT;
use super::broker::send;

/// One scripted answer.
pub enum Step {
    /// Text, streamed in pieces of at most 4 characters, no tool calls.
    Text(String),
    /// Tool calls (tool, args), numbered from the request's `first_call`; optional text.
    Tools(Vec<(String, Value)>),
    /// An `error` frame.
    Error(ErrorCode, String),
    /// A reply numbering its one tool call wrongly (first_call + 5).
    BadIds,
    /// Send one delta, then wait for the receiver (at most `bxtest::DEADLINE`) before going on
    /// with the inner step.
    Gate(String, Receiver<()>, Box<Step>),
    /// Close without a word.
    Close,
}

pub struct ScriptedInfer {
    pub path: PathBuf,
    pub requests: Arc<Mutex<Vec<InferRequest>>>,
    _server: bxtest::Server,
}

impl ScriptedInfer {
    pub fn start(path: &Path, script: Vec<Step>) -> ScriptedInfer {
        let listener = UnixListener::bind(path).unwrap();
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let r2 = Arc::clone(&requests);
        let server = bxtest::Server::each(listener, move |stream| serve(stream, &script, &r2));
        ScriptedInfer {
            path: path.to_path_buf(),
            requests,
            _server: server,
        }
    }

    pub fn requests(&self) -> Vec<InferRequest> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(mut s: UnixStream, script: &Mutex<VecDeque<Step>>, requests: &Mutex<Vec<InferRequest>>) {
    let read = read_frame(&mut Deadline::new(&s, Instant::now() + WAIT));
    let Ok(env) = read else {
        return;
    };
    let req = match env.msg {
        Message::InferRequest(r) => r,
        Message::Ping {} => {
            send(&mut s, env.id, true, Message::pong("inferproxy", "0.1.0"));
            return;
        }
        // As a script provider answers: it needs no network.
        Message::ProviderProbe {} => {
            let report = bxcore::ProviderReport {
                provider: "script (the test's)".into(),
                reachable: true,
                detail: "a scripted model answers from the test".into(),
            };
            send(&mut s, env.id, true, Message::ProviderReport(report));
            return;
        }
        _ => return,
    };
    requests.lock().unwrap().push(req.clone());
    let step = script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(Step::Text("done".to_string()));
    answer(&mut s, env.id, &req, step);
}

fn answer(s: &mut UnixStream, id: u64, req: &InferRequest, step: Step) {
    let usage = Usage {
        input_tokens: 10,
        output_tokens: 2,
    };
    let reply = |text: String, tool_calls: Vec<ToolCall>| {
        Message::InferReply(InferReply {
            message: ChatMessage::Assistant { text, tool_calls },
            usage,
        })
    };
    match step {
        Step::Text(text) => {
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(4) {
                send(
                    s,
                    id,
                    false,
                    Message::InferDelta(InferDelta {
                        text: piece.iter().collect(),
                    }),
                );
            }
            send(s, id, true, reply(text, Vec::new()));
        }
        Step::Tools(calls) => {
            let calls = calls
                .into_iter()
                .enumerate()
                .map(|(i, (tool, args))| ToolCall {
                    call: CallId(req.first_call.0 + i as u64),
                    tool,
                    args,
                })
                .collect();
            send(s, id, true, reply(String::new(), calls));
        }
        Step::Error(code, detail) => send(
            s,
            id,
            true,
            Message::Error(bxcore::WireError { code, detail }),
        ),
        Step::BadIds => {
            let calls = vec![ToolCall {
                call: CallId(req.first_call.0 + 5),
                tool: "time_now".to_string(),
                args: serde_json::json!({}),
            }];
            send(s, id, true, reply(String::new(), calls));
        }
        Step::Gate(delta, rx, inner) => {
            send(
                s,
                id,
                false,
                Message::InferDelta(InferDelta { text: delta }),
            );
            bxtest::gate(&rx);
            answer(s, id, req, *inner);
        }
        Step::Close => {}
    }
}
