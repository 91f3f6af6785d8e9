//! A Honcho server of the test's own, to kill: the code, virtual environment, settings and
//! Postgres of the shared server at `$HONCHO_URL` (the state directory `honcho-up.sh` made,
//! `$HONCHO_STATE`, by default `~/.cache/honcho-peer` as there), on a port of its own, so a test
//! can SIGKILL it and start it again without touching the shared servers.
//!
//! The server binds its port itself, once it is ready, as `honcho-up.sh` starts it: while it is
//! down or starting nothing listens there, so a request sent meanwhile is refused, never queued
//! for a later server to find (a request queued that long would be one its client gave up on).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A Honcho server process of the test's own, killed when dropped.
pub struct OwnHoncho {
    port: u16,
    state: PathBuf,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

/// `honcho-up.sh`'s state directory: `$HONCHO_STATE`, else its default.
fn state_dir() -> PathBuf {
    if let Some(s) = std::env::var_os("HONCHO_STATE").filter(|s| !s.is_empty()) {
        return PathBuf::from(s);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    cache.join("honcho-peer")
}

impl OwnHoncho {
    /// Start one beside the shared server, its log in `dir`, and wait until it answers
    /// `/health`; `None` after a skip saying why when there is no server to start.
    pub fn start(dir: &Path) -> Option<OwnHoncho> {
        let state = state_dir();
        let needs = [
            state.join("venv/bin/python"),
            state.join("src/src/main.py"),
            state.join("honcho.env"),
        ];
        if let Some(missing) = needs.iter().find(|p| !p.is_file()) {
            bxtest::skip(&format!(
                "no Honcho server of the test's own can be started: {} is missing (HONCHO_STATE \
                 names the state directory honcho-up.sh made; .ci/run brings it up; see \
                 docs/testing.md)",
                missing.display()
            ));
            return None;
        }
        let env = fs::read_to_string(state.join("honcho.env"))
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        // A port no one listens on now; the server binds it when it is ready.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut h = OwnHoncho {
            port,
            state,
            env,
            log: dir.join("own-honcho.log"),
            child: None,
        };
        h.run();
        Some(h)
    }

    /// The server's base.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("the server runs").id() as i32)
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Start the server on its port and wait until it answers `/health`.
    pub fn run(&mut self) {
        assert!(self.child.is_none(), "the server runs already");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = Command::new(self.state.join("venv/bin/python"))
            .args(["-m", "uvicorn", "src.main:app", "--no-server-header"])
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .current_dir(self.state.join("src"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let client = honcho::Client::new(
            honcho::BaseUrl::parse(&self.url()).unwrap(),
            None,
            honcho::Options::default(),
        );
        let until = Instant::now() + bxtest::DEADLINE;
        while client.health().is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the test's own Honcho on port {} exited with {status}: {}",
                    self.port,
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < until,
                "the test's own Honcho did not answer /health on {} within {:?}: {}",
                self.url(),
                bxtest::DEADLINE,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
    }

    /// Freeze the server where it is (SIGSTOP): what it was doing stays in flight, and what is
    /// sent to it now waits unanswered.
    pub fn freeze(&self) {
        kill(self.pid(), Signal::SIGSTOP).unwrap();
    }

    /// SIGKILL, and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            bxtest::reap(&mut child);
        }
    }
}

impl Drop for OwnHoncho {
    fn drop(&mut self) {
        self.kill();
    }
}
