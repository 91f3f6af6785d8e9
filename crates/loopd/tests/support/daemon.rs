//! The real loopd binary on a temporary home, under a guard that kills and reaps it before the
//! home goes.

use bxtest::OutputBounded;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use super::wait_until;

/// A running loopd.
pub struct Loopd {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub config: PathBuf,
}

/// Paths every real-process test uses under `home`.
pub struct Layout {
    pub channel: PathBuf,
    pub infer: PathBuf,
    pub broker: PathBuf,
    pub memory: PathBuf,
}

impl Layout {
    pub fn new(home: &Path) -> Layout {
        for d in [
            "run/channel-loop",
            "run/loop-infer",
            "run/loop-broker",
            "run/loop-memory",
        ] {
            fs::create_dir_all(home.join(d)).unwrap();
        }
        Layout {
            channel: home.join("run/channel-loop/loop.sock"),
            infer: home.join("run/loop-infer/infer.sock"),
            broker: home.join("run/loop-broker/broker.sock"),
            memory: home.join("run/loop-memory/memory.sock"),
        }
    }
}

/// A config for a test loopd: the sandbox not required (tests run as root or as one user), the
/// inference socket at its default, plus `extra` TOML.
pub fn config(home: &Path, extra: &str) -> String {
    format!(
        "[paths]\nhome = {:?}\n\n{extra}\n[sandbox]\nrequire = false\n",
        home.display().to_string()
    )
}

impl Loopd {
    /// Start `loopd serve` with `config_text` and wait until loop.sock answers `ping`.
    pub fn start(home: &Path, config_text: &str) -> Loopd {
        let mut d = Loopd::spawn(home, config_text, "serve");
        let socket = d.socket.clone();
        wait_until("loopd to answer ping", || {
            if let Some(status) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "loopd exited with {status}: {}",
                    fs::read_to_string(&d.log).unwrap_or_default()
                );
            }
            bxcore::client::ping(&socket, Duration::from_secs(5)).is_ok()
        });
        d
    }

    /// Start a loopd command without waiting for anything.
    pub fn spawn(home: &Path, config_text: &str, command: &str) -> Loopd {
        let config = home.join("loopd.toml");
        fs::write(&config, config_text).unwrap();
        let log = home.join(format!("loopd-{}.log", std::process::id()));
        let bin = Path::new(env!("CARGO_BIN_EXE_loopd"));
        let child = bxtest::daemon_command(bin, command, &config, &log)
            .spawn()
            .unwrap();
        Loopd {
            child: Some(child),
            socket: home.join("run/channel-loop/loop.sock"),
            log,
            config,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        bxharden::log::without_times(&fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// `kill -9` and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            bxtest::reap(&mut c);
        }
    }

    /// Whether it is still running (reaping it if not).
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }
}

impl Drop for Loopd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Run a one-shot loopd command (`check`, `selftest`) and return (exit code, stdout).
pub fn run(home: &Path, config_text: &str, command: &str) -> (i32, String) {
    let config = home.join("loopd.toml");
    fs::write(&config, config_text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_loopd"))
        .arg(command)
        .arg("--config")
        .arg(&config)
        .env_remove("JOURNAL_STREAM")
        .output_bounded()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}
