//! Real brokerd processes on temporary homes, and a client that reads through a deadline.
#![allow(dead_code)]

use bxtest::OutputBounded;
use std::fs;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bxcore::deadline::Deadline;
use bxcore::{
    ApprovalSummary, CallId, Envelope, Message, SessionId, ToolRequest, read_frame, write_frame,
};
use tempfile::TempDir;

/// Every wait in these tests.
pub const WAIT: Duration = bxtest::DEADLINE;

/// A temporary home with a brokerd.toml.
pub struct Home {
    pub dir: TempDir,
    pub home: PathBuf,
    pub config: PathBuf,
}

impl Home {
    /// A home whose config is the sandbox-free test config plus `extra` TOML.
    pub fn new(extra: &str) -> Home {
        let dir = TempDir::new().unwrap();
        let home = dir.path().canonicalize().unwrap();
        let config = home.join("brokerd.toml");
        let h = Home { dir, home, config };
        h.write_config(extra);
        h
    }

    /// A home whose config is `[paths]` plus `extra` TOML, the sandbox required (the default):
    /// what `brokerd check` is asked about tool servers, which need it.
    pub fn sandboxed(extra: &str) -> Home {
        let h = Home::new("");
        h.write_sandboxed(extra);
        h
    }

    /// The config `[paths]` plus `extra`, the sandbox required ([`Home::sandboxed`]).
    pub fn write_sandboxed(&self, extra: &str) {
        let text = format!(
            "[paths]\nhome = {:?}\n\n{extra}\n",
            self.home.display().to_string()
        );
        fs::write(&self.config, text).unwrap();
    }

    /// A home with a writable private root `notes`, its config plus `extra` TOML: what the
    /// approval tests write into.
    pub fn with_notes(extra: &str) -> Home {
        let h = Home::new("");
        h.dir("notes");
        h.write_config(&format!(
            "[[workspace.roots]]\npath = {:?}\nclass = \"private\"\nwritable = true\n\n{extra}",
            h.home.join("notes").display().to_string()
        ));
        h
    }

    pub fn write_config(&self, extra: &str) {
        let text = format!(
            "[paths]\nhome = {:?}\n\n[sandbox]\nrequire = false\n\n{extra}\n",
            self.home.display().to_string()
        );
        fs::write(&self.config, text).unwrap();
    }

    /// The config `[paths]` plus `body`, under the real sandbox: as root, brokerd drops to
    /// `nobody` (the home is given to it) and root's uid may connect; otherwise it runs as the
    /// test's user.
    pub fn write_confined(&self, body: &str) {
        let text = if is_root() {
            let nobody = nix::unistd::User::from_name("nobody")
                .unwrap()
                .expect("a nobody user");
            chown_tree(&self.home, nobody.uid.as_raw(), nobody.gid.as_raw());
            format!(
                "[paths]\nhome = {:?}\n\n[sandbox]\nuser = \"nobody\"\n\n[peers]\n\"broker.sock\" = [0]\n\"admin.sock\" = [0]\n\"state.sock\" = [0]\n\n{body}",
                self.home.display().to_string()
            )
        } else {
            format!(
                "[paths]\nhome = {:?}\n\n{body}",
                self.home.display().to_string()
            )
        };
        fs::write(&self.config, text).unwrap();
    }

    /// `[gateway] socket` naming a socket nobody serves: `web_fetch` is offered (a gateway is
    /// configured) and fails when run, after the policy decided.
    pub fn idle_gateway(&self) -> String {
        format!(
            "[gateway]\nsocket = {:?}\n",
            self.home
                .join("run/broker-gateway/gateway.sock")
                .display()
                .to_string()
        )
    }

    pub fn broker_sock(&self) -> PathBuf {
        self.home.join("run/loop-broker/broker.sock")
    }
    pub fn admin_sock(&self) -> PathBuf {
        self.home.join("run/owner-broker/admin.sock")
    }
    pub fn decide_sock(&self) -> PathBuf {
        bxcore::layout::DECIDE.path(&self.home)
    }
    pub fn state_sock(&self) -> PathBuf {
        self.home.join("run/memory-broker/state.sock")
    }
    pub fn chain(&self) -> PathBuf {
        self.home.join("broker/audit/chain.jsonl")
    }
    pub fn state_file(&self, session: &str) -> PathBuf {
        self.home.join(format!("broker/sessions/{session}.json"))
    }
    pub fn log(&self, n: usize) -> PathBuf {
        self.home.join(format!("brokerd-{n}.log"))
    }

    /// Make a workspace directory under the home.
    pub fn dir(&self, name: &str) -> PathBuf {
        let p = self.home.join(name);
        fs::create_dir_all(&p).unwrap();
        p
    }
}

/// A running brokerd; killed and reaped when dropped, before its home goes.
pub struct Brokerd {
    pub daemon: bxtest::Daemon,
    pub log: PathBuf,
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub fn brokerd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_brokerd")
}

/// Run `brokerd args...` to its end: (status code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(brokerd_bin())
        .args(args)
        .env_remove("JOURNAL_STREAM")
        .env_remove("LISTEN_PID")
        .env_remove("NOTIFY_SOCKET")
        .output_bounded()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

impl Brokerd {
    /// Start `brokerd serve` on `home` (stderr to a log file in the home).
    pub fn spawn(home: &Home) -> Brokerd {
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let log = home.log(n);
        let daemon = bxtest::Daemon::spawn(Path::new(brokerd_bin()), "serve", &home.config, &log);
        Brokerd { daemon, log }
    }

    /// Start it and wait until all three sockets answer `ping`, the admin socket answers a
    /// request, and its start-up notices are in the log (they come after its sockets are
    /// served, so an answer alone does not say they are there).
    pub fn start(home: &Home) -> Brokerd {
        let mut b = Brokerd::spawn(home);
        b.wait_serving(home);
        b
    }

    pub fn wait_serving(&mut self, home: &Home) {
        for s in [home.state_sock(), home.broker_sock(), home.admin_sock()] {
            self.daemon
                .wait_ready(&format!("listening on {}", s.display()), || {
                    ping(&s).is_some()
                })
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let r = request(&home.admin_sock(), 1, Message::ApprovalsList {});
        assert!(
            matches!(r.last().map(|e| &e.msg), Some(Message::Approvals(_))),
            "{r:?}"
        );
        // The last of the notices (brokerd::daemon::describe), printed once every socket is
        // served.
        self.wait_log("brokerd: serving the channel's decisions on ");
        // Every test that starts brokerd runs it under its seccomp list with `KillProcess` as
        // the default action (even with `require = false`): a system call missing from the list
        // kills the daemon and fails the test.
        let log = self.stderr();
        assert!(
            (log.contains("seccomp brokerd (") || log.contains("seccomp brokerd+run ("))
                && log.contains("otherwise kill)"),
            "{log}"
        );
    }

    /// What it logged, each line without the time it starts with.
    pub fn stderr(&self) -> String {
        self.daemon.log_text()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    /// Wait until the process exits on its own: its status code.
    pub fn wait_exit(&mut self) -> i32 {
        self.daemon.wait_exit().code().unwrap_or(-1)
    }

    /// Wait until the log holds `text`.
    pub fn wait_log(&self, text: &str) -> String {
        self.daemon.wait_log(text)
    }

    /// kill -9 and reap.
    pub fn kill(&mut self) {
        self.daemon.kill();
    }
}

/// `ping`: the pong, or `None` when the socket does not answer.
/// A `workspace_write` of `content` to `notes/<file>` from the untrusted session `session`, so
/// that it waits for the owner: the open connection and the first frame brokerd sent
/// (`pending_approval`, or a final answer).
pub fn untrusted_write(
    h: &Home,
    session: &str,
    id: u64,
    file: &str,
    content: &str,
) -> (UnixStream, Envelope) {
    fs::write(
        h.state_file(session),
        r#"{"taint":"private","untrusted":true}"#,
    )
    .unwrap();
    let mut s = UnixStream::connect(h.broker_sock()).unwrap();
    let path = h.home.join("notes").join(file).display().to_string();
    write_frame(
        &mut s,
        &Envelope::new(
            id,
            true,
            Message::ToolRequest(ToolRequest {
                session: SessionId::new(session).unwrap(),
                call: CallId(id),
                tool: "workspace_write".into(),
                args: serde_json::json!({"path": path, "content": content}),
            }),
        ),
    )
    .unwrap();
    let first = read_frame(&mut Deadline::within(&s, WAIT).unwrap()).unwrap();
    (s, first)
}

/// The summaries of the approvals waiting, as admin.sock lists them.
pub fn pending_approvals(h: &Home) -> Vec<ApprovalSummary> {
    match &request(&h.admin_sock(), 1, Message::ApprovalsList {})[0].msg {
        Message::Approvals(a) => a.pending.clone(),
        o => panic!("{o:?}"),
    }
}

pub fn ping(socket: &Path) -> Option<Message> {
    let mut s = UnixStream::connect(socket).ok()?;
    write_frame(&mut s, &Envelope::new(0, true, Message::Ping {})).ok()?;
    let mut d = Deadline::within(&s, WAIT)?;
    read_frame(&mut d).ok().map(|e| e.msg)
}

/// Send one request and read every frame up to the final one (or the close). A server that
/// answers before reading (a refused peer) may close before the request is written: what it
/// sent is still there to read.
pub fn request(socket: &Path, id: u64, msg: Message) -> Vec<Envelope> {
    let mut s = UnixStream::connect(socket).unwrap();
    let _ = write_frame(&mut s, &Envelope::new(id, true, msg));
    read_all(&s)
}

/// Read frames until a final one, the close, or the deadline (which fails the test).
pub fn read_all(s: &UnixStream) -> Vec<Envelope> {
    let mut d = Deadline::within(s, WAIT).unwrap();
    let mut out = Vec::new();
    loop {
        match read_frame(&mut d) {
            Ok(e) => {
                let last = e.last;
                out.push(e);
                if last {
                    return out;
                }
            }
            Err(bxcore::FrameError::Closed) => return out,
            Err(e) if e.is_timeout() => panic!("no final frame within {WAIT:?}: {out:?}"),
            Err(_) => return out,
        }
    }
}

/// Send raw bytes and read what comes back.
pub fn raw(socket: &Path, bytes: &[u8]) -> Vec<Envelope> {
    let mut s = UnixStream::connect(socket).unwrap();
    s.write_all(bytes).unwrap();
    read_all(&s)
}

/// A length-prefixed frame around `body`.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// The chain's records as JSON values.
pub fn records(home: &Home) -> Vec<serde_json::Value> {
    fs::read_to_string(home.chain())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The events of the records about `call` in `session`.
pub fn events(home: &Home, session: &str, call: u64) -> Vec<String> {
    records(home)
        .into_iter()
        .filter(|r| r["session"] == session && r["call"] == call)
        .map(|r| r["event"].as_str().unwrap().to_string())
        .collect()
}

/// Wait until `f` holds, or fail after `WAIT` saying what was awaited.
#[track_caller]
pub fn wait_until(what: &str, f: impl FnMut() -> bool) {
    bxtest::wait_for(what, WAIT, f);
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub fn chown_tree(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
    if p.is_dir() {
        for e in fs::read_dir(p).unwrap() {
            chown_tree(&e.unwrap().path(), uid, gid);
        }
    }
}

/// One `tool_request` of `session` on broker.sock, and its final answer.
pub fn tool_call(
    h: &Home,
    session: &str,
    id: u64,
    tool: &str,
    args: serde_json::Value,
) -> bxcore::ToolResponse {
    let r = request(
        &h.broker_sock(),
        id,
        Message::ToolRequest(bxcore::ToolRequest {
            session: bxcore::SessionId::new(session).unwrap(),
            call: bxcore::CallId(id),
            tool: tool.into(),
            args,
        }),
    );
    match &r.last().unwrap().msg {
        Message::ToolResponse(t) => t.clone(),
        other => panic!("{other:?}"),
    }
}
