//! The end-to-end tests' harness: the workspace's real binaries, and a dev box on a temporary
//! home that is always taken down (and its daemons killed) before the home is removed.
//!
//! The binaries are the ones `cargo test --workspace` builds beside the test executables
//! (`target/<profile>/`); `make gate` builds them all before any test runs.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Generous: a loaded 2-core machine builds and starts slowly; nothing here measures speed.
pub use bxtest::DEADLINE;

/// The directory holding the workspace's binaries.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test>-<hash> → target/<profile>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from target/<profile>/deps")
        .to_path_buf();
    for b in [
        "bxctl",
        "loopd",
        "brokerd",
        "inferproxy",
        "memoryd",
        "channeld",
    ] {
        assert!(
            dir.join(b).is_file(),
            "{} is missing: build the workspace's binaries first (`cargo build --workspace \
             --bins`; `make gate` and `cargo test --workspace` do)",
            dir.join(b).display()
        );
    }
    dir
}

/// `bxctl` with `args`, run to its end within `DEADLINE`; past it, it is killed and the test
/// fails saying so.
pub fn bxctl(args: &[&str]) -> Output {
    bxctl_with(args, &[])
}

/// [`bxctl`] with `envs` added to its environment.
pub fn bxctl_with(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin_dir().join("bxctl"));
    cmd.args(args).env_remove("BOXMAKER_HOME");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    bxtest::run(&mut cmd, &format!("bxctl {args:?}"), DEADLINE).unwrap_or_else(|e| panic!("{e}"))
}

pub use bxtest::said;

/// `bxctl` with `args`, run as a process of `uid` and `gid` (no supplementary groups), to its
/// end within `DEADLINE`.
pub fn bxctl_as(uid: u32, gid: u32, args: &[&str]) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin_dir().join("bxctl"));
    // std drops the supplementary groups when root sets the uid.
    cmd.args(args).env_remove("BOXMAKER_HOME").uid(uid).gid(gid);
    bxtest::run(&mut cmd, &format!("bxctl {args:?} as uid {uid}"), DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The daemons of a dev box, as `bxctl dev` starts them (and every one it may start: channeld
/// with `--matrix`).
pub use bxctl::dev::{ALL_DAEMONS, DAEMONS};

/// A dev box on its own temporary home.
#[derive(Debug)]
pub struct DevBox {
    dir: tempfile::TempDir,
    home: PathBuf,
}

impl DevBox {
    /// A temporary home, not up yet. As root its directory is opened (0711) so the dev user can
    /// walk to the home.
    pub fn new() -> DevBox {
        let dir = tempfile::Builder::new()
            .prefix("bx-e2e-")
            .tempdir()
            .expect("a temporary directory");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711)).unwrap();
        let home = dir.path().join("home");
        DevBox { dir, home }
    }

    /// A temporary home at `rel` under the temporary directory (whose parents may not exist).
    pub fn at(rel: &str) -> DevBox {
        let mut b = DevBox::new();
        b.home = b.dir.path().join(rel);
        b
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    pub fn home_arg(&self) -> String {
        self.home.display().to_string()
    }

    /// A file in the temporary directory, beside the home.
    pub fn beside(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `bxctl dev up` on this home with `extra` options; panics unless it succeeds.
    pub fn up(&self, extra: &[&str]) -> Output {
        let out = self.try_up(extra);
        assert!(out.status.success(), "dev up: {}", said(&out));
        out
    }

    pub fn try_up(&self, extra: &[&str]) -> Output {
        self.try_up_with(extra, &[])
    }

    /// `dev up` with `envs` added to bxctl's environment.
    pub fn try_up_with(&self, extra: &[&str], envs: &[(&str, &str)]) -> Output {
        let home = self.home_arg();
        let mut args = vec!["dev", "up", "--home", &home];
        args.extend_from_slice(extra);
        bxctl_with(&args, envs)
    }

    pub fn down(&self) -> Output {
        bxctl(&["dev", "down", "--home", &self.home_arg()])
    }

    /// The pid in a daemon's pid file.
    pub fn pid(&self, daemon: &str) -> Option<u32> {
        let home = bxctl::dev::DevHome::new(&self.home).ok()?;
        bxctl::dev::procs::read_pid(&home.pid_file(daemon))
    }

    /// The box id `dev up` drew as root (its users' names carry it); `None` when the daemons
    /// keep the caller's uid.
    pub fn box_id(&self) -> Option<String> {
        let home = bxctl::dev::DevHome::new(&self.home).ok()?;
        home.read_marker().ok()??.box_id
    }

    /// The user of `daemon` in this box, as `(name, uid, gid)`, when it exists.
    pub fn user(&self, daemon: &str) -> Option<(String, u32, u32)> {
        let name = bxctl::dev::user::name(&self.box_id()?, daemon)?;
        let u = nix::unistd::User::from_name(&name).ok()??;
        Some((name, u.uid.as_raw(), u.gid.as_raw()))
    }

    /// `f` on this thread as the client of `spec`'s socket (its daemon's user, when the box
    /// has users per daemon), else as the test itself.
    pub fn as_client<T>(&self, spec: &bxcore::layout::SocketSpec, f: impl FnOnce() -> T) -> T {
        let target = bxctl::dev::DevHome::new(&self.home).expect("the dev box's home");
        bxctl::target::as_client(&target, spec, f).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `bxctl` with `args` and `--home` this box started in the background, its standard input
    /// closed and its output read by threads (`bxtest::Bounded`): a chat whose turn waits.
    pub fn bxctl_in_background(&self, args: &[&str]) -> bxtest::Bounded {
        let mut cmd = Command::new(bin_dir().join("bxctl"));
        cmd.args(args)
            .arg("--home")
            .arg(&self.home)
            .env_remove("BOXMAKER_HOME")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        bxtest::Bounded::spawn(&mut cmd, &format!("bxctl {args:?}")).expect("bxctl starts")
    }

    /// The approvals waiting for the owner, each whole (`bxctl approvals --json`).
    pub fn pending(&self) -> Vec<serde_json::Value> {
        let out = self.bxctl(&["approvals", "--json"]);
        assert!(out.status.success(), "{}", said(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v["pending"].as_array().cloned().unwrap_or_default()
    }

    /// `bxctl` with `args` and `--home` this box.
    pub fn bxctl(&self, args: &[&str]) -> Output {
        let home = self.home_arg();
        let mut all = args.to_vec();
        all.extend_from_slice(&["--home", &home]);
        bxctl(&all)
    }
}

impl Default for DevBox {
    fn default() -> DevBox {
        DevBox::new()
    }
}

impl Drop for DevBox {
    fn drop(&mut self) {
        if bxctl::dev::DevHome::new(&self.home).is_ok_and(|h| h.is_made()) {
            let _ = self.down();
        }
        // Whatever `down` could not stop is killed before the home goes.
        for d in ALL_DAEMONS {
            if let Some(pid) = self.pid(d) {
                let pid = Pid::from_raw(pid as i32);
                if fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == d) {
                    let _ = kill(pid, Signal::SIGKILL);
                }
            }
        }
    }
}

/// A script for the scripted provider in which the model reads a mail third parties wrote (the
/// inbox, an untrusted root) and then writes `content` to `path`: the write waits for the
/// owner's approval. It answers "Fine." after.
pub fn mail_then_write(path: &str, content: &str) -> String {
    format!(
        r#"
[[step]]
after = "user"
text = "Let me read that email."
tool_calls = [{{ tool = "workspace_read", args = {{ path = "inbox/meeting.txt" }} }}]

[[step]]
after = "tool"
text = "I will note that down."
tool_calls = [{{ tool = "workspace_write", args = {{ path = {path:?}, content = {content:?} }} }}]

[[rule]]
text = "Fine."
"#
    )
}

impl DevBox {
    /// `dev up` with `script` as the scripted provider's script (written beside the home).
    pub fn up_with_script(&self, script: &str, extra: &[&str]) -> Output {
        let file = self.beside("script.toml");
        fs::write(&file, script).expect("the script is written");
        let file = file.display().to_string();
        let mut args = vec!["--script", file.as_str()];
        args.extend_from_slice(extra);
        self.up(&args)
    }
}

/// A socket held by [`hold_with_unfinished_frames`]: its connections and their writers.
/// Dropped, the connections are shut down and the writers end.
#[derive(Debug)]
pub struct Hold {
    streams: Vec<std::os::unix::net::UnixStream>,
    writers: Vec<std::thread::JoinHandle<()>>,
}

impl Hold {
    /// How many of the connections the server has not answered yet: those whose frames it
    /// holds, and those waiting for room in its budget (answered `unavailable` at their
    /// first-frame deadline).
    pub fn unanswered(&self) -> usize {
        use nix::sys::socket::{MsgFlags, recv};
        use std::os::fd::AsRawFd;
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        self.streams
            .iter()
            .filter(|s| {
                let mut byte = [0u8; 1];
                recv(s.as_raw_fd(), &mut byte, flags) == Err(nix::errno::Errno::EAGAIN)
            })
            .count()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        for s in &self.streams {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        // The shutdown above fails every writer's write at once; while a test unwinds they are
        // left to end on their own rather than risk a second panic here.
        for w in self.writers.drain(..) {
            if !std::thread::panicking() {
                bxtest::join(w, "a holding connection's writer");
            }
        }
    }
}

/// `spec`'s socket of `b` held as its one client could hold it at its worst: every place the
/// socket has, each connection sending a frame of the largest size (`MAX_FRAME`) but its last
/// byte, far more than the socket's frame budget in all, then nothing. Returns once the server
/// has taken one whole frame but the last byte (its budget is then being held): the frames it
/// took wait for their last byte, the others for room, until the first-frame deadline.
pub fn hold_with_unfinished_frames(b: &DevBox, spec: &bxcore::layout::SocketSpec) -> Hold {
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let path = spec.path(b.home());
    let mut frame = (bxcore::MAX_FRAME as u32).to_be_bytes().to_vec();
    frame.resize(4 + bxcore::MAX_FRAME - 1, b'{');
    let frame = std::sync::Arc::new(frame);
    let sent = std::sync::Arc::new(AtomicUsize::new(0));
    let mut hold = Hold {
        streams: Vec::new(),
        writers: Vec::new(),
    };
    for i in 0..spec.max_connections {
        let s = b
            .as_client(spec, || std::os::unix::net::UnixStream::connect(&path))
            .unwrap_or_else(|e| panic!("connection {i} to {}: {e}", path.display()));
        let mut writer = s.try_clone().unwrap();
        let (frame, sent) = (std::sync::Arc::clone(&frame), std::sync::Arc::clone(&sent));
        // A connection answered `unavailable` is closed under its writer: that ends it too.
        hold.writers.push(std::thread::spawn(move || {
            if writer.write_all(&frame).is_ok() {
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
        hold.streams.push(s);
    }
    bxtest::wait_for("the server to take a whole frame", DEADLINE, || {
        sent.load(Ordering::Relaxed) >= 1
    });
    // The reads that gave way to the others are answered at once: the hold is settled when
    // what is unanswered stops changing.
    let mut last = hold.unanswered();
    bxtest::wait_for("the hold to settle", DEADLINE, || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = hold.unanswered();
        std::mem::replace(&mut last, now) == now
    });
    hold
}

/// The owner's question on one of the owner's sockets, and whether its answer is the right kind:
/// `approvals_list` on admin.sock, `memory_recent` on memories.sock.
pub fn owners_question(
    spec: &bxcore::layout::SocketSpec,
) -> (bxcore::Message, fn(&bxcore::Message) -> bool) {
    use bxcore::Message;
    match spec.name {
        "admin" => (Message::ApprovalsList {}, |m| {
            matches!(m, Message::Approvals(_))
        }),
        "memories" => (
            Message::MemoryRecent(bxcore::MemoryRecent {
                route: None,
                limit: 5,
            }),
            |m| matches!(m, Message::Memories(_)),
        ),
        other => panic!("{other}.sock is not one of the owner's sockets"),
    }
}
