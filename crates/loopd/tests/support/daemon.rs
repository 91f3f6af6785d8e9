//! The real loopd binary on a temporary home, under a guard that kills and reaps it before the
//! home goes.

use bxtest::OutputBounded;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A running loopd.
pub struct Loopd {
    pub daemon: bxtest::Daemon,
    pub socket: PathBuf,
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
        d.daemon
            .wait_ready("loop.sock answering ping", || {
                bxcore::client::ping(&socket, Duration::from_secs(5)).is_ok()
            })
            .unwrap_or_else(|e| panic!("{e}"));
        d
    }

    /// Start a loopd command without waiting for anything.
    pub fn spawn(home: &Path, config_text: &str, command: &str) -> Loopd {
        let config = home.join("loopd.toml");
        fs::write(&config, config_text).unwrap();
        let log = home.join(format!("loopd-{}.log", std::process::id()));
        let bin = Path::new(env!("CARGO_BIN_EXE_loopd"));
        Loopd {
            daemon: bxtest::Daemon::spawn(bin, command, &config, &log),
            socket: home.join("run/channel-loop/loop.sock"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        self.daemon.log_text()
    }

    /// `kill -9` and reap.
    pub fn kill(&mut self) {
        self.daemon.kill();
    }

    /// Whether it is still running (reaping it if not).
    pub fn running(&mut self) -> bool {
        self.daemon.running()
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
