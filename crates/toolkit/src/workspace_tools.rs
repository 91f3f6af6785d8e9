//! `workspace_list`, `workspace_read`, `workspace_write`: files in the configured roots, each path
//! resolved beneath its root by the kernel (`workspace.rs`). Their class and trust are those of
//! every root the opened object lies in (roots nest), the strictest winning; a call that ran
//! against a root's files carries those labels whether it succeeds or fails.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{OFlag, renameat};
use nix::sys::stat::{Mode, SFlag, fstat};
use serde_json::Value;

use crate::args::{PathArgs, WriteArgs};
use crate::workspace::open_beneath;
use crate::{ApprovalRule, Declared, Effect, Env, Output, Plan, Reads, Tool, ToolError};

/// The most a read returns: what is left of a 1 MiB frame is for the envelope.
pub const MAX_READ: u64 = 512 * 1024;
/// The most entries a listing returns.
pub const MAX_LIST: usize = 1000;

fn read_plan(args: &PathArgs, env: &Env) -> Result<Plan, ToolError> {
    let at = env.roots.locate(&args.path)?;
    Ok(Plan {
        carries: at.labels(&env.roots).label,
        effect: Effect::None,
        writes_into: None,
    })
}

/// The object a read opened must be no stricter than the plan the policy decided on: a file
/// moved into a stricter root in between is refused (and raises the session to where it is).
fn check_opened(
    env: &Env,
    at: &crate::workspace::Beneath<'_>,
    fd: &OwnedFd,
    shown: &str,
    plan: &Plan,
) -> Result<(), ToolError> {
    let reached = env.roots.labels(at.root, fd)?;
    if !reached.label.flows_to(plan.carries) {
        return Err(ToolError::Touched(
            reached,
            format!("{shown} moved while the call was decided; ask again"),
        ));
    }
    Ok(())
}

/// `root <name>`: the root a workspace path lands in, for a lease.
fn root_place(path: &str, env: &Env) -> Option<String> {
    env.roots
        .locate(path)
        .ok()
        .map(|at| format!("root {}", at.root.name()))
}

fn is_kind(fd: &OwnedFd, kind: SFlag) -> Result<bool, ToolError> {
    let st = fstat(fd.as_raw_fd()).map_err(|e| ToolError::Failed(e.desc().to_string()))?;
    Ok(SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == kind)
}

/// `workspace_list {path}`: the entries of a directory, one per line, directories ending in `/`.
#[derive(Debug, Clone, Copy)]
pub struct WorkspaceList;

impl Tool for WorkspaceList {
    type Args = PathArgs;
    fn name(&self) -> &'static str {
        "workspace_list"
    }
    fn description(&self) -> &'static str {
        "List a directory in the workspace: one entry per line, directories end in '/'."
    }
    fn parameters(&self) -> Value {
        PathArgs::schema("directory")
    }
    fn place(&self, args: &Self::Args, env: &Env) -> Option<String> {
        root_place(&args.path, env)
    }
    fn declared(&self) -> Declared {
        Declared {
            reads: Reads::Root,
            untrusted_output: false,
            effect: Effect::None,
            approval: ApprovalRule::Never,
        }
    }
    fn plan(&self, args: &PathArgs, env: &Env) -> Result<Plan, ToolError> {
        read_plan(args, env)
    }
    fn run(&self, args: &PathArgs, plan: &Plan, env: &Env) -> Result<Output, ToolError> {
        let shown = args.path.as_str();
        let at = env.roots.locate(shown)?;
        let fd = at.open(shown, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty())?;
        check_opened(env, &at, &fd, shown, plan)?;
        // `Dir` takes the descriptor over, and closes it on failure too.
        let mut dir = nix::dir::Dir::from(fd)
            .map_err(|e| ToolError::Failed(format!("{shown}: {}", e.desc())))?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| ToolError::Failed(format!("{shown}: {}", e.desc())))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let is_dir = matches!(entry.file_type(), Some(nix::dir::Type::Directory));
            names.push(if is_dir { format!("{name}/") } else { name });
        }
        names.sort();
        let total = names.len();
        names.truncate(MAX_LIST);
        let mut content = names.join("\n");
        if total > MAX_LIST {
            content.push_str(&format!("\n(and {} more)", total - MAX_LIST));
        }
        Ok(Output::text(content))
    }
}

/// `workspace_read {path}`: a text file's content.
#[derive(Debug, Clone, Copy)]
pub struct WorkspaceRead;

impl Tool for WorkspaceRead {
    type Args = PathArgs;
    fn name(&self) -> &'static str {
        "workspace_read"
    }
    fn description(&self) -> &'static str {
        "Read a text file in the workspace."
    }
    fn parameters(&self) -> Value {
        PathArgs::schema("file")
    }
    fn place(&self, args: &Self::Args, env: &Env) -> Option<String> {
        root_place(&args.path, env)
    }
    fn declared(&self) -> Declared {
        Declared {
            reads: Reads::Root,
            untrusted_output: false,
            effect: Effect::None,
            approval: ApprovalRule::Never,
        }
    }
    fn plan(&self, args: &PathArgs, env: &Env) -> Result<Plan, ToolError> {
        read_plan(args, env)
    }
    fn run(&self, args: &PathArgs, plan: &Plan, env: &Env) -> Result<Output, ToolError> {
        let shown = args.path.as_str();
        let at = env.roots.locate(shown)?;
        // Non-blocking, so a FIFO planted in a root cannot hold the call; refused below anyway.
        let fd = at.open(shown, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty())?;
        check_opened(env, &at, &fd, shown, plan)?;
        if !is_kind(&fd, SFlag::S_IFREG)? {
            return Err(ToolError::Failed(format!("{shown} is not a regular file")));
        }
        let mut bytes = Vec::new();
        File::from(fd)
            .take(MAX_READ + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ToolError::Failed(format!("{shown}: {e}")))?;
        if bytes.len() as u64 > MAX_READ {
            return Err(ToolError::Failed(format!(
                "{shown} is larger than {MAX_READ} bytes, the most one read returns"
            )));
        }
        let content = String::from_utf8(bytes)
            .map_err(|_| ToolError::Failed(format!("{shown} is not UTF-8 text")))?;
        Ok(Output::text(content))
    }
}

/// `workspace_write {path, content}`: replace a file in a writable root, atomically.
#[derive(Debug, Clone, Copy)]
pub struct WorkspaceWrite;

impl Tool for WorkspaceWrite {
    type Args = WriteArgs;
    fn name(&self) -> &'static str {
        "workspace_write"
    }
    fn description(&self) -> &'static str {
        "Write a text file in a writable workspace root, replacing it whole if it exists."
    }
    fn parameters(&self) -> Value {
        WriteArgs::schema()
    }
    fn place(&self, args: &Self::Args, env: &Env) -> Option<String> {
        root_place(&args.path, env)
    }
    fn declared(&self) -> Declared {
        Declared {
            // What a write tells about the place it lands in (that it exists, what is there)
            // is labelled like a read of that place.
            reads: Reads::Root,
            untrusted_output: false,
            effect: Effect::Local,
            approval: ApprovalRule::Never,
        }
    }
    fn plan(&self, args: &WriteArgs, env: &Env) -> Result<Plan, ToolError> {
        let shown = args.path.as_str();
        let at = env.roots.locate(shown)?;
        // The file lands in its directory (a new name renamed in), so that directory's roots
        // decide: the strictest class, and no write if any of them is read-only.
        let labels = at.parent_labels(&env.roots);
        if let Some(ro) = &labels.read_only {
            let why = format!(
                "{shown} is in the workspace root {}, which is read-only",
                ro.display()
            );
            return Err(ToolError::Touched(labels, why));
        }
        Ok(Plan {
            carries: labels.label,
            effect: Effect::Local,
            writes_into: Some(labels.label.class),
        })
    }
    fn run(&self, args: &WriteArgs, plan: &Plan, env: &Env) -> Result<Output, ToolError> {
        let shown = args.path.as_str();
        let content = args.content.as_str();
        let at = env.roots.locate(shown)?;
        let (dir, name) = at.open_parent(shown)?;
        // The directory opened is the one written into: it must still be writable and no less
        // strict than the place the policy decided on (the run does not trust that nothing
        // changed in between).
        let labels = env.roots.labels(at.root, &dir)?;
        if let Some(ro) = &labels.read_only {
            let why = format!(
                "{shown} is in the workspace root {}, which is read-only",
                ro.display()
            );
            return Err(ToolError::Touched(labels, why));
        }
        if Some(labels.label.class) < plan.writes_into {
            return Err(ToolError::Touched(
                labels,
                format!("{shown} moved while the call was decided; ask again"),
            ));
        }
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            ToolError::Failed(format!("{shown}: {what}: {e}"))
        };
        // The new content goes to a temporary file beside the target, then is renamed over it:
        // a reader sees the old file or the new one, whole. `rename` replaces a symlink at the
        // target itself and never writes through it.
        let tmp = format!(".bx-write-{}.tmp", bxcore::ApprovalId::random());
        let fd = open_beneath(
            &dir,
            std::path::Path::new(&tmp),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| fail("cannot create the new file", &e.desc()))?;
        let mut file = File::from(fd);
        let written = file
            .write_all(content.as_bytes())
            .and_then(|()| file.sync_all());
        if let Err(e) = written {
            let _ = nix::unistd::unlinkat(
                Some(dir.as_raw_fd()),
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return Err(fail("cannot write", &e));
        }
        drop(file);
        if let Err(e) = renameat(
            Some(dir.as_raw_fd()),
            tmp.as_str(),
            Some(dir.as_raw_fd()),
            name,
        ) {
            let _ = nix::unistd::unlinkat(
                Some(dir.as_raw_fd()),
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return Err(fail("cannot replace it", &e.desc()));
        }
        nix::unistd::fsync(dir.as_raw_fd())
            .map_err(|e| fail("cannot sync its directory", &e.desc()))?;
        Ok(Output::own(format!(
            "wrote {} bytes to {shown}",
            content.len()
        )))
    }
}
