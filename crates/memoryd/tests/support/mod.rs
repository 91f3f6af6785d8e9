//! The harness of memoryd's tests: a temporary home, the real memoryd and the real brokerd as
//! processes on their real sockets, one request per connection, and waits with deadlines.
//!
//! brokerd is another package: its binary is beside memoryd's when the workspace was built
//! (`cargo test --workspace`, as the gate runs). Built alone (`cargo test -p memoryd`), the tests
//! that need it say `skipped` (a failure under `CI=true`).

#![allow(dead_code)]

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bxcore::client::{self, ClientError};
use bxcore::{
    ChatMessage, Memory, MemoryRecall, MemoryRecent, MemoryRoute, Message, SessionId, TurnRecord,
};
use tempfile::TempDir;

/// Every wait's deadline: generous, nothing here measures speed.
pub const WAIT: Duration = bxtest::DEADLINE;

/// A temporary home for one test.
pub struct Home {
    pub dir: TempDir,
    pub home: PathBuf,
}

impl Home {
    pub fn new() -> Home {
        let dir = TempDir::new().unwrap();
        let home = dir.path().canonicalize().unwrap();
        Home { dir, home }
    }

    pub fn memory_sock(&self) -> PathBuf {
        self.home.join("run/loop-memory/memory.sock")
    }
    pub fn memories_sock(&self) -> PathBuf {
        self.home.join("run/owner-memory/memories.sock")
    }
    pub fn state_sock(&self) -> PathBuf {
        self.home.join("run/memory-broker/state.sock")
    }
    pub fn outbox(&self) -> PathBuf {
        self.home.join("memory/outbox")
    }
    pub fn store_file(&self) -> PathBuf {
        self.home.join("memory/local/memory.sqlite3")
    }

    /// The records waiting in memoryd's outbox.
    pub fn outbox_depth(&self) -> usize {
        match fs::read_dir(self.outbox()) {
            Ok(d) => d
                .filter_map(Result::ok)
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().to_string();
                    !n.starts_with('.') && n.ends_with(".json")
                })
                .count(),
            Err(_) => 0,
        }
    }

    /// brokerd's state for `session`, as its ledger writes it.
    pub fn set_state(&self, session: &str, class: &str, untrusted: bool) {
        let dir = self.home.join("broker/sessions");
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join(format!("{session}.json")),
            format!(r#"{{"taint":"{class}","untrusted":{untrusted}}}"#),
        )
        .unwrap();
    }

    /// memoryd.toml: the sandbox-free test config plus `extra`.
    pub fn memoryd_config(&self, extra: &str) -> PathBuf {
        let path = self.home.join("memoryd.toml");
        fs::write(
            &path,
            format!(
                "[paths]\nhome = {:?}\n\n[sandbox]\nrequire = false\n\n{extra}\n",
                self.home.display().to_string()
            ),
        )
        .unwrap();
        path
    }
}

/// A daemon process, killed and reaped when dropped.
pub type Proc = bxtest::Daemon;

fn spawn(bin: &Path, config: &Path, log: PathBuf) -> Proc {
    bxtest::Daemon::spawn(bin, "serve", config, &log)
}

fn next_log(h: &Home, name: &str) -> PathBuf {
    for n in 0.. {
        let p = h.home.join(format!("{name}.{n}.log"));
        if !p.exists() {
            return p;
        }
    }
    unreachable!()
}

/// Start memoryd with `extra` configuration and wait until both its sockets answer `ping`.
pub fn memoryd(h: &Home, extra: &str) -> Proc {
    let config = h.memoryd_config(extra);
    let mut p = spawn(
        Path::new(env!("CARGO_BIN_EXE_memoryd")),
        &config,
        next_log(h, "memoryd"),
    );
    wait_serving(&mut p, &[h.memory_sock(), h.memories_sock()], "memoryd");
    p
}

/// Start memoryd with the whole configuration file `config` and wait until both its sockets
/// answer `ping`.
pub fn memoryd_with_config(h: &Home, config: &Path) -> Proc {
    let bin = Path::new(env!("CARGO_BIN_EXE_memoryd"));
    let mut p = spawn(bin, config, next_log(h, "memoryd"));
    wait_serving(&mut p, &[h.memory_sock(), h.memories_sock()], "memoryd");
    p
}

fn wait_serving(p: &mut Proc, sockets: &[PathBuf], what: &str) {
    for s in sockets {
        p.wait_ready(&format!("{what} answering on {}", s.display()), || {
            client::ping(s, Duration::from_secs(5)).is_ok()
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// brokerd's binary beside memoryd's, or `None` (and a skip) when it was not built.
pub fn brokerd_bin() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_BIN_EXE_memoryd")).with_file_name("brokerd");
    if p.is_file() {
        Some(p)
    } else {
        bxtest::skip("brokerd is not built beside memoryd (run cargo test --workspace)");
        None
    }
}

/// Start the real brokerd on `h` and wait until its state socket answers.
pub fn brokerd(h: &Home, bin: &Path) -> Proc {
    let config = h.home.join("brokerd.toml");
    fs::write(
        &config,
        format!(
            "[paths]\nhome = {:?}\n\n[sandbox]\nrequire = false\n",
            h.home.display().to_string()
        ),
    )
    .unwrap();
    let mut p = spawn(bin, &config, next_log(h, "brokerd"));
    wait_serving(&mut p, &[h.state_sock()], "brokerd");
    p
}

pub fn session(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

/// A finished turn: the user's text and the assistant's answer.
pub fn record(s: &str, turn: u64, user: &str, assistant: &str) -> TurnRecord {
    TurnRecord {
        session: session(s),
        turn,
        messages: vec![
            ChatMessage::User {
                text: user.to_string(),
            },
            ChatMessage::Assistant {
                text: assistant.to_string(),
                tool_calls: vec![],
            },
        ],
    }
}

/// One request on its own connection; its final message, or the client's error.
pub fn call(socket: &Path, msg: Message) -> Result<Message, ClientError> {
    client::call(socket, Duration::from_secs(30), 7, msg, |_| {})
}

/// Hand `r` to memoryd and expect `turn_filed`.
pub fn hand_over(h: &Home, r: &TurnRecord) {
    match call(&h.memory_sock(), Message::TurnRecord(r.clone())) {
        Ok(Message::TurnFiled(f)) => {
            assert_eq!((f.session, f.turn), (r.session.clone(), r.turn));
        }
        other => panic!("turn_record was answered {other:?}"),
    }
}

/// The owner's `memory_recent` for `route`.
pub fn recent(h: &Home, route: Option<MemoryRoute>) -> Vec<Memory> {
    match call(
        &h.memories_sock(),
        Message::MemoryRecent(MemoryRecent { route, limit: 1000 }),
    ) {
        Ok(Message::Memories(m)) => m.memories,
        other => panic!("memory_recent was answered {other:?}"),
    }
}

pub fn recall(h: &Home, s: &str, query: &str, max_tokens: u32) -> Result<Message, ClientError> {
    call(
        &h.memory_sock(),
        Message::MemoryRecall(MemoryRecall {
            session: session(s),
            query: query.to_string(),
            max_tokens,
        }),
    )
}

/// Wait for `ready`, failing with `what` past the deadline.
pub fn wait_until(what: &str, ready: impl FnMut() -> bool) {
    bxtest::wait_for(what, WAIT, ready);
}

/// The outbox drained: every turn handed over is filed.
pub fn wait_drained(h: &Home) {
    wait_until("memoryd's outbox to drain", || h.outbox_depth() == 0);
}

/// Send raw bytes as one connection and read whatever comes back.
pub fn raw(socket: &Path, bytes: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(bytes).unwrap();
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    // bounded: the read timeout above ends it
    let _ = s.read_to_end(&mut out);
    out
}
