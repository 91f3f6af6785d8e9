//! Declared tools: the tools an owner adds, each run by an MCP server (`docs/tools.md`).
//!
//! The owner's declaration is the tool as far as the box is concerned: the name, description
//! and argument schema the model is offered, the label its results carry, its effect and its
//! approval rule. The policy decides a declared tool's call exactly as a built-in's, from the
//! declaration; nothing the server says about itself is believed. The server's own description
//! and schema are bound to the declaration by a digest ([`crate::mcp::tool_digest`]): a server
//! whose tool changed is not called until the owner declares it again.
//!
//! Each call starts its server afresh, confined like a `run` program (`crate::run::spawn`:
//! Landlock to the system's program directories and the paths its declaration names, read-only;
//! the run tool's seccomp list, no network; resource limits; a clean environment), and ends it
//! when the call is answered; or, for a server kept for its session ([`kept`]), talks to the
//! session's own process, confined the same. So no server holds one session's arguments when
//! another session calls it, a server that crashed or hung fails only its own call, and the
//! next call starts a new one.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bxcore::{DataClass, Label, SessionId};
use bxharden::ChildSandbox;
use serde::Deserialize;
use serde_json::Value;

use crate::mcp::{self, McpError};
use crate::run::spawn::{self, Ended, Input, Job, Limits};
use crate::{ApprovalRule, Declared, Effect, Env, FromPlace, Output, Plan, Reads, ToolError};

mod kept;
pub use kept::{Keeping, Kept};

/// The runbook anchor of a declared tool whose server could not answer its call.
pub const FAILED_ANCHOR: &str = "declared-tool-failed";
/// The runbook anchor of a declared tool whose server changed it since the owner declared it.
pub const CHANGED_ANCHOR: &str = "declared-tool-changed";
/// The runbook anchor of a call refused because its server runs as many processes as it may.
pub const BUSY_ANCHOR: &str = "declared-tool-busy";
/// The runbook anchor of a call refused because its session's place on the server is full.
pub const STATE_FULL_ANCHOR: &str = "declared-tool-state-full";

/// What a server's command and environment write for its session's place (`state = "session"`).
pub const STATE_WORD: &str = "{state}";

/// The most files and directories a session's place may hold; past it, it is full.
pub const MAX_STATE_ENTRIES: usize = 10_000;

/// The most bytes of a declared tool's arguments.
pub const MAX_ARGS: usize = 64 * 1024;

/// The most bytes of a declared tool's answer passed on (with its JSON escaping it fits in a
/// frame); past it the answer is cut, saying so.
pub const MAX_ANSWER: usize = 64 * 1024;

/// Whether `s` names a declared tool or a tool server: 1 to 64 of `a-z 0-9 _ -` (a server's
/// name is a directory's too, `<home>/broker/tool-state/<server>`).
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// What a declared tool does to the world, as its declaration says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeclaredEffect {
    None,
    Local,
    Egress,
}

/// `[[declared_tools]]` in brokerd.toml: one tool the owner added.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declaration {
    /// The name the model calls it by.
    pub name: String,
    /// The `[tool_servers.<name>]` that runs it.
    pub server: String,
    /// The tool's name on its server, when it is not `name`.
    pub tool: Option<String>,
    /// What the model is told it does: the owner's words, not the server's.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: Value,
    /// [`mcp::tool_digest`] of the tool as its server described it when the owner declared it.
    pub digest: String,
    /// The class of what its results carry.
    pub reads: DataClass,
    /// Whether its results may hold third-party text. Unless the owner says otherwise, they may.
    #[serde(default = "yes")]
    pub untrusted: bool,
    pub effect: DeclaredEffect,
    /// For `effect = "egress"`: the highest class the destination may receive.
    pub egress_max: Option<DataClass>,
    /// For `effect = "local"`: the class of the place it writes into, when it has one.
    pub writes_into: Option<DataClass>,
    /// When the owner must approve, beyond the policy's own rules.
    #[serde(default = "never")]
    pub approval: ApprovalRule,
}

fn yes() -> bool {
    true
}

fn never() -> ApprovalRule {
    ApprovalRule::Never
}

impl Declaration {
    /// The tool's name on its server.
    pub fn server_tool(&self) -> &str {
        self.tool.as_deref().unwrap_or(&self.name)
    }

    /// Whether the declaration says one thing: a name the model can call, an object schema, a
    /// digest that is one, an effect with the class it needs and no other.
    pub fn check(&self) -> Result<(), String> {
        let at = format!("[[declared_tools]] {:?}", self.name);
        if !is_name(&self.name) {
            return Err(format!(
                "{at}: a tool's name is 1 to 64 of a-z, 0-9, '_' and '-'"
            ));
        }
        if crate::TOOL_NAMES.contains(&self.name.as_str()) {
            return Err(format!("{at}: the box has a tool of that name already"));
        }
        if self.description.trim().is_empty() || self.description.len() > 4096 {
            return Err(format!(
                "{at}: description is 1 to 4096 bytes of the owner's words"
            ));
        }
        if self.parameters.get("type") != Some(&Value::from("object")) {
            return Err(format!(
                "{at}: parameters is a JSON Schema of type \"object\" (MCP's inputSchema)"
            ));
        }
        let hex = self.digest.len() == 64
            && self
                .digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            return Err(format!(
                "{at}: digest is the 64 lowercase hex digits `bxctl tools digest` prints for the \
                 server's tool"
            ));
        }
        match (self.effect, self.egress_max, self.writes_into) {
            (DeclaredEffect::Egress, None, _) => Err(format!(
                "{at}: effect = \"egress\" needs egress_max, the highest class the destination \
                 may receive"
            )),
            (DeclaredEffect::Egress, _, Some(_)) | (DeclaredEffect::None, _, Some(_)) => {
                Err(format!("{at}: writes_into is only for effect = \"local\""))
            }
            (DeclaredEffect::Local | DeclaredEffect::None, Some(_), _) => {
                Err(format!("{at}: egress_max is only for effect = \"egress\""))
            }
            _ => Ok(()),
        }
    }

    /// Its effect as `check` and `bxctl` show it: `none`, `local`, `egress up to public`.
    pub fn effect_shown(&self) -> String {
        match self.effect() {
            Effect::Egress { max } => format!("egress up to {max}"),
            e => e.as_str().to_string(),
        }
    }

    fn effect(&self) -> Effect {
        match self.effect {
            DeclaredEffect::None => Effect::None,
            DeclaredEffect::Local => Effect::Local,
            DeclaredEffect::Egress => Effect::Egress {
                max: self.egress_max.unwrap_or(DataClass::Public),
            },
        }
    }
}

/// A server's place of its own (`state = "session"`): one directory for each session, the only
/// place its calls may write, which no call of another session sees. What a session wrote there
/// comes back only to that session, whose label already covers it.
#[derive(Debug)]
pub struct StatePlace {
    /// `<brokerd's directory>/tool-state/<server>`: each session's directory is in it, named by
    /// the session.
    pub base: PathBuf,
    /// The most bytes a session's directory may hold when a call starts (and any one file).
    pub max_bytes: u64,
}

/// The name of the directory `brokerd tools ask` lists a server in, one for each listing
/// (`.listing-<pid>-<nanos>`): no session can have it (a session id has no `.`), and no
/// listing finds what another left.
fn listing_place() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(".listing-{}-{nanos}", std::process::id())
}

/// One MCP server the box starts for each call of its tools, prepared by brokerd before its own
/// sandbox.
#[derive(Debug)]
pub struct Server {
    /// Its program, an absolute path.
    pub program: PathBuf,
    /// Its arguments, `argv[0]` first; [`STATE_WORD`] stands for its session's place.
    pub argv: Vec<String>,
    /// The owner's variables besides `PATH`, `HOME` and `LANG`; [`STATE_WORD`] in a value stands
    /// for its session's place.
    pub env: Vec<(String, String)>,
    /// Its place of its own, one for each session; `None`: it may write nowhere.
    pub state: Option<StatePlace>,
    /// Kept for its session between calls (`process = "session"`); `None`: started for each
    /// call and ended when it is answered.
    pub keeping: Option<Keeping>,
    /// Its processes kept for their sessions (none unless `keeping`).
    pub kept: Arc<Kept>,
    /// The fixed `PATH` it starts with.
    pub path: Vec<PathBuf>,
    /// How long one call may take, the server's start included (a kept server's start is its
    /// first call's).
    pub timeout: Duration,
    pub limits: Limits,
    /// The most of its output read; past it the call fails.
    pub max_output: usize,
    /// Try a user and network namespace of its own.
    pub own_network: bool,
    /// Its sandbox: the system's paths and its own, read-only; no network.
    pub sandbox: ChildSandbox,
}

/// The servers, by their `[tool_servers.<name>]`.
pub type Servers = BTreeMap<String, Arc<Server>>;

/// A declared tool, as the registry holds it.
#[derive(Debug)]
pub(crate) struct DeclaredTool(pub(crate) Declaration);

impl crate::AnyTool for DeclaredTool {
    fn name(&self) -> &str {
        &self.0.name
    }
    fn description(&self) -> &str {
        &self.0.description
    }
    fn parameters(&self) -> Value {
        self.0.parameters.clone()
    }
    fn declared(&self) -> Declared {
        Declared {
            reads: Reads::Fixed(self.0.reads),
            untrusted_output: self.0.untrusted,
            effect: self.0.effect(),
            approval: self.0.approval,
        }
    }
    /// Its server is configured (the configuration refuses a declaration that names none).
    fn available(&self, _env: &Env) -> bool {
        true
    }
    fn validate(&self, args: &Value) -> Result<(), String> {
        validate(&self.0.name, &self.0.parameters, args)
    }
    fn plan(&self, args: &Value, _env: &Env, _seen: Label) -> Result<Plan, ToolError> {
        validate(&self.0.name, &self.0.parameters, args).map_err(ToolError::Refused)?;
        Ok(Plan {
            carries: Label::new(self.0.reads, self.0.untrusted),
            effect: self.0.effect(),
            writes_into: self.0.writes_into,
            marks_writes: false,
        })
    }
    fn run(
        &self,
        args: &Value,
        plan: &Plan,
        env: &Env,
        session: &SessionId,
    ) -> Result<Output, ToolError> {
        let d = &self.0;
        let server = env.servers.get(&d.server).ok_or_else(|| {
            ToolError::Failed(format!(
                "the server {:?} of {} is not running on this box",
                d.server, d.name
            ))
        })?;
        call(d, server, args, plan.carries, session)
    }
    fn place(&self, _args: &Value, _env: &Env) -> Option<String> {
        None
    }
    fn leak_view(&self, _args: &Value) -> Option<Value> {
        None
    }
}

/// Why a declared tool's call (or the owner's listing of a server) failed, as the owner's log
/// says it; `who` is `the server of <tool>` or `the server <name>`. The model is told the same
/// words, none of them the server's; but how a server that ran failed is its doing (which
/// request, which exit code, when), so such a failure raises the session by the declared label
/// as a result would ([`CallError::server_ran`]).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{who} could not be started: {why}")]
    Setup { who: String, why: String },
    #[error("{who} could not be started or its end was lost: {error}")]
    Spawn {
        who: String,
        error: spawn::SpawnError,
    },
    #[error("{who} ended before it answered ({how})")]
    Silent { who: String, how: String },
    #[error("{who}: {error}")]
    Mcp { who: String, error: McpError },
    #[error("{who} was not started: {why}")]
    StateFull { who: String, why: String },
    #[error("{who} was not called: {why}")]
    Busy { who: String, why: String },
}

impl bxcore::runbook::Anchored for CallError {
    fn anchor(&self) -> &str {
        match self {
            CallError::Mcp {
                error: McpError::Changed { .. } | McpError::Gone(_),
                ..
            } => CHANGED_ANCHOR,
            CallError::StateFull { .. } => STATE_FULL_ANCHOR,
            CallError::Busy { .. } => BUSY_ANCHOR,
            _ => FAILED_ANCHOR,
        }
    }
}

impl Server {
    /// Everything a start of the server takes but its input: `place` is the directory it may
    /// write (its session's), if it has one.
    fn launch(
        &self,
        who: &str,
        place: Option<&Path>,
    ) -> Result<(Launch, Option<ChildSandbox>), CallError> {
        let setup = |why: String| CallError::Setup {
            who: who.to_string(),
            why,
        };
        let cstring =
            |s: &str| CString::new(s).map_err(|_| setup("a NUL character in its command".into()));
        let placed = |s: &str| match place {
            Some(p) => s.replace(STATE_WORD, &p.display().to_string()),
            None => s.to_string(),
        };
        // Its session's place, read-write, beside what every call of it reads.
        let sandbox = match place {
            Some(p) => Some(
                self.sandbox
                    .with_paths(&[p.to_path_buf()], &[])
                    .map_err(|e| setup(format!("its sandbox: {e}")))?,
            ),
            None => None,
        };
        let mut env = spawn::environment(&self.path, "/var/empty")
            .map_err(|_| setup("a NUL character in its PATH".into()))?;
        for (k, v) in &self.env {
            env.push(cstring(&format!("{k}={}", placed(v)))?);
        }
        let cwd = nix::fcntl::open(
            "/",
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| setup(format!("its directory: {}", e.desc())))?;
        // SAFETY: `open` returned a new descriptor that nothing else owns.
        let cwd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(cwd) };
        let launch = Launch {
            program: cstring(&self.program.display().to_string())?,
            argv: self
                .argv
                .iter()
                .map(|a| cstring(&placed(a)))
                .collect::<Result<_, _>>()?,
            env,
            cwd,
        };
        Ok((launch, sandbox))
    }

    /// The job of one start from `launch` (in `own`, its sandbox with its session's place):
    /// its input, and how long it may live.
    fn job<'a>(
        &'a self,
        launch: Launch,
        own: Option<&'a ChildSandbox>,
        stdin: Input<'a>,
        timeout: Duration,
    ) -> Job<'a> {
        Job {
            program: launch.program,
            argv: launch.argv,
            env: launch.env,
            cwd: launch.cwd,
            stdin,
            timeout,
            limits: self.limits,
            sandbox: own.unwrap_or(&self.sandbox),
            own_network: self.own_network,
            max_output: self.max_output,
        }
    }

    /// Start the server for one conversation, confined, and hold it to its end or deadline;
    /// `place` is the directory it may write (its session's), if it has one. `Ok` once the
    /// conversation has what it asked for.
    pub fn converse(
        &self,
        who: &str,
        place: Option<&Path>,
        talk: &mut mcp::Call,
    ) -> Result<(), CallError> {
        let (launch, own) = self.launch(who, place)?;
        let job = self.job(launch, own.as_ref(), Input::Talk(talk), self.timeout);
        let done = spawn::run(job).map_err(|error| CallError::Spawn {
            who: who.to_string(),
            error,
        })?;
        if !matches!(talk.outcome(), Some(Ok(_))) {
            said_on_stderr(who, &done.stderr.bytes);
        }
        match talk.outcome() {
            Some(Ok(_)) => Ok(()),
            Some(Err(error)) => Err(CallError::Mcp {
                who: who.to_string(),
                error: error.clone(),
            }),
            None => Err(CallError::Silent {
                who: who.to_string(),
                how: self.how(done.ended, done.stdout.cut),
            }),
        }
    }

    /// How a server ended before it answered, as the owner's log and the model read it.
    fn how(&self, ended: Ended, cut: bool) -> String {
        match ended {
            Ended::TimedOut => {
                format!("its deadline of {} ms came first", self.timeout.as_millis())
            }
            _ if cut => format!(
                "it wrote more than the {} bytes the box reads",
                self.max_output
            ),
            Ended::Exited(code) => format!("it exited with code {code}"),
            Ended::Signaled(sig) => format!("signal {sig} ended it"),
            Ended::Stopped => "the box ended it".to_string(),
        }
    }

    /// The server's tools as its `tools/list` gives them (every page), asked confined as a
    /// call is: what the owner declares tools from (`brokerd tools ask`).
    /// A server with a place of its own is listed in a place no session has, emptied after.
    pub fn list(&self, name: &str) -> Result<Vec<Value>, CallError> {
        let who = format!("the server {name}");
        let mut talk = mcp::Call::listing();
        let place = match &self.state {
            Some(state) => Some(state.place(&who, &listing_place(), self.timeout)?),
            None => None,
        };
        let said = self.converse(&who, place.as_ref().map(|p| p.path.as_path()), &mut talk);
        if let Some(p) = &place {
            if let Err(e) = std::fs::remove_dir_all(&p.path) {
                return Err(CallError::Setup {
                    who,
                    why: format!(
                        "what it wrote while listed could not be removed from {} ({e}): remove \
                         it as root",
                        p.path.display()
                    ),
                });
            }
        }
        said?;
        Ok(talk.listed().map(<[Value]>::to_vec).unwrap_or_default())
    }

    /// The place a call of `session` may write, made if it is not there yet and held for the
    /// call; `None` for a server without one.
    fn session_place(&self, who: &str, session: &SessionId) -> Result<Option<Held>, CallError> {
        match &self.state {
            Some(state) => state.place(who, session.as_str(), self.timeout).map(Some),
            None => Ok(None),
        }
    }
}

/// A start of a server, prepared: everything but its input and its sandbox.
struct Launch {
    program: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: std::os::fd::OwnedFd,
}

/// A session's place, held by one call (or its kept process) at a time: two calls of one session at once would each
/// read the server's files and write them back, and one's writes would be lost.
#[derive(Debug)]
struct Held {
    path: PathBuf,
    /// The place's directory, `flock`ed; closing it lets the next call in.
    _lock: std::fs::File,
}

impl StatePlace {
    /// `<base>/<name>`, a directory of brokerd's alone (0700) that is not a link, holding at
    /// most `max_bytes` and [`MAX_STATE_ENTRIES`] entries, held for one call (waiting at most
    /// `wait` for the call of the same session that holds it).
    fn place(&self, who: &str, name: &str, wait: Duration) -> Result<Held, CallError> {
        use std::os::unix::fs::DirBuilderExt;
        let setup = |why: String| CallError::Setup {
            who: who.to_string(),
            why,
        };
        let place = self.base.join(name);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&place)
            .map_err(|e| setup(format!("its place {}: {e}", place.display())))?;
        // The server writes only inside it, so it cannot have replaced it; brokerd checks anyway.
        match std::fs::symlink_metadata(&place) {
            Ok(m) if m.is_dir() => {}
            _ => {
                return Err(setup(format!(
                    "its place {} is not a directory",
                    place.display()
                )));
            }
        }
        let lock = hold(&place, wait).map_err(setup)?;
        self.room(who, &place, &lock)?;
        Ok(Held {
            path: place,
            _lock: lock,
        })
    }

    /// Whether the place (`lock` its open directory) is within its bounds and its file system
    /// has room for a call: measured as each call starts, a kept server's too.
    fn room(&self, who: &str, place: &Path, lock: &std::fs::File) -> Result<(), CallError> {
        let full = |held: String| CallError::StateFull {
            who: who.to_string(),
            why: format!(
                "this session's place on it holds {held}, more than its state_max_mb allows"
            ),
        };
        match held(place) {
            Holds::Unmeasured(why) => return Err(full(format!("what cannot be measured: {why}"))),
            Holds::Measured(_, entries) if entries > MAX_STATE_ENTRIES => {
                return Err(full(format!("more than {MAX_STATE_ENTRIES} files")));
            }
            Holds::Measured(bytes, _) if bytes > self.max_bytes => {
                return Err(full(format!("{bytes} bytes")));
            }
            Holds::Measured(..) => {}
        }
        // The bound is measured as a call starts, so one call may write past it: the file
        // system keeps room for the place's bound and the box's own state besides.
        let needed = self.max_bytes.saturating_add(STATE_RESERVE);
        match free_bytes(lock) {
            Some(free) if free >= needed => {}
            free => {
                return Err(CallError::StateFull {
                    who: who.to_string(),
                    why: format!(
                        "its file system has {} bytes free, and a call needs {needed} (its \
                         state_max_mb and 256 MiB for the box's own state)",
                        free.map_or_else(|| "unknown".to_string(), |f| f.to_string())
                    ),
                });
            }
        }
        Ok(())
    }
}

impl Server {
    /// The bounds of a kept process's place, measured again as one of its calls starts (it may
    /// have written since the last).
    fn room_of(&self, who: &str, held: &Held) -> Result<(), CallError> {
        match &self.state {
            Some(state) => state.room(who, &held.path, &held._lock),
            None => Ok(()),
        }
    }
}

/// `dir`, opened and `flock`ed exclusively within `wait`.
fn hold(dir: &Path, wait: Duration) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(|e| format!("its place {}: {e}", dir.display()))?;
    let until = std::time::Instant::now() + wait;
    loop {
        // SAFETY: flock on a descriptor this function owns, with integer flags.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(format!("its place {}: {e}", dir.display()));
        }
        if std::time::Instant::now() >= until {
            return Err(format!(
                "another call of this session on it held its place for longer than {} ms",
                wait.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a place holds, as brokerd measures it.
enum Holds {
    /// Bytes (each file counted by what it takes on disk, allocated blocks included, or its
    /// size, whichever is more) and entries, at most [`MAX_STATE_ENTRIES`] counted.
    Measured(u64, usize),
    /// Something below could not be listed or looked at (a directory the server made
    /// unlistable, a path past `PATH_MAX`): not measured is not under the bound.
    Unmeasured(String),
}

/// What `dir` holds, links not followed; the walk stops once past [`MAX_STATE_ENTRIES`].
fn held(dir: &Path) -> Holds {
    use std::os::unix::fs::MetadataExt;
    let (mut bytes, mut entries) = (0u64, 0usize);
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let list = match std::fs::read_dir(&d) {
            Ok(list) => list,
            Err(e) => {
                return Holds::Unmeasured(format!("a directory in it cannot be listed ({e})"));
            }
        };
        for e in list {
            let e = match e {
                Ok(e) => e,
                Err(e) => {
                    return Holds::Unmeasured(format!("a directory in it cannot be read ({e})"));
                }
            };
            entries += 1;
            if entries > MAX_STATE_ENTRIES {
                return Holds::Measured(bytes, entries);
            }
            let m = match std::fs::symlink_metadata(e.path()) {
                Ok(m) => m,
                Err(e) => {
                    return Holds::Unmeasured(format!("a file in it cannot be looked at ({e})"));
                }
            };
            // A file's blocks may be allocated past its size (fallocate's KEEP_SIZE).
            bytes = bytes.saturating_add(m.len().max(m.blocks().saturating_mul(512)));
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    Holds::Measured(bytes, entries)
}

/// The space left to brokerd on the file system that holds `dir`, in bytes; `None` when it
/// cannot be asked.
fn free_bytes(dir: &std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: fstatvfs writes into the zeroed struct it is given, on a descriptor we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatvfs(dir.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The space a call of a server with a place needs free on its file system besides the place's
/// bound: what the box's own state (the audit chain, session states) needs to go on.
pub const STATE_RESERVE: u64 = 256 << 20;

impl CallError {
    /// Whether the server ran: it had the call's arguments and could read its paths, so how
    /// it failed (which request it refused, its exit code, when it stopped) may carry what it
    /// read, and raises the session as its result would.
    fn server_ran(&self) -> bool {
        !matches!(
            self,
            CallError::Setup { .. }
                | CallError::StateFull { .. }
                | CallError::Busy { .. }
                | CallError::Spawn {
                    error: spawn::SpawnError::Setup(..) | spawn::SpawnError::Start(..),
                    ..
                }
        )
    }
}

/// The most of a failed server's standard error the owner's log line keeps: its end, where a
/// program says why it stopped.
const STDERR_TAIL: usize = 600;

/// What a server that did not answer said on its standard error, for the owner's log only
/// (escaped: no terminal escape or line of its own reaches the log); the model never sees it.
fn said_on_stderr(who: &str, stderr: &[u8]) {
    if stderr.is_empty() {
        return;
    }
    let all = String::from_utf8_lossy(stderr);
    // Where a runtime says why it stopped before its trace (node's `Fatal ...` line), that
    // line first; then the end.
    let fatal = all
        .lines()
        .find(|l| l.contains("Fatal") || l.contains("out of memory"))
        .map(|l| format!("{}... ", l.chars().take(200).collect::<String>()))
        .unwrap_or_default();
    let tail = format!(
        "{fatal}{}",
        String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(STDERR_TAIL)..])
    );
    bxharden::log::line(
        FAILED_ANCHOR,
        &format!(
            "brokerd: {who} said on its standard error, ending: {tail:?}; {}",
            bxcore::runbook::pointer(FAILED_ANCHOR)
        ),
    );
}

/// One call: the server started for it, the conversation, the answer labelled as declared
/// (`carries`, the plan's label).
fn call(
    d: &Declaration,
    server: &Server,
    args: &Value,
    carries: Label,
    session: &SessionId,
) -> Result<Output, ToolError> {
    let who = format!("the server of {}", d.name);
    let said = match &server.keeping {
        Some(keeping) => server.call_kept(keeping, &who, session, d.server_tool(), &d.digest, args),
        None => {
            let mut talk = mcp::Call::new(d.server_tool(), &d.digest, args.clone());
            server
                .session_place(&who, session)
                .and_then(|place| {
                    server.converse(&who, place.as_ref().map(|p| p.path.as_path()), &mut talk)
                })
                .map(|()| talk)
        }
    };
    let talk = match said {
        Ok(talk) => talk,
        Err(e) => {
            bxharden::log::fail_in(&"a declared tool", &e);
            let text = format!(
                "{e}; {}",
                bxcore::runbook::pointer(bxcore::runbook::Anchored::anchor(&e))
            );
            // A failure the server could shape is what it answered: it carries the declared label.
            return Err(if e.server_ran() {
                ToolError::Touched(
                    crate::workspace::Reached {
                        label: carries,
                        read_only: None,
                    },
                    text,
                )
            } else {
                ToolError::Failed(text)
            });
        }
    };
    let Some(Ok(answer)) = talk.outcome() else {
        return Err(ToolError::Failed(format!(
            "the server of {} gave no answer",
            d.name
        )));
    };
    // What the tool says, failure or not, is its result and carries its label: the server's
    // words never pass as the box's own.
    let mut content = if answer.is_error {
        format!("the tool reported an error:\n{}", answer.text)
    } else {
        answer.text.clone()
    };
    if content.len() > MAX_ANSWER {
        let mut end = MAX_ANSWER;
        while !content.is_char_boundary(end) {
            end -= 1;
        }
        content.truncate(end);
        content.push_str(&format!(
            "\n(cut: the tool's answer was longer than {MAX_ANSWER} bytes; the rest was not \
             passed on)"
        ));
    }
    Ok(Output {
        content,
        summary: answer
            .is_error
            .then(|| "the tool reported an error".to_string()),
        from_place: FromPlace::All,
    })
}

/// The arguments against the declared schema's top level: an object, of at most [`MAX_ARGS`]
/// bytes, with every required property, each property of its declared type (and one of its
/// `enum`, where it has one), and no other property where the schema says
/// `additionalProperties: false`. The server checks the rest.
pub fn validate(tool: &str, schema: &Value, args: &Value) -> Result<(), String> {
    let Some(obj) = args.as_object() else {
        return Err(format!("the arguments of {tool} are a JSON object"));
    };
    if serde_json::to_vec(args).map_or(usize::MAX, |v| v.len()) > MAX_ARGS {
        return Err(format!(
            "the arguments of {tool} are longer than {MAX_ARGS} bytes"
        ));
    }
    let props = schema.get("properties").and_then(Value::as_object);
    for req in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !obj.contains_key(req) {
            return Err(format!("the argument {req:?} of {tool} is missing"));
        }
    }
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    for (key, value) in obj {
        let Some(prop) = props.and_then(|p| p.get(key)) else {
            if closed {
                return Err(format!("{tool} has no argument {key:?}"));
            }
            continue;
        };
        if let Some(ty) = prop.get("type").and_then(Value::as_str) {
            let fits = match ty {
                "string" => value.is_string(),
                "integer" => value.is_i64() || value.is_u64(),
                "number" => value.is_number(),
                "boolean" => value.is_boolean(),
                "array" => value.is_array(),
                "object" => value.is_object(),
                "null" => value.is_null(),
                _ => true,
            };
            if !fits {
                return Err(format!("the argument {key:?} of {tool} is a {ty}"));
            }
        }
        if let Some(options) = prop.get("enum").and_then(Value::as_array) {
            if !options.contains(value) {
                return Err(format!(
                    "the argument {key:?} of {tool} is not one of those its schema allows"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_checked_against_the_declared_schema() {
        let schema = json!({"type": "object", "additionalProperties": false,
            "properties": {"tz": {"type": "string"}, "n": {"type": "integer"},
                           "unit": {"type": "string", "enum": ["s", "ms"]}},
            "required": ["tz"]});
        assert_eq!(
            validate("t", &schema, &json!({"tz": "UTC", "n": 3, "unit": "s"})),
            Ok(())
        );
        for (bad, why) in [
            (json!([]), "a JSON object"),
            (json!({}), "\"tz\" of t is missing"),
            (json!({"tz": 1}), "is a string"),
            (json!({"tz": "a", "n": 1.5}), "is a integer"),
            (json!({"tz": "a", "unit": "h"}), "not one of"),
            (json!({"tz": "a", "x": 1}), "no argument \"x\""),
            (json!({"tz": "a".repeat(MAX_ARGS)}), "longer than"),
        ] {
            let e = validate("t", &schema, &bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    fn declaration() -> Declaration {
        toml::from_str(
            r#"
            name = "now"
            server = "time"
            description = "The time in a timezone."
            parameters = { type = "object" }
            digest = "0000000000000000000000000000000000000000000000000000000000000000"
            reads = "public"
            effect = "none"
            "#,
        )
        .unwrap()
    }

    #[test]
    fn a_declaration_trusts_nothing_by_default_and_says_one_thing() {
        let d = declaration();
        assert!(
            d.untrusted,
            "a declared tool's results are third-party text unless the owner says"
        );
        assert_eq!(d.approval, ApprovalRule::Never);
        assert_eq!(d.check(), Ok(()));
        type Spoil = fn(&mut Declaration);
        let cases: [(&str, Spoil); 7] = [
            ("1 to 64", |d| d.name = "Now!".into()),
            ("a tool of that name", |d| d.name = "run".into()),
            ("description", |d| d.description = " ".into()),
            ("type \"object\"", |d| {
                d.parameters = json!({"type": "string"})
            }),
            ("64 lowercase hex", |d| d.digest = "abc".into()),
            ("needs egress_max", |d| d.effect = DeclaredEffect::Egress),
            ("only for effect = \"local\"", |d| {
                d.writes_into = Some(DataClass::Private)
            }),
        ];
        for (why, spoil) in cases {
            let mut d = declaration();
            spoil(&mut d);
            let e = d.check().unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
