//! `brokerd.toml`: where brokerd keeps its files and sockets, who may connect, the workspace
//! roots, how the owner tightens tools, and the sandbox. Unknown keys are refused everywhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bxcore::layout;
use bxharden::{Peers, SandboxConfig, ServeConfig};
use serde::Deserialize;
use toolkit::{Registry, Root, Roots, Tightening};

/// The default time the owner has to decide an approval: 10 minutes.
pub const DEFAULT_TTL_MS: u64 = 600_000;
/// The longest approval time accepted: a day.
pub const MAX_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// `[paths]`: the box's home, as every daemon has it.
pub use bxharden::config::Paths;

/// The sockets `brokerd` serves. An empty path means "the default under `home`".
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Sockets {
    /// Tool calls from loopd.
    pub broker: PathBuf,
    /// The owner's approvals and audit questions.
    pub admin: PathBuf,
    /// `memoryd`'s session-state questions.
    pub state: PathBuf,
    /// The channel daemon's decisions on its own sessions' approvals.
    pub decide: PathBuf,
}

/// `[decide]`: which approvals decide.sock may decide. Until sessions are minted by brokerd
/// itself, a channel's sessions are known by their name: every session loopd runs for the
/// channel begins with `session_prefix` (loopd's `[bridge]` has the same), and decide.sock
/// refuses the approval of any other (`docs/channels.md` says what this rule does not cover).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecideConfig {
    pub session_prefix: String,
}

impl Default for DecideConfig {
    fn default() -> DecideConfig {
        DecideConfig {
            session_prefix: layout::CHANNEL_SESSION_PREFIX.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalsConfig {
    /// How long a pending approval waits for the owner, in milliseconds.
    pub ttl_ms: u64,
    /// The largest arguments (canonical JSON, bytes) put to the owner; a larger call is denied.
    pub max_args_bytes: usize,
    /// The most approvals one session may have pending at once.
    pub max_pending_per_session: usize,
    /// The most approvals pending at once in all.
    pub max_pending: usize,
    /// How long a lease (the owner's "allow for this session") lives, in milliseconds.
    pub lease_ttl_ms: u64,
    /// The most leases one session may hold at once.
    pub max_leases_per_session: usize,
    /// The most leases held at once in all.
    pub max_leases: usize,
}

/// The largest `max_args_bytes`: one whole approval (`approval_show`) fits in a frame.
pub const MAX_ARGS_BYTES: usize = bxcore::MAX_FRAME / 2;

/// The largest `max_pending`: the list of summaries fits in a frame.
pub const MAX_PENDING: usize = 256;

/// The largest `max_leases`: the list of leases fits in a frame.
pub const MAX_LEASES: usize = 1024;

impl Default for ApprovalsConfig {
    fn default() -> Self {
        let limits = crate::approvals::Limits::default();
        let leases = crate::leases::Limits::default();
        ApprovalsConfig {
            ttl_ms: DEFAULT_TTL_MS,
            max_args_bytes: limits.max_args_bytes,
            max_pending_per_session: limits.max_per_session,
            max_pending: limits.max_pending,
            lease_ttl_ms: leases.ttl_ms,
            max_leases_per_session: leases.per_session,
            max_leases: leases.total,
        }
    }
}

impl ApprovalsConfig {
    /// The bounds of the leases table.
    pub fn lease_limits(&self) -> crate::leases::Limits {
        crate::leases::Limits {
            ttl_ms: self.lease_ttl_ms,
            per_session: self.max_leases_per_session,
            total: self.max_leases,
        }
    }

    /// The bounds of the approvals table.
    pub fn limits(&self) -> crate::approvals::Limits {
        crate::approvals::Limits {
            max_args_bytes: self.max_args_bytes,
            max_per_session: self.max_pending_per_session,
            max_pending: self.max_pending,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkspaceConfig {
    pub roots: Vec<Root>,
    /// The most objects the mark store holds (`crate::marks`): what untrusted sessions wrote.
    pub max_marks: usize,
}

impl Default for WorkspaceConfig {
    fn default() -> WorkspaceConfig {
        WorkspaceConfig {
            roots: Vec::new(),
            max_marks: crate::marks::DEFAULT_MAX,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// `gateway.sock`; absent: no gateway, and `web_fetch` is not offered.
    pub socket: Option<PathBuf>,
}

/// `[run]`: the run tool. Absent: the tool is not offered, and brokerd's seccomp list has no
/// `execve`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// The owner's allow-list: absolute paths, or names looked up on `path`. Absent: any
    /// program the sandbox lets it reach.
    pub programs: Option<Vec<String>>,
    /// The fixed `PATH` a bare `argv[0]` is looked up on (absolute directories, in order).
    pub path: Vec<PathBuf>,
    /// What programs may read and run besides the roots. Absent: the defaults that exist here
    /// (`toolkit::run::DEFAULT_SYSTEM_PATHS`).
    pub system_paths: Option<Vec<PathBuf>>,
    /// `RLIMIT_AS`, in MiB.
    pub memory_mb: u64,
    /// `RLIMIT_FSIZE`, in MiB.
    pub file_size_mb: u64,
    /// `RLIMIT_NPROC`.
    pub processes: u64,
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
    /// The most of each of stdout and stderr returned, in bytes.
    pub max_output_bytes: usize,
    /// Give each program a user and network namespace of its own where the system allows it.
    pub network_namespace: bool,
}

/// The largest `max_output_bytes`: both streams, escaped as JSON at worst, fit in a frame.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            programs: None,
            path: toolkit::run::DEFAULT_PATH
                .iter()
                .map(PathBuf::from)
                .collect(),
            system_paths: None,
            memory_mb: 1024,
            file_size_mb: 64,
            processes: 64,
            open_files: 256,
            max_output_bytes: MAX_OUTPUT_BYTES,
            network_namespace: true,
        }
    }
}

impl RunConfig {
    /// The system paths programs may read: as configured (each must exist), or the defaults
    /// that exist here.
    pub fn system_paths(&self) -> Vec<PathBuf> {
        match &self.system_paths {
            Some(paths) => paths.clone(),
            None => toolkit::run::DEFAULT_SYSTEM_PATHS
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .collect(),
        }
    }

    fn check(&self) -> Result<(), String> {
        for p in &self.path {
            if !p.is_absolute() {
                return Err(format!("[run] path: {p:?} is not an absolute directory"));
            }
        }
        if let Some(programs) = &self.programs {
            for name in programs {
                let absolute = name.starts_with('/');
                if name.is_empty() || (!absolute && name.contains('/')) {
                    return Err(format!(
                        "[run] programs: {name:?} is neither an absolute path nor a program name"
                    ));
                }
            }
        }
        if let Some(paths) = &self.system_paths {
            for p in paths {
                if !p.is_absolute() || !p.exists() {
                    return Err(format!(
                        "[run] system_paths: {p:?} is not an absolute path that exists"
                    ));
                }
            }
        }
        let bounds: [(&str, u64, u64, u64); 5] = [
            ("memory_mb", self.memory_mb, 16, 1 << 20),
            ("file_size_mb", self.file_size_mb, 1, 1 << 20),
            ("processes", self.processes, 1, 4096),
            ("open_files", self.open_files, 16, 1 << 20),
            (
                "max_output_bytes",
                self.max_output_bytes as u64,
                1024,
                MAX_OUTPUT_BYTES as u64,
            ),
        ];
        for (name, v, lo, hi) in bounds {
            if !(lo..=hi).contains(&v) {
                return Err(format!("[run] {name} = {v} is not between {lo} and {hi}"));
            }
        }
        Ok(())
    }
}

/// `[tool_servers.<name>]`: one MCP server, started for each call of the tools declared on it
/// (`docs/tools.md`), confined as a `run` program is.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolServerConfig {
    /// Its argv: an absolute program path first (no shell), then its arguments.
    pub command: Vec<String>,
    /// What it may read and run besides the system paths (its program's files: a virtualenv,
    /// a package's directory), read-only. Nothing else on disk, no network.
    #[serde(default)]
    pub read_paths: Vec<PathBuf>,
    /// How long one call may take, the server's start included, in milliseconds.
    #[serde(default = "server_timeout_ms")]
    pub timeout_ms: u64,
    /// `RLIMIT_AS`, in MiB.
    #[serde(default = "server_memory_mb")]
    pub memory_mb: u64,
    /// `RLIMIT_NPROC`.
    #[serde(default = "server_processes")]
    pub processes: u64,
    /// The most the server may write to its standard output in one call, in bytes.
    #[serde(default = "server_max_output")]
    pub max_output_bytes: usize,
    /// Give it a user and network namespace of its own where the system allows it.
    #[serde(default = "yes")]
    pub network_namespace: bool,
    /// `"session"`: a directory of its own for each session, the one place its calls may write
    /// (`{state}` in `command` and `env`); `"none"`: it writes nowhere.
    #[serde(default)]
    pub state: ServerState,
    /// The most a session's place may hold when a call starts, in MiB (any one file too).
    #[serde(default = "server_state_max_mb")]
    pub state_max_mb: u64,
    /// Variables its environment holds besides `PATH`, `HOME` and `LANG`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `"call"`: started for each call and ended when it is answered; `"session"`: started at
    /// a session's first call and kept for its next (`docs/tools.md`).
    #[serde(default)]
    pub process: ServerProcess,
    /// A kept process is ended after this long without a call, in seconds (`process =
    /// "session"` only; default 300).
    pub idle_seconds: Option<u64>,
    /// A kept process is ended this long after it started, whatever it is doing, in seconds
    /// (`process = "session"` only; default 3600).
    pub lifetime_seconds: Option<u64>,
    /// The most kept processes of this server at once, each a session's (`process =
    /// "session"` only; default 4).
    pub max_processes: Option<u64>,
}

/// How long a tool server's process lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerProcess {
    #[default]
    Call,
    Session,
}

/// A kept server's defaults: idle, lifetime (seconds), how many at once.
const KEPT_IDLE_SECONDS: u64 = 300;
const KEPT_LIFETIME_SECONDS: u64 = 3600;
const KEPT_PROCESSES: u64 = 4;
/// The most a kept process may live: a day.
pub const MAX_KEPT_SECONDS: u64 = 86_400;
/// The most kept processes of one server.
pub const MAX_KEPT_PROCESSES: u64 = 64;

/// Whether a tool server has a place of its own to write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerState {
    #[default]
    None,
    Session,
}

fn server_state_max_mb() -> u64 {
    16
}

/// The most variables a tool server's `env` names.
pub const MAX_SERVER_ENV: usize = 32;

fn server_timeout_ms() -> u64 {
    30_000
}
fn server_memory_mb() -> u64 {
    1024
}
fn server_processes() -> u64 {
    64
}
fn server_max_output() -> usize {
    256 * 1024
}
fn yes() -> bool {
    true
}

/// The longest call of a declared tool: five minutes.
pub const MAX_SERVER_TIMEOUT_MS: u64 = 300_000;
/// The most a server may say in one call.
pub const MAX_SERVER_OUTPUT: usize = 1 << 20;

impl ToolServerConfig {
    fn check(&self, name: &str) -> Result<(), String> {
        let at = format!("[tool_servers.{name}]");
        // It names a directory of its state (`<home>/broker/tool-state/<name>`).
        if !toolkit::declared::is_name(name) {
            return Err(format!(
                "{at}: a server's name is 1 to 64 of a-z, 0-9, '_' and '-'"
            ));
        }
        self.env_check(&at)?;
        let program = self.command.first().map(PathBuf::from);
        match &program {
            Some(p) if p.is_absolute() => {}
            _ => {
                return Err(format!(
                    "{at} command: its first word is the server's program, an absolute path \
                     (no shell)"
                ));
            }
        }
        for p in &self.read_paths {
            if !p.is_absolute() || !p.exists() {
                return Err(format!(
                    "{at} read_paths: {p:?} is not an absolute path that exists"
                ));
            }
        }
        let bounds: [(&str, u64, u64, u64); 5] = [
            ("timeout_ms", self.timeout_ms, 100, MAX_SERVER_TIMEOUT_MS),
            ("memory_mb", self.memory_mb, 16, 1 << 20),
            ("processes", self.processes, 1, 4096),
            ("state_max_mb", self.state_max_mb, 1, 1024),
            (
                "max_output_bytes",
                self.max_output_bytes as u64,
                1024,
                MAX_SERVER_OUTPUT as u64,
            ),
        ];
        for (key, v, lo, hi) in bounds {
            if !(lo..=hi).contains(&v) {
                return Err(format!("{at} {key} = {v} is not between {lo} and {hi}"));
            }
        }
        self.keeping_check(&at)
    }

    /// How its processes are kept, for `process = "session"`.
    pub fn keeping(&self) -> Option<toolkit::Keeping> {
        (self.process == ServerProcess::Session).then(|| toolkit::Keeping {
            idle: std::time::Duration::from_secs(self.idle_seconds.unwrap_or(KEPT_IDLE_SECONDS)),
            lifetime: std::time::Duration::from_secs(
                self.lifetime_seconds.unwrap_or(KEPT_LIFETIME_SECONDS),
            ),
            most: self.max_processes.unwrap_or(KEPT_PROCESSES) as usize,
        })
    }

    /// The keys of a kept process only with `process = "session"`, each in its bounds, and a
    /// lifetime longer than a call.
    fn keeping_check(&self, at: &str) -> Result<(), String> {
        let keys = [
            ("idle_seconds", self.idle_seconds, 1, MAX_KEPT_SECONDS),
            (
                "lifetime_seconds",
                self.lifetime_seconds,
                1,
                MAX_KEPT_SECONDS,
            ),
            ("max_processes", self.max_processes, 1, MAX_KEPT_PROCESSES),
        ];
        for (key, v, lo, hi) in keys {
            match v {
                Some(_) if self.process == ServerProcess::Call => {
                    return Err(format!(
                        "{at} {key}: only a server with process = \"session\" keeps processes \
                         (this one starts one for each call)"
                    ));
                }
                Some(v) if !(lo..=hi).contains(&v) => {
                    return Err(format!("{at} {key} = {v} is not between {lo} and {hi}"));
                }
                _ => {}
            }
        }
        if let Some(k) = self.keeping() {
            // Each call needs its deadline (and a second's margin) within the lifetime.
            let call = std::time::Duration::from_millis(self.timeout_ms);
            if k.lifetime < call * 2 + std::time::Duration::from_secs(1) {
                return Err(format!(
                    "{at} lifetime_seconds = {} leaves no room for calls of timeout_ms = {}: \
                     make it at least twice the timeout and a second",
                    k.lifetime.as_secs(),
                    self.timeout_ms
                ));
            }
        }
        Ok(())
    }

    /// `env` names at most [`MAX_SERVER_ENV`] variables, each `[A-Z_][A-Z0-9_]*` and none of
    /// what the box sets or the loader obeys; `{state}` only where the server has a place.
    fn env_check(&self, at: &str) -> Result<(), String> {
        if self.env.len() > MAX_SERVER_ENV {
            return Err(format!(
                "{at} env names more than {MAX_SERVER_ENV} variables"
            ));
        }
        for (k, v) in &self.env {
            let name_ok = k
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_uppercase() || b == b'_')
                && k.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            if !name_ok || k.len() > 64 {
                return Err(format!(
                    "{at} env: {k:?} is not a variable's name (1 to 64 of A-Z, 0-9 and '_', not \
                     starting with a digit)"
                ));
            }
            if ["PATH", "HOME", "LANG"].contains(&k.as_str()) || k.starts_with("LD_") {
                return Err(format!(
                    "{at} env: {k} is the box's to set (PATH, HOME, LANG) or the loader's \
                     (LD_*)"
                ));
            }
            if v.len() > 4096 || v.contains('\0') {
                return Err(format!(
                    "{at} env: {k}'s value is at most 4096 bytes, with no NUL"
                ));
            }
        }
        let names_state = self
            .command
            .iter()
            .chain(self.env.values())
            .any(|w| w.contains(toolkit::declared::STATE_WORD));
        if names_state && self.state != ServerState::Session {
            return Err(format!(
                "{at}: command or env names {{state}}, the session's place, but the server has \
                 none (state = \"session\" gives it one)"
            ));
        }
        Ok(())
    }
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub paths: Paths,
    #[serde(default)]
    pub sockets: Sockets,
    #[serde(default)]
    pub peers: Peers,
    #[serde(default)]
    pub approvals: ApprovalsConfig,
    #[serde(default)]
    pub decide: DecideConfig,
    #[serde(default)]
    pub workspace: WorkspaceConfig,
    #[serde(default)]
    pub tools: BTreeMap<String, Tightening>,
    #[serde(default)]
    pub gateway: GatewayConfig,
    /// `[run]`: the run tool, when present.
    #[serde(default)]
    pub run: Option<RunConfig>,
    /// `[tool_servers.<name>]`: the MCP servers of the declared tools.
    #[serde(default)]
    pub tool_servers: BTreeMap<String, ToolServerConfig>,
    /// `[[declared_tools]]`: the tools the owner added (`docs/tools.md`).
    #[serde(default)]
    pub declared_tools: Vec<toolkit::Declaration>,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    #[serde(default)]
    pub serve: ServeConfig,
}

pub use bxharden::daemon::ConfigError;

impl bxharden::daemon::DaemonConfig for Config {
    /// state.sock first: whoever waits for the tool and admin sockets then finds it bound too.
    const SOCKETS: &'static [layout::SocketSpec] =
        &[layout::STATE, layout::BROKER, layout::ADMIN, layout::DECIDE];

    /// The home absolute, approvals' time within a day, the gateway socket absolute, the roots
    /// usable, the tightening consistent.
    fn check(&mut self) -> Result<(), String> {
        self.paths.check()?;
        if self.approvals.ttl_ms == 0 || self.approvals.ttl_ms > MAX_TTL_MS {
            return Err(format!(
                "[approvals] ttl_ms = {} is not between 1 and {MAX_TTL_MS} (a day)",
                self.approvals.ttl_ms
            ));
        }
        let a = &self.approvals;
        if a.max_args_bytes == 0 || a.max_args_bytes > MAX_ARGS_BYTES {
            return Err(format!(
                "[approvals] max_args_bytes = {} is not between 1 and {MAX_ARGS_BYTES}",
                a.max_args_bytes
            ));
        }
        if a.max_pending == 0 || a.max_pending > MAX_PENDING {
            return Err(format!(
                "[approvals] max_pending = {} is not between 1 and {MAX_PENDING}",
                a.max_pending
            ));
        }
        if a.max_pending_per_session == 0 || a.max_pending_per_session > a.max_pending {
            return Err(format!(
                "[approvals] max_pending_per_session = {} is not between 1 and max_pending ({})",
                a.max_pending_per_session, a.max_pending
            ));
        }
        if a.lease_ttl_ms == 0 || a.lease_ttl_ms > MAX_TTL_MS {
            return Err(format!(
                "[approvals] lease_ttl_ms = {} is not between 1 and {MAX_TTL_MS} (a day)",
                a.lease_ttl_ms
            ));
        }
        if a.max_leases > MAX_LEASES || a.max_leases_per_session > a.max_leases {
            return Err(format!(
                "[approvals] max_leases = {} must be at most {MAX_LEASES}, and \
                 max_leases_per_session = {} at most max_leases (0 turns leases off)",
                a.max_leases, a.max_leases_per_session
            ));
        }
        let m = self.workspace.max_marks;
        if m == 0 || m > crate::marks::MAX_MAX {
            return Err(format!(
                "[workspace] max_marks = {m} is not between 1 and {}",
                crate::marks::MAX_MAX
            ));
        }
        if let Some(gw) = &self.gateway.socket {
            if !gw.is_absolute() {
                return Err(format!("[gateway] socket = {gw:?} is not an absolute path"));
            }
        }
        if let Some(run) = &self.run {
            run.check()?;
        }
        self.roots().map_err(|e| e.to_string())?;
        self.roots_clear_of_the_box()?;
        self.declared_tools_check()?;
        self.registry().map_err(|e| e.to_string())?;
        let prefix = &self.decide.session_prefix;
        if prefix.is_empty() || prefix.len() > 32 || bxcore::SessionId::new(prefix).is_err() {
            return Err(format!(
                "[decide] session_prefix {prefix:?} must be 1 to 32 of A-Z a-z 0-9 _ -"
            ));
        }
        Ok(())
    }

    bxharden::common_tables!();
}

/// The home's directories besides the daemons' own: the configurations (`etc`, a dev box's),
/// the logs and the dev box's pid files.
const BOX_DIRS: [&str; 3] = ["etc", "logs", "dev"];

/// The system's directories, never a workspace root nor inside one: configuration (the box's
/// own under `/etc/boxmaker` on the device), kernel interfaces, programs, the store, the boot
/// loader.
const SYSTEM: [&str; 12] = [
    "/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/nix", "/usr", "/bin", "/sbin", "/lib",
    "/lib64",
];

/// How path `a` stands to path `b` when one holds the other: `"holds"` (or is) or `"lies in"`.
fn overlap(a: &Path, b: &Path) -> Option<&'static str> {
    if b.starts_with(a) {
        Some("holds")
    } else if a.starts_with(b) {
        Some("lies in")
    } else {
        None
    }
}

/// The system trees a tool server's `read_paths` may not hold (a path inside one, such as
/// `/etc/ssl`, is the owner's choice).
const SERVER_NEVER: [&str; 9] = [
    "/proc", "/sys", "/dev", "/etc", "/run", "/root", "/home", "/boot", "/var/lib",
];

impl Config {
    /// No workspace root holds the box itself: not `/`, not the home or a directory above it,
    /// not a daemon's own directory, the socket directories or the home's `etc`, `logs` and `dev`,
    /// nor anything inside them, nor a system directory. A tool
    /// that could read or write there would make brokerd's chain and fingerprints, a daemon's
    /// keys or its sockets workspace files. A root that exists is judged by where it leads
    /// (its links followed), as the kernel will open it.
    fn roots_clear_of_the_box(&self) -> Result<(), String> {
        let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let home = real(&self.paths.home);
        let mut own: Vec<PathBuf> = layout::DAEMONS
            .iter()
            .map(|d| d.state_path(&home))
            .collect();
        own.push(real(&layout::run_dir(&self.paths.home)));
        let sockets = [
            self.broker_socket(),
            self.admin_socket(),
            self.state_socket(),
            self.decide_socket(),
        ];
        own.extend(sockets.iter().filter_map(|s| s.parent()).map(real));
        for r in &self.workspace.roots {
            let root = real(&r.path);
            let why = if home.starts_with(&root) {
                Some(format!("holds the box's home {}", home.display()))
            } else if let Some(d) = own.iter().find(|d| root.starts_with(d)) {
                Some(format!("lies in {}, the box's own state", d.display()))
            } else if let Some(d) = BOX_DIRS
                .iter()
                .map(|d| home.join(d))
                .find(|d| root.starts_with(d))
            {
                Some(format!("lies in {}, the box's own", d.display()))
            } else {
                SYSTEM
                    .iter()
                    .map(Path::new)
                    .find(|d| root.starts_with(d))
                    .map(|d| format!("lies in {}, the system's own", d.display()))
            };
            if let Some(why) = why {
                return Err(format!(
                    "[[workspace.roots]] {}: {why}: the audit chain, the fingerprints and the \
                     daemons' keys and sockets would be workspace files; name a directory of \
                     the owner's files",
                    r.path.display()
                ));
            }
        }
        Ok(())
    }

    /// The workspace roots, checked.
    pub fn roots(&self) -> Result<Roots, toolkit::RootsError> {
        Roots::new(self.workspace.roots.clone())
    }

    /// The tools, tightened; `run` only with a `[run]` section; then the declared tools.
    pub fn registry(&self) -> Result<Registry, toolkit::TighteningError> {
        let mut tools = self.tools.clone();
        if self.run.is_none() {
            tools.entry("run".to_string()).or_default().enabled = Some(false);
        }
        Registry::with_declared(&tools, &self.declared_tools)
    }

    /// Each declared tool says one thing, names a server that is configured, and has a name of
    /// its own; each server can be started, reads nothing of the box's own, and its tools'
    /// labels cover the workspace roots it may read.
    fn declared_tools_check(&self) -> Result<(), String> {
        // Without Landlock a server would read all brokerd's user may: its chain, its keys.
        if !self.tool_servers.is_empty() && !self.sandbox.require {
            return Err(
                "[tool_servers] need [sandbox] require = true: with require = false, on a kernel \
                 without Landlock, a server would start unconfined and read all brokerd's user \
                 may"
                .to_string(),
            );
        }
        for (name, server) in &self.tool_servers {
            server.check(name)?;
            self.server_reads_clear(name, server)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.declared_tools {
            d.check()?;
            if !self.tool_servers.contains_key(&d.server) {
                return Err(format!(
                    "[[declared_tools]] {:?}: there is no [tool_servers.{}]",
                    d.name, d.server
                ));
            }
            if !seen.insert(d.name.as_str()) {
                return Err(format!("[[declared_tools]] {:?} is declared twice", d.name));
            }
        }
        Ok(())
    }

    /// A server's `read_paths` hold nothing of the box (its home, or a directory above it) and
    /// lie in no daemon's state; one that holds or lies in a workspace root makes every tool on
    /// that server carry at least that root's class, and third-party text if the root holds it.
    fn server_reads_clear(&self, name: &str, server: &ToolServerConfig) -> Result<(), String> {
        let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let home = real(&self.paths.home);
        let run = real(&layout::run_dir(&self.paths.home));
        for p in server.read_paths.iter().map(|p| real(p)) {
            // Whole system trees that hold keys, other users' files or kernel interfaces, and
            // the places of the box's sockets: never a server's to read.
            let whole = SERVER_NEVER
                .iter()
                .map(Path::new)
                .find(|d| d.starts_with(&p));
            let inside = ["/proc", "/sys", "/run"]
                .iter()
                .map(PathBuf::from)
                .chain([run.clone()])
                .find(|d| p.starts_with(d));
            if let Some(d) = whole.map(Path::to_path_buf).or(inside) {
                return Err(format!(
                    "[tool_servers.{name}] read_paths: {} {} {}: name the directories its \
                     program needs (a virtualenv, a package's directory)",
                    p.display(),
                    overlap(&p, &d).unwrap_or("lies in"),
                    d.display()
                ));
            }
            if let Some(how) = overlap(&p, &home) {
                return Err(format!(
                    "[tool_servers.{name}] read_paths: {} {how} the box's home {}: its server \
                     would read the audit chain, the daemons' keys and sockets",
                    p.display(),
                    home.display()
                ));
            }
            for root in &self.workspace.roots {
                let r = real(&root.path);
                if overlap(&p, &r).is_none() {
                    continue;
                }
                // A writable root may hold files an untrusted session wrote (marked): what the
                // server reads there may be third-party text.
                let third_party = root.untrusted || root.writable;
                for d in self.declared_tools.iter().filter(|d| d.server == name) {
                    if d.reads < root.class || (third_party && !d.untrusted) {
                        return Err(format!(
                            "[[declared_tools]] {:?}: its server {name} reads the workspace root \
                             {} ({}{}), so its results carry that at least: declare reads = \
                             {:?}{}",
                            d.name,
                            r.display(),
                            root.class,
                            if root.untrusted {
                                ", untrusted"
                            } else if root.writable {
                                ", writable: it may hold what untrusted sessions wrote"
                            } else {
                                ""
                            },
                            root.class.to_string(),
                            if third_party {
                                " and untrusted = true"
                            } else {
                                ""
                            }
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The system paths a program of the box may read and run: `[run]`'s, or the defaults
    /// that exist here.
    pub fn system_paths(&self) -> Vec<PathBuf> {
        self.run_settings().system_paths()
    }

    /// `[run]`, or its defaults where it is absent: what a declared tool's server is started
    /// with too (its `PATH`, the system paths).
    pub fn run_settings(&self) -> std::borrow::Cow<'_, RunConfig> {
        match &self.run {
            Some(run) => std::borrow::Cow::Borrowed(run),
            None => std::borrow::Cow::Owned(RunConfig::default()),
        }
    }

    /// Whether brokerd starts programs at all (the run tool, a declared tool's server): its
    /// seccomp list then has `execve`.
    pub fn starts_programs(&self) -> bool {
        self.run.is_some() || !self.tool_servers.is_empty()
    }

    fn or_default(&self, set: &Path, spec: layout::SocketSpec) -> PathBuf {
        if set.as_os_str().is_empty() {
            spec.path(&self.paths.home)
        } else {
            set.to_path_buf()
        }
    }

    /// `broker.sock`, where loopd sends tool calls.
    pub fn broker_socket(&self) -> PathBuf {
        self.or_default(&self.sockets.broker, layout::BROKER)
    }

    /// `admin.sock`, where the owner lists and decides approvals.
    pub fn admin_socket(&self) -> PathBuf {
        self.or_default(&self.sockets.admin, layout::ADMIN)
    }

    /// `state.sock`, where `memoryd` asks for a session's state.
    pub fn state_socket(&self) -> PathBuf {
        self.or_default(&self.sockets.state, layout::STATE)
    }

    /// `decide.sock`, where the channel daemon decides its own sessions' approvals.
    pub fn decide_socket(&self) -> PathBuf {
        self.or_default(&self.sockets.decide, layout::DECIDE)
    }

    /// `<home>/broker`: brokerd's own directory.
    pub fn broker_dir(&self) -> PathBuf {
        self.paths.home.join("broker")
    }

    /// `<home>/broker/tool-state/<server>`: the places of a tool server with `state =
    /// "session"`, one directory for each session.
    pub fn tool_state_dir(&self, server: &str) -> PathBuf {
        self.broker_dir().join("tool-state").join(server)
    }

    /// `<home>/broker/sessions`: the state files.
    pub fn state_dir(&self) -> PathBuf {
        self.broker_dir().join("sessions")
    }

    /// `<home>/broker/audit`.
    pub fn audit_dir(&self) -> PathBuf {
        self.broker_dir().join("audit")
    }

    /// `<home>/broker/audit/chain.jsonl`.
    pub fn chain_path(&self) -> PathBuf {
        self.audit_dir().join("chain.jsonl")
    }

    /// `<home>/broker/audit/lock`.
    pub fn lock_path(&self) -> PathBuf {
        self.audit_dir().join("lock")
    }
}
