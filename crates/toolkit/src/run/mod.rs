//! `run {argv, cwd, stdin?, timeout_ms?}`: a program, started from an argv (never a shell
//! string: a model that asks for `sh -c ...` gets the program `sh`, judged like any other), in
//! a sandbox of its own that brokerd prepares for the one call (`spawn`).
//!
//! What the program may reach is what the call is labelled with, and nothing else:
//!
//! - It reads the workspace roots the call can see: every root whose class is at most the
//!   call's class, and untrusted ones only when the call is untrusted, where the call's labels
//!   are the session's joined with those of the root its `cwd` lies in. So a private session
//!   running in a private root sees the private roots; running with `cwd` in a secret root is
//!   asking to read secrets, and the result (and the session) is secret. Its result carries
//!   the labels of all it can reach, nested roots and hard links included (`reach`).
//! - It writes only the writable roots among those whose class is the call's own (write-down:
//!   what it read may land only where a class at least as high is kept), and only where no
//!   root nested inside is read-only or unseen (Landlock grants a whole tree).
//! - It reads and runs the system's program directories (`[run] system_paths`), and nothing
//!   else on disk: no other root, no daemon's state, no `/proc`, no `/home`.
//! - No network: seccomp refuses every socket but `AF_UNIX`, and where the system allows it
//!   the program has a network namespace of its own with no interface up.

mod reach;
pub mod spawn;

pub use reach::{Reach, WALK_LIMIT, reach, sees, sees_marked};

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bxharden::ChildSandbox;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use serde_json::Value;

use crate::args::RunArgs;
use crate::{ApprovalRule, Declared, Effect, Env, FromPlace, Output, Plan, Reads, Tool, ToolError};
use bxcore::Label;
use spawn::{Ended, Finished, Job, Limits, SpawnError};

/// What `run` answers while brokerd has no `[run]` section (it is then not offered at all).
pub const NOT_CONFIGURED: &str = "the run tool is not configured on this box";

/// The runbook anchor of a program that could not be started or whose end was lost.
pub const START_ANCHOR: &str = "run-start-failed";
/// The runbook anchor of the line that says the children have no network namespace of their own.
pub const NAMESPACE_ANCHOR: &str = "run-no-network-namespace";

/// The fixed `PATH` when `[run] path` names none: the system profile on NixOS, then the usual.
pub const DEFAULT_PATH: [&str; 3] = ["/run/current-system/sw/bin", "/usr/bin", "/bin"];

/// What a program may read and run besides the roots, when `[run] system_paths` names nothing:
/// those that exist here. The program directories and their libraries (`/nix/store` is in
/// every sandbox already), and of `/etc` only what the loader and ordinary programs read: never
/// `/etc` whole (it holds `shadow`, keys, the box's own configuration).
pub const DEFAULT_SYSTEM_PATHS: [&str; 20] = [
    "/run/current-system/sw",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    // git takes a system configuration it may not read for a fatal error (it stops on EACCES,
    // where Landlock answers), as the git tool server and `run git` do.
    "/etc/gitconfig",
    "/etc/static",
    "/dev/urandom",
    "/dev/zero",
];

/// How `run` is set up on this box: `[run]` in brokerd.toml, with the child's sandbox prepared.
#[derive(Debug)]
pub struct Settings {
    /// The fixed `PATH` a bare program name is looked up on, in order.
    pub path: Vec<PathBuf>,
    /// The owner's allow-list: absolute paths, or bare names looked up on `path`. `None`: any.
    pub programs: Option<Vec<String>>,
    /// `RLIMIT_AS`, bytes.
    pub memory_bytes: u64,
    /// `RLIMIT_FSIZE`, bytes.
    pub file_bytes: u64,
    /// `RLIMIT_NPROC`.
    pub processes: u64,
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
    /// The most of each of stdout and stderr returned.
    pub max_output: usize,
    /// Try a user and network namespace of its own for each program.
    pub own_network: bool,
    /// The child's sandbox with the system's paths (read-only) and the seccomp filters; each
    /// call adds the roots it may reach.
    pub sandbox: ChildSandbox,
}

/// The program `argv[0]` names: an absolute path as it is, or a bare name looked up on the fixed
/// `PATH`. A relative path with a `/` is refused: it would mean different programs in
/// different directories.
pub fn resolve(name: &str, path: &[PathBuf]) -> Result<PathBuf, ToolError> {
    let shown_path = || {
        path.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    };
    if name.starts_with('/') {
        return if is_program(Path::new(name)) {
            Ok(PathBuf::from(name))
        } else {
            Err(ToolError::Failed(format!(
                "the program {name} does not exist or is not an executable file"
            )))
        };
    }
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(ToolError::Refused(format!(
            "argv[0] {name:?} is neither an absolute path nor a program name; give the whole \
             path, or a name found on the run tool's PATH ({})",
            shown_path()
        )));
    }
    path.iter()
        .map(|dir| dir.join(name))
        .find(|p| is_program(p))
        .ok_or_else(|| {
            ToolError::Failed(format!(
                "there is no program {name:?} on the run tool's PATH ({}); give its absolute path",
                shown_path()
            ))
        })
}

fn is_program(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Settings {
    /// Whether the owner's allow-list lets `program` (as resolved) run.
    pub fn allows(&self, program: &Path) -> bool {
        let Some(list) = &self.programs else {
            return true;
        };
        list.iter().any(|entry| {
            if entry.starts_with('/') {
                Path::new(entry) == program
            } else {
                resolve(entry, &self.path).is_ok_and(|p| p == program)
            }
        })
    }

    /// The program of a call, resolved and checked against the allow-list.
    fn program(&self, argv0: &str) -> Result<PathBuf, ToolError> {
        let program = resolve(argv0, &self.path)?;
        if !self.allows(&program) {
            return Err(ToolError::Denied(format!(
                "{} is not on the owner's list of programs the run tool may start",
                program.display()
            )));
        }
        Ok(program)
    }
}

/// `run`: see the module's documentation.
#[derive(Debug, Clone, Copy)]
pub struct Run;

impl Tool for Run {
    type Args = RunArgs;
    fn name(&self) -> &'static str {
        "run"
    }
    fn description(&self) -> &'static str {
        "Run a program from an argv array (no shell), in a workspace directory, without network; \
         returns its exit status, stdout and stderr."
    }
    fn parameters(&self) -> Value {
        RunArgs::schema()
    }
    fn declared(&self) -> Declared {
        Declared {
            reads: Reads::Root,
            untrusted_output: false,
            effect: Effect::Local,
            approval: ApprovalRule::Untrusted,
        }
    }
    fn plan(&self, args: &RunArgs, env: &Env) -> Result<Plan, ToolError> {
        self.plan_seen(args, env, Label::FRESH)
    }
    fn place(&self, args: &RunArgs, env: &Env) -> Option<String> {
        let root = env.roots.locate(&args.cwd).ok()?;
        Some(format!(
            "program {} in root {}",
            args.argv.first()?,
            root.root.name()
        ))
    }
    fn plan_seen(&self, args: &RunArgs, env: &Env, seen: Label) -> Result<Plan, ToolError> {
        let settings = env
            .run
            .as_deref()
            .ok_or_else(|| ToolError::Failed(NOT_CONFIGURED.to_string()))?;
        settings.program(&args.argv[0])?;
        let at = env.roots.locate(&args.cwd)?;
        let sees = sees_marked(
            &env.roots,
            &at.root.path,
            seen.join(at.labels(&env.roots).label),
        );
        let writes = !reach(&env.roots, sees, true).read_write.is_empty();
        Ok(Plan {
            carries: sees,
            effect: if writes { Effect::Local } else { Effect::None },
            writes_into: writes.then_some(sees.class),
            marks_writes: false,
        })
    }
    fn run(&self, args: &RunArgs, plan: &Plan, env: &Env) -> Result<Output, ToolError> {
        let settings = env
            .run
            .as_deref()
            .ok_or_else(|| ToolError::Failed(NOT_CONFIGURED.to_string()))?;
        let program = settings.program(&args.argv[0])?;
        let shown = args.cwd.as_str();
        let at = env.roots.locate(shown)?;
        let cwd = at.open(shown, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty())?;
        let reached = env.roots.labels(at.root, &cwd)?;
        if !reached.label.flows_to(plan.carries) {
            return Err(ToolError::Touched(
                reached,
                format!("{shown} moved while the call was decided; ask again"),
            ));
        }
        // What it sees now (a hard link made since the plan): never more than was decided.
        let now = sees_marked(&env.roots, &at.root.path, plan.carries);
        if now != plan.carries {
            return Err(ToolError::Touched(
                crate::workspace::Reached {
                    label: now,
                    read_only: None,
                },
                "the roots the call can see changed while it was decided (a root now holds a \
                 hard link to a stricter root's file); ask again"
                    .to_string(),
            ));
        }
        // Writes only as decided: where the plan's own class is kept, and only if it writes.
        let write = plan.effect == Effect::Local && plan.writes_into == Some(plan.carries.class);
        let reach = reach(&env.roots, plan.carries, write);
        // A program that may have read third-party content writes it where it may write: each
        // trusted writable root it is given is marked whole, durably, before it starts.
        if plan.marks_writes {
            mark_roots(env, &reach.read_write)?;
        }
        let sandbox = settings
            .sandbox
            .with_paths(&reach.read_write, &reach.read_only)
            .map_err(|e| ToolError::Failed(format!("the program's sandbox: {e}")))?;
        let timeout_ms = args.timeout_ms();
        let cstring = |s: &str| {
            CString::new(s).map_err(|_| ToolError::Refused("a NUL character in argv".into()))
        };
        let job = Job {
            program: cstring(&program.display().to_string())?,
            argv: args
                .argv
                .iter()
                .map(|a| cstring(a))
                .collect::<Result<_, _>>()?,
            env: spawn::environment(&settings.path, shown)
                .map_err(|_| ToolError::Refused("a NUL character in cwd".into()))?,
            cwd,
            stdin: spawn::Input::Bytes(args.stdin.as_deref().unwrap_or("").as_bytes()),
            timeout: Duration::from_millis(timeout_ms),
            limits: Limits {
                cpu_seconds: timeout_ms.div_ceil(1000) + 1,
                memory_bytes: settings.memory_bytes,
                file_bytes: settings.file_bytes,
                processes: settings.processes,
                open_files: settings.open_files,
            },
            sandbox: &sandbox,
            own_network: settings.own_network,
            max_output: settings.max_output,
        };
        match spawn::run(job) {
            Ok(done) => {
                if let Some(e) = done.no_namespace {
                    note_no_namespace(e);
                }
                let content = describe(&done, timeout_ms, settings.max_output);
                let summary = content.lines().next().map(str::to_string);
                // The program's own bytes, without the framing around them.
                let from_place = FromPlace::Parts(
                    [&done.stdout, &done.stderr]
                        .iter()
                        .map(|c| String::from_utf8_lossy(&c.bytes).into_owned())
                        .collect(),
                );
                Ok(Output {
                    content,
                    summary,
                    from_place,
                })
            }
            Err(error) => {
                let program = program.to_path_buf();
                let e = match error {
                    SpawnError::Start("execve", _) => RunError::Start { program, error },
                    _ => RunError::Run { program, error },
                };
                bxharden::log::fail_in(&"the run tool", &e);
                Err(ToolError::Failed(e.to_string()))
            }
        }
    }
}

static NOTED: AtomicBool = AtomicBool::new(false);

/// Say once per process that the programs have no network namespace of their own.
fn note_no_namespace(errno: i32) {
    if NOTED.swap(true, Ordering::Relaxed) {
        return;
    }
    bxharden::log::fail(&RunError::NoNamespace(errno));
}

/// What the run tool logs with its runbook entry: a program that did not run, and a sandbox
/// weaker than asked for.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A step before `execve` failed, or `execve` itself.
    #[error("{} could not be started: {error}", program.display())]
    Start { program: PathBuf, error: SpawnError },
    /// A pipe or the fork failed, or the program's end was not seen.
    #[error("{} could not be run: {error}", program.display())]
    Run { program: PathBuf, error: SpawnError },
    /// The programs get no network namespace of their own (the errno of `unshare`).
    #[error(
        "the run tool's programs get no network namespace of their own ({}); seccomp still \
         refuses them every network socket",
        nix::errno::Errno::from_raw(*.0).desc()
    )]
    NoNamespace(i32),
}

impl bxcore::runbook::Anchored for RunError {
    fn anchor(&self) -> &str {
        match self {
            RunError::Start { .. } | RunError::Run { .. } => START_ANCHOR,
            RunError::NoNamespace(_) => NAMESPACE_ANCHOR,
        }
    }
}

/// The signal's name, for the model and the owner.
fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// What the model is shown: how it ended, then its stdout and stderr, each with a note where
/// it was cut.
pub fn describe(done: &Finished, timeout_ms: u64, max_output: usize) -> String {
    let status = match done.ended {
        Ended::Exited(code) => format!("exit code {code}"),
        Ended::Signaled(sig) => {
            let why = match sig {
                libc::SIGXCPU => ": it used up its CPU time limit",
                libc::SIGXFSZ => ": it went past its file size limit",
                libc::SIGSYS => ": it made a system call its sandbox refuses",
                libc::SIGPIPE if done.stdout.cut || done.stderr.cut => {
                    ": it wrote past the output limit"
                }
                _ => "",
            };
            format!("ended by {}{why}", signal_name(sig))
        }
        Ended::TimedOut => format!(
            "stopped at its deadline of {timeout_ms} ms: it and every process it started were \
             killed"
        ),
        // A run program has no stop pipe; its supervisor says so only when its wait failed.
        Ended::Stopped => "stopped by the box before it ended".to_string(),
    };
    let mut out = status;
    for (name, c) in [("stdout", &done.stdout), ("stderr", &done.stderr)] {
        out.push_str(&format!("\n--- {name} ---\n"));
        out.push_str(&String::from_utf8_lossy(&c.bytes));
        if c.cut {
            out.push_str(&format!(
                "\n(cut: {name} was longer than {max_output} bytes; the rest was not read)"
            ));
        }
    }
    out
}

/// Mark whole every root among `writable` that is not untrusted already (`crate::marks`): what
/// a program that may have read third-party content writes there is third-party content.
fn mark_roots(env: &Env, writable: &[PathBuf]) -> Result<(), ToolError> {
    for root in env.roots.iter().filter(|r| writable.contains(&r.path)) {
        if root.untrusted {
            continue;
        }
        let fd = nix::fcntl::open(
            &root.path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            ToolError::Failed(format!(
                "the workspace root {} cannot be opened: {}",
                root.path.display(),
                e.desc()
            ))
        })?;
        // SAFETY: `open` returned a new descriptor that nothing else owns.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        env.roots.mark(&fd, None, None, true).map_err(|e| {
            ToolError::Failed(format!("the program was not started: {}", e.pointed()))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bxcore::runbook::Anchored;

    #[test]
    fn the_run_tools_errors_know_their_anchors_and_keep_their_words() {
        let start = RunError::Start {
            program: "/bin/x".into(),
            error: SpawnError::Start("execve", libc::EACCES),
        };
        assert_eq!(start.anchor(), START_ANCHOR);
        assert_eq!(
            start.to_string(),
            "/bin/x could not be started: execve: Permission denied"
        );
        let run = RunError::Run {
            program: "/bin/x".into(),
            error: SpawnError::Setup("fork", libc::EAGAIN),
        };
        assert_eq!(run.anchor(), START_ANCHOR);
        assert_eq!(run.to_string(), "/bin/x could not be run: fork: Try again");
        let ns = RunError::NoNamespace(libc::EPERM);
        assert_eq!(ns.anchor(), NAMESPACE_ANCHOR);
        assert_eq!(
            ns.to_string(),
            "the run tool's programs get no network namespace of their own (Operation not \
             permitted); seccomp still refuses them every network socket"
        );
    }
}
