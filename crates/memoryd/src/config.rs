//! `memoryd.toml`: where memoryd keeps its outbox and store, the sockets it serves and asks,
//! its bounds, and `[[routes]]`. Unknown keys are refused everywhere, and the routes are checked
//! whole when the file loads: a table that leaves a session's state without a route, or that
//! would send a secret turn off the device or an untrusted one into main memory, is a refusal to
//! start, never a surprise when a turn is filed.

use std::path::PathBuf;
use std::time::Duration;

use bxcore::layout;
use bxharden::{Peers, SandboxConfig, ServeConfig};
use serde::Deserialize;

use crate::routes::Routes;

/// The runbook anchor of a configuration that does not load.
pub const CONFIG_ANCHOR: &str = "memoryd-config-invalid";

/// The largest `max_recall_tokens`: a recall answer fits in a frame with room to spare.
pub const MAX_RECALL_TOKENS: u32 = 32_768;
/// The most records the outbox holds before `turn_record` is answered `unavailable`.
pub const MAX_OUTBOX: usize = 100_000;
/// The bounds of `max_turn_bytes`: a turn's text, at least 1 KiB, at most 1 MiB.
pub const TURN_BYTES: std::ops::RangeInclusive<usize> = 1024..=1 << 20;
/// The bounds of `max_store_bytes`: at least 1 MiB, at most 1 TiB.
pub const STORE_BYTES: std::ops::RangeInclusive<u64> = 1 << 20..=1 << 40;
/// The bounds of `max_session_bytes`: at least 64 KiB, at most `max_store_bytes`.
pub const MIN_SESSION_BYTES: u64 = 64 * 1024;
/// The longest `keep_days`: a hundred years.
pub const MAX_KEEP_DAYS: u64 = 36_500;
/// The longest wait accepted for any one timeout: an hour.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub paths: Paths,
    #[serde(default)]
    pub sockets: Sockets,
    #[serde(default)]
    pub limits: Limits,
    /// `[[routes]]`, first match wins; absent: the defaults ([`Routes::defaults`]).
    #[serde(default)]
    pub routes: Option<Routes>,
    /// `[honcho]`: file main memory and quarantine into a Honcho server; absent: the embedded
    /// store holds every route.
    #[serde(default)]
    pub honcho: Option<Honcho>,
    #[serde(default)]
    pub peers: Peers,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    #[serde(default)]
    pub serve: ServeConfig,
}

/// `[paths]`: the box's home, as every daemon has it.
pub use bxharden::config::Paths;

/// `[sockets]`: an empty or absent path means the default under home (`bxcore::layout`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sockets {
    /// Served: loopd's turns and recall questions.
    pub memory: PathBuf,
    /// Served: the owner's view (`bxctl memory`, `bxctl status`).
    pub memories: PathBuf,
    /// Asked: brokerd's `state.sock`.
    pub state: PathBuf,
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// How long one question to brokerd's state.sock may take.
    pub state_timeout_ms: u64,
    /// The first wait after a failed filing; it doubles up to `max_backoff_ms`.
    pub backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// The largest recall answer a `memory_recall` may ask for (tokens, bytes / 4).
    pub max_recall_tokens: u32,
    /// The most records waiting in the outbox; past it `turn_record` is `unavailable`.
    pub max_outbox: usize,
    /// The most of a turn's text memoryd takes (`intake`): longer turns are cut, with a note.
    pub max_turn_bytes: usize,
    /// The largest the embedded store's file may grow (its free pages not counted); a turn
    /// past it waits in the outbox (`memory-store-full`).
    pub max_store_bytes: u64,
    /// The most text one session's turns hold in the embedded store (absent: a quarter of
    /// `max_store_bytes`); a turn past it is let go and what the session holds is kept
    /// (`memory-session-full`), so one session cannot fill the store alone. See
    /// [`Limits::session_bytes`].
    pub max_session_bytes: Option<u64>,
    /// Turns filed more than this many days ago are pruned from the embedded store; 0 keeps
    /// every turn until the owner forgets it.
    pub keep_days: u64,
}

impl Limits {
    /// `max_session_bytes`, or a quarter of `max_store_bytes` when it is not set.
    pub fn session_bytes(&self) -> u64 {
        self.max_session_bytes.unwrap_or(self.max_store_bytes / 4)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            state_timeout_ms: 5_000,
            backoff_ms: 200,
            max_backoff_ms: 30_000,
            max_recall_tokens: 4_096,
            max_outbox: 10_000,
            max_turn_bytes: 64 * 1024,
            max_store_bytes: 1 << 30,
            max_session_bytes: None,
            keep_days: 0,
        }
    }
}

/// `[honcho]`: the remote store (`docs/honcho.md`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Honcho {
    /// The server's base, `http://host:port`; memoryd adds `/v3`.
    pub url: String,
    /// The workspace of the owner's main memory.
    #[serde(default = "default_workspace")]
    pub workspace: String,
    /// The workspace of quarantine; absent: `<workspace>-quarantine`. Never main memory's.
    #[serde(default)]
    pub quarantine_workspace: Option<String>,
    /// The bearer token's file (mode 0600); absent: the systemd credential `honcho_key` if
    /// systemd passed it, else no token (Honcho's auth off).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// One request's deadline, connect to last byte.
    #[serde(default = "default_honcho_timeout")]
    pub timeout_ms: u64,
}

fn default_workspace() -> String {
    "boxmaker".to_string()
}

fn default_honcho_timeout() -> u64 {
    10_000
}

impl Honcho {
    /// The base URL, checked.
    pub fn base(&self) -> Result<honcho::BaseUrl, honcho::Error> {
        honcho::BaseUrl::parse(&self.url)
    }

    /// Main memory's workspace and quarantine's.
    pub fn workspaces(&self) -> Result<(honcho::Id, honcho::Id), String> {
        let main = honcho::Id::new(self.workspace.clone())
            .map_err(|e| format!("[honcho] workspace = {:?}: {e}", self.workspace))?;
        let q = self
            .quarantine_workspace
            .clone()
            .unwrap_or_else(|| format!("{}-quarantine", self.workspace));
        let quarantine = honcho::Id::new(q.clone())
            .map_err(|e| format!("[honcho] quarantine_workspace = {q:?}: {e}"))?;
        if quarantine == main {
            return Err(format!(
                "[honcho] quarantine_workspace = {q:?} is main memory's workspace: quarantined \
                 turns would be recalled as the owner's own; name another"
            ));
        }
        Ok((main, quarantine))
    }

    fn check(&self) -> Result<(), String> {
        self.base().map_err(|e| format!("[honcho] url: {e}"))?;
        self.workspaces()?;
        if self.timeout_ms == 0 || self.timeout_ms > MAX_TIMEOUT_MS {
            return Err(format!(
                "[honcho] timeout_ms = {} is not between 1 and {MAX_TIMEOUT_MS} (an hour)",
                self.timeout_ms
            ));
        }
        if let Some(k) = &self.key_file {
            if !k.is_absolute() {
                return Err(format!("[honcho] key_file = {k:?} is not an absolute path"));
            }
        }
        Ok(())
    }
}

impl bxharden::daemon::DaemonConfig for Config {
    const SOCKETS: &'static [layout::SocketSpec] = &[layout::MEMORY, layout::MEMORIES];

    /// The home absolute, every bound in range, the routes whole and safe; then the default
    /// socket paths.
    fn check(&mut self) -> Result<(), String> {
        self.paths.check()?;
        let l = &self.limits;
        for (key, v) in [
            ("state_timeout_ms", l.state_timeout_ms),
            ("backoff_ms", l.backoff_ms),
            ("max_backoff_ms", l.max_backoff_ms),
        ] {
            if v == 0 || v > MAX_TIMEOUT_MS {
                return Err(format!(
                    "[limits] {key} = {v} is not between 1 and {MAX_TIMEOUT_MS} (an hour)"
                ));
            }
        }
        if l.backoff_ms > l.max_backoff_ms {
            return Err(format!(
                "[limits] backoff_ms = {} is more than max_backoff_ms = {}",
                l.backoff_ms, l.max_backoff_ms
            ));
        }
        if l.max_recall_tokens == 0 || l.max_recall_tokens > MAX_RECALL_TOKENS {
            return Err(format!(
                "[limits] max_recall_tokens = {} is not between 1 and {MAX_RECALL_TOKENS}",
                l.max_recall_tokens
            ));
        }
        if l.max_outbox == 0 || l.max_outbox > MAX_OUTBOX {
            return Err(format!(
                "[limits] max_outbox = {} is not between 1 and {MAX_OUTBOX}",
                l.max_outbox
            ));
        }
        if !TURN_BYTES.contains(&l.max_turn_bytes) {
            return Err(format!(
                "[limits] max_turn_bytes = {} is not between {} and {}",
                l.max_turn_bytes,
                TURN_BYTES.start(),
                TURN_BYTES.end()
            ));
        }
        if !STORE_BYTES.contains(&l.max_store_bytes) {
            return Err(format!(
                "[limits] max_store_bytes = {} is not between {} and {}",
                l.max_store_bytes,
                STORE_BYTES.start(),
                STORE_BYTES.end()
            ));
        }
        if (l.max_turn_bytes as u64).saturating_mul(16) > l.max_store_bytes {
            return Err(format!(
                "[limits] max_turn_bytes = {} is more than a sixteenth of max_store_bytes = {}: \
                 a store near its bound would hold back turns it could never take",
                l.max_turn_bytes, l.max_store_bytes
            ));
        }
        // At least two of the largest turns, and never below 64 KiB.
        let session = l.session_bytes();
        let least = MIN_SESSION_BYTES.max((l.max_turn_bytes as u64).saturating_mul(2));
        if session < least || session > l.max_store_bytes {
            return Err(format!(
                "[limits] max_session_bytes = {session} is not between {least} (64 KiB, or twice \
                 max_turn_bytes = {}) and max_store_bytes = {}",
                l.max_turn_bytes, l.max_store_bytes
            ));
        }
        if l.keep_days > MAX_KEEP_DAYS {
            return Err(format!(
                "[limits] keep_days = {} is more than {MAX_KEEP_DAYS} (0 keeps every turn)",
                l.keep_days
            ));
        }
        if let Some(routes) = &self.routes {
            routes.check()?;
        }
        if let Some(h) = &self.honcho {
            h.check()?;
        }
        let home = self.paths.home.clone();
        for (path, spec) in [
            (&mut self.sockets.memory, layout::MEMORY),
            (&mut self.sockets.memories, layout::MEMORIES),
            (&mut self.sockets.state, layout::STATE),
        ] {
            if path.as_os_str().is_empty() {
                *path = spec.path(&home);
            } else if !path.is_absolute() {
                return Err(format!(
                    "[sockets] {} = {path:?} is not an absolute path",
                    spec.name
                ));
            }
        }
        Ok(())
    }

    bxharden::common_tables!();
}

impl Config {
    /// `<home>/memory`: memoryd's own directory, 0700.
    pub fn own_dir(&self) -> PathBuf {
        layout::daemon("memoryd")
            .map(|d| d.state_path(&self.paths.home))
            .unwrap_or_else(|| self.paths.home.join("memory"))
    }

    /// `<home>/memory/outbox`: turns acknowledged and not yet filed.
    pub fn outbox_dir(&self) -> PathBuf {
        self.own_dir().join("outbox")
    }

    /// `<home>/memory/local`: the embedded store.
    pub fn local_dir(&self) -> PathBuf {
        self.own_dir().join("local")
    }

    /// The routes in force: the file's, else the defaults.
    pub fn routes(&self) -> Routes {
        self.routes.clone().unwrap_or_else(Routes::defaults)
    }

    pub fn state_timeout(&self) -> Duration {
        Duration::from_millis(self.limits.state_timeout_ms)
    }

    pub fn backoff(&self) -> (Duration, Duration) {
        (
            Duration::from_millis(self.limits.backoff_ms),
            Duration::from_millis(self.limits.max_backoff_ms),
        )
    }
}
