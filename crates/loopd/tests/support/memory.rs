//! A fake memoryd: answers `turn_record` with `turn_filed` and remembers what it filed, in order.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bxcore::deadline::Deadline;
use bxcore::{Message, TurnFiled, TurnRecord, read_frame};

use super::WAIT;
use super::broker::send;

pub struct FakeMemory {
    pub path: PathBuf,
    pub filed: Arc<Mutex<Vec<TurnRecord>>>,
    _server: bxtest::Server,
}

impl FakeMemory {
    pub fn start(path: &Path) -> FakeMemory {
        let listener = UnixListener::bind(path).unwrap();
        let filed = Arc::new(Mutex::new(Vec::new()));
        let f2 = Arc::clone(&filed);
        // One connection at a time, as the sender sends in order.
        let server = bxtest::Server::in_turn(listener, move |mut s: UnixStream| {
            let Ok(env) = read_frame(&mut Deadline::new(&s, Instant::now() + WAIT)) else {
                return;
            };
            match env.msg {
                Message::TurnRecord(r) => {
                    let ack = TurnFiled {
                        session: r.session.clone(),
                        turn: r.turn,
                    };
                    f2.lock().unwrap().push(r);
                    send(&mut s, env.id, true, Message::TurnFiled(ack));
                }
                Message::Ping {} => send(&mut s, env.id, true, Message::pong("memoryd", "0.1.0")),
                _ => {}
            }
        });
        FakeMemory {
            path: path.to_path_buf(),
            filed,
            _server: server,
        }
    }

    pub fn filed(&self) -> Vec<TurnRecord> {
        self.filed.lock().unwrap().clone()
    }
}
