//! `loopd.toml`: every key loopd reads, with its default, checked when it loads.
//!
//! Unknown keys are refused everywhere (a misspelt key must not silently mean its default), and
//! every bound that matters later is checked here, so a running loopd never meets a value it
//! cannot use: a broker timeout over 24 hours, a zero timeout, a relative home.

use std::path::PathBuf;
use std::time::Duration;

use bxharden::{Peers, SandboxConfig};
use serde::Deserialize;

use bxcore::layout;

/// The longest `[broker] timeout_ms` and `[inference] timeout_ms`: 24 hours. Longer would let
/// one call hold a turn for days, and the design bounds it so the broker port's first deadline
/// always fits the clock.
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub paths: Paths,
    #[serde(default, rename = "loop")]
    pub turns: Loop,
    #[serde(default)]
    pub slots: Slots,
    #[serde(default)]
    pub broker: Broker,
    #[serde(default)]
    pub inference: Inference,
    #[serde(default)]
    pub memory: Memory,
    #[serde(default)]
    pub sockets: Sockets,
    /// The channel daemon's turns on bridge.sock (`docs/channels.md`).
    #[serde(default)]
    pub bridge: Bridge,
    /// The session workers: how many may run, and how long one idles before it ends.
    #[serde(default)]
    pub workers: Workers,
    /// Who may connect to loop.sock (`"loop.sock" = [...]`); default: loopd's own uid.
    #[serde(default)]
    pub peers: Peers,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    #[serde(default)]
    pub serve: bxharden::ServeConfig,
}

/// `[paths]`: the box's home, as every daemon has it.
pub use bxharden::config::Paths;

/// `[loop]`: how long a turn may run and how large a session may grow.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Loop {
    /// The most inferences one turn makes; a turn whose last one still asks for tools ends with
    /// `turn_limit`.
    pub max_tool_rounds: u32,
    /// The session's budget in tokens (estimated as bytes / 4): set it to the slot's window.
    pub context_tokens: u64,
}

impl Default for Loop {
    fn default() -> Loop {
        Loop {
            max_tool_rounds: 8,
            context_tokens: 100_000,
        }
    }
}

/// `[slots]`: the inferproxy slot names loopd asks for; loopd names a slot, never a model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Slots {
    /// The slot a new session is created with.
    pub main: String,
}

impl Default for Slots {
    fn default() -> Slots {
        Slots {
            main: "main".to_string(),
        }
    }
}

/// `[broker]`: where tool calls go. No default path: absent means no broker (`NoBroker`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Broker {
    pub socket: Option<PathBuf>,
    pub timeout_ms: u64,
}

impl Default for Broker {
    fn default() -> Broker {
        Broker {
            socket: None,
            timeout_ms: 120_000,
        }
    }
}

/// `[inference]`: inferproxy's socket and the deadline for one whole model call.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Inference {
    /// Empty or absent: `<run>/loop-infer/infer.sock` (`bxcore::layout::run_dir`).
    pub socket: PathBuf,
    pub timeout_ms: u64,
}

impl Default for Inference {
    fn default() -> Inference {
        Inference {
            socket: PathBuf::new(),
            timeout_ms: 300_000,
        }
    }
}

/// `[memory]`: memoryd's socket. No default: absent means turns are not handed to memory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Memory {
    pub socket: Option<PathBuf>,
    /// The deadline for one `turn_record` exchange.
    pub timeout_ms: u64,
    /// How much the owner's memory may add at the start of a turn (tokens, bytes / 4); 0: no
    /// recall.
    pub recall_tokens: u32,
    /// The deadline for one `memory_recall`: past it the turn goes on without recall.
    pub recall_ms: u64,
    /// The most finished turns waiting in the outbox for memoryd; past it a turn is not
    /// remembered (logged, `loopd-outbox-full`) and the turn itself still succeeds.
    pub max_outbox: usize,
}

/// The largest `[memory] max_outbox`.
pub const MAX_OUTBOX: usize = 1_000_000;

impl Default for Memory {
    fn default() -> Memory {
        Memory {
            socket: None,
            timeout_ms: 30_000,
            recall_tokens: 1_024,
            recall_ms: 2_000,
            max_outbox: 10_000,
        }
    }
}

/// `[sockets]`: the sockets loopd serves.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sockets {
    /// Empty or absent: `<run>/channel-loop/loop.sock` (`bxcore::layout::run_dir`).
    pub channel: PathBuf,
    /// Empty or absent: `<run>/bridge-loop/bridge.sock`, the channel daemon's.
    pub bridge: PathBuf,
}

/// `[bridge]`: what a turn on bridge.sock may name. Its peers are `[peers] "bridge.sock"` (on the
/// device the channel daemon's user, `bx-channel`); every session it names must begin with
/// `session_prefix`, so the channel reaches only sessions of its own and never the owner's
/// others. The rule brokerd's decide.sock applies to approvals is the same (`docs/channels.md`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bridge {
    pub session_prefix: String,
}

impl Default for Bridge {
    fn default() -> Bridge {
        Bridge {
            session_prefix: bxcore::layout::CHANNEL_SESSION_PREFIX.to_string(),
        }
    }
}

/// `[workers]`: one process per live session (`crate::monitor`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workers {
    /// The most session workers running at once. A new session's turn past it ends the worker
    /// idle longest; with none idle, the turn is refused (`loopd-workers-full`).
    pub max: usize,
    /// How long a worker with no turn to serve and nothing in its outbox runs before it ends.
    pub idle_seconds: u64,
}

/// The largest `[workers] max`.
pub const MAX_WORKERS: usize = 256;
/// The longest `[workers] idle_seconds`: a day.
pub const MAX_IDLE_SECONDS: u64 = 24 * 60 * 60;

impl Default for Workers {
    fn default() -> Workers {
        Workers {
            max: 16,
            idle_seconds: 300,
        }
    }
}

pub use bxharden::daemon::ConfigError;

impl bxharden::daemon::DaemonConfig for Config {
    const SOCKETS: &'static [layout::SocketSpec] = &[layout::LOOP, layout::BRIDGE];

    /// Every key in range, then the default socket paths under the home's run directory.
    fn check(&mut self) -> Result<(), String> {
        self.validate()?;
        if self.sockets.channel.as_os_str().is_empty() {
            self.sockets.channel = layout::LOOP.path(&self.paths.home);
        }
        if self.sockets.bridge.as_os_str().is_empty() {
            self.sockets.bridge = layout::BRIDGE.path(&self.paths.home);
        }
        if self.inference.socket.as_os_str().is_empty() {
            self.inference.socket = layout::INFER.path(&self.paths.home);
        }
        Ok(())
    }

    bxharden::common_tables!();
}

impl Config {
    fn validate(&self) -> Result<(), String> {
        let prefix = &self.bridge.session_prefix;
        if prefix.is_empty() || bxcore::SessionId::new(prefix).is_err() || prefix.len() > 32 {
            return Err(format!(
                "[bridge] session_prefix {prefix:?} must be 1 to 32 of A-Z a-z 0-9 _ -"
            ));
        }
        self.paths.check()?;
        if self.turns.max_tool_rounds == 0 {
            return Err("[loop] max_tool_rounds must be at least 1".to_string());
        }
        if self.turns.context_tokens == 0 {
            return Err("[loop] context_tokens must be at least 1".to_string());
        }
        if self.slots.main.is_empty() {
            return Err("[slots] main must name a slot".to_string());
        }
        for (key, ms) in [
            ("[broker] timeout_ms", self.broker.timeout_ms),
            ("[inference] timeout_ms", self.inference.timeout_ms),
            ("[memory] timeout_ms", self.memory.timeout_ms),
            ("[memory] recall_ms", self.memory.recall_ms),
        ] {
            if ms == 0 {
                return Err(format!("{key} must be at least 1"));
            }
            if ms > MAX_TIMEOUT_MS {
                return Err(format!(
                    "{key} = {ms} is over 24 hours ({MAX_TIMEOUT_MS} ms)"
                ));
            }
        }
        if self.workers.max == 0 || self.workers.max > MAX_WORKERS {
            return Err(format!(
                "[workers] max = {} is not between 1 and {MAX_WORKERS}",
                self.workers.max
            ));
        }
        if self.workers.idle_seconds == 0 || self.workers.idle_seconds > MAX_IDLE_SECONDS {
            return Err(format!(
                "[workers] idle_seconds = {} is not between 1 and {MAX_IDLE_SECONDS}",
                self.workers.idle_seconds
            ));
        }
        let max = self.memory.max_outbox;
        if max == 0 || max > MAX_OUTBOX {
            return Err(format!(
                "[memory] max_outbox = {max} is not between 1 and {MAX_OUTBOX}"
            ));
        }
        for (key, socket) in [
            ("[broker] socket", &self.broker.socket),
            ("[memory] socket", &self.memory.socket),
        ] {
            if socket.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(format!(
                    "{key} is empty: leave the key out to run without it"
                ));
            }
        }
        Ok(())
    }

    /// `<home>/loop`: loopd's own directory.
    pub fn loop_dir(&self) -> PathBuf {
        self.paths.home.join("loop")
    }

    /// `<home>/loop/sessions`.
    pub fn sessions_dir(&self) -> PathBuf {
        self.loop_dir().join("sessions")
    }

    /// `<home>/loop/workers`.
    pub fn workers_dir(&self) -> PathBuf {
        self.loop_dir().join("workers")
    }

    /// `<home>/loop/workers/<session>`: the one directory a session's worker may write, holding
    /// its memory outbox.
    pub fn worker_dir(&self, session: &bxcore::SessionId) -> PathBuf {
        self.workers_dir().join(session.as_str())
    }

    /// `<home>/loop/outbox`: the turns finished before loopd ran a worker per session, sent by
    /// the monitor until it is empty.
    pub fn outbox_dir(&self) -> PathBuf {
        self.loop_dir().join("outbox")
    }

    pub fn broker_timeout(&self) -> Duration {
        Duration::from_millis(self.broker.timeout_ms)
    }

    pub fn inference_timeout(&self) -> Duration {
        Duration::from_millis(self.inference.timeout_ms)
    }

    pub fn memory_timeout(&self) -> Duration {
        Duration::from_millis(self.memory.timeout_ms)
    }

    pub fn recall_timeout(&self) -> Duration {
        Duration::from_millis(self.memory.recall_ms)
    }
}
