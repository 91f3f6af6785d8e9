//! A dev box's home: the daemons' state directories as on the device, plus `etc/` (the configs
//! `dev up` wrote), `logs/`, `dev/` (pid files and the marker that says `dev up` made this
//! home) and `workspace/` (the roots brokerd's workspace tools may touch).

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Which model provider the dev box's inferproxy talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// Scripted replies from a file: no network, no key.
    Script,
    /// An OpenAI-compatible endpoint.
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Provider::Script => "script",
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
        })
    }
}

/// What `dev up` wrote into `dev/box.toml`: the proof that it made this home, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Marker {
    pub made_by: String,
    pub provider: Provider,
    /// As root: the box's id, which its users' names carry (`bx-dev-<box_id>-loop`, ...);
    /// `None` when the daemons keep the uid of whoever ran `dev up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub box_id: Option<String>,
    /// The one user every daemon ran as in a home made by an earlier `dev up`; such a home is
    /// refused (`dev up` saying so), not mixed with users per daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// memoryd's Honcho store; `None`: the embedded store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honcho: Option<super::honcho::HonchoChoice>,
}

/// `made_by` in every marker.
pub const MADE_BY: &str = "bxctl dev up";

/// The paths of one dev box.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevHome {
    root: PathBuf,
}

impl DevHome {
    /// The dev box at `root`, which must be absolute (the daemons' configs name it).
    pub fn new(root: &Path) -> io::Result<DevHome> {
        let root = if root.is_absolute() {
            root.to_path_buf()
        } else {
            std::env::current_dir()?.join(root)
        };
        Ok(DevHome { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn config(&self, daemon: &str) -> PathBuf {
        self.root.join("etc").join(format!("{daemon}.toml"))
    }

    pub fn script(&self) -> PathBuf {
        self.root.join("etc/script.toml")
    }

    pub fn log(&self, daemon: &str) -> PathBuf {
        self.root.join("logs").join(format!("{daemon}.log"))
    }

    pub fn pid_file(&self, daemon: &str) -> PathBuf {
        self.root.join("dev").join(format!("{daemon}.pid"))
    }

    /// `dev/<daemon>.sink.pid`: the process that appends the daemon's output to its log.
    pub fn sink_pid_file(&self, daemon: &str) -> PathBuf {
        self.root.join("dev").join(format!("{daemon}.sink.pid"))
    }

    pub fn marker(&self) -> PathBuf {
        self.root.join("dev/box.toml")
    }

    /// The datagram socket `daemon` tells its readiness on while `dev up` waits
    /// (`NOTIFY_SOCKET`).
    pub fn notify_socket(&self, daemon: &str) -> PathBuf {
        self.root.join("dev").join(format!("{daemon}.notify"))
    }

    pub fn workspace(&self, root: &str) -> PathBuf {
        self.root.join("workspace").join(root)
    }

    /// Whether `dev up` made this home (it has its marker).
    pub fn is_made(&self) -> bool {
        self.marker().is_file()
    }

    /// The marker, when `dev up` made this home; `Ok(None)` when there is none.
    pub fn read_marker(&self) -> Result<Option<Marker>, String> {
        match fs::read_to_string(self.marker()) {
            Ok(text) => toml::from_str(&text)
                .map(Some)
                .map_err(|e| format!("{}: {e}", self.marker().display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", self.marker().display())),
        }
    }

    /// Whether the home is missing or an empty directory (a fresh home).
    pub fn is_fresh(&self) -> bool {
        match fs::read_dir(&self.root) {
            Ok(mut entries) => entries.next().is_none(),
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        }
    }
}
