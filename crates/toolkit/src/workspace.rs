//! Workspace roots and paths resolved beneath them.
//!
//! A path the model gives lies in one configured root without leaving it: an absolute path whose
//! words start in a root, or a path relative to a root ([`Roots::locate`]: `<name>/<rest>` names
//! a root by its name, anything else is taken in the first root). The kernel does the resolving: the root is opened, and the rest of the path is opened relative to
//! it with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, which refuses `..` that leaves the
//! root, every absolute symlink, and a relative symlink that leads out, at each step of the walk
//! and atomically with it. No check-then-open race is left for a concurrent rename to win.
//!
//! Roots may nest (a secret `notes/vault` inside a private `notes`), so the root a path's words
//! start in says little about where the kernel's walk ends (`notes/x/../vault/pin.txt`, a
//! relative symlink). What a call reads or writes is labelled by the object it opened: every
//! configured root that contains the object after resolution counts, and the strictest wins
//! ([`Roots::labels`]).

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use bxcore::{DataClass, Label};
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, SFlag};
use serde::Deserialize;

use crate::ToolError;

/// `[[workspace.roots]]`: one directory the tools may reach.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Root {
    /// Absolute.
    pub path: PathBuf,
    /// What a relative path calls it (`notes/todo.txt`), and what the model is told it is;
    /// absent: the directory's own name. Letters, digits, `.`, `_` and `-`.
    #[serde(default)]
    pub name: Option<String>,
    /// The class of what it holds: a read raises the session to it, and a session above it may
    /// not write into it.
    pub class: DataClass,
    #[serde(default)]
    pub writable: bool,
    /// Third parties wrote what it holds (a mail spool, a downloads folder).
    #[serde(default)]
    pub untrusted: bool,
}

/// A `[[workspace.roots]]` list that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootsError {
    #[error(
        "[[workspace.roots]] path {} is not an absolute, normal path (no `..`, no `.`)",
        .0.display()
    )]
    NotAbsolute(PathBuf),
    #[error("[[workspace.roots]] path {} is listed twice", .0.display())]
    Twice(PathBuf),
    #[error(
        "[[workspace.roots]] name {0:?} is not a root's name: 1 to 64 letters, digits, `.`, `_` \
         or `-`, not `.` or `..`"
    )]
    BadName(String),
    #[error(
        "[[workspace.roots]] name {0:?} is the name of two roots (a root without a name is called \
         by its directory's name): give one of them another `name`"
    )]
    NameTwice(String),
}

impl Root {
    /// What the model and a relative path call this root: its `name`, else its directory's.
    pub fn name(&self) -> &str {
        match &self.name {
            Some(n) => n,
            None => self
                .path
                .file_name()
                .and_then(OsStr::to_str)
                .unwrap_or("root"),
        }
    }
}

/// Whether `name` may name a root.
fn good_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The configured roots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roots(Vec<Root>);

/// What the roots that contain one object say about it, summed up strictly: their labels joined
/// (the highest class, untrusted if any of them is), and writable only if all of them are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    pub label: Label,
    /// A root that contains the object and is not writable, if any.
    pub read_only: Option<PathBuf>,
}

impl Root {
    /// What the root holds: its class, and whether third parties wrote it.
    pub fn label(&self) -> Label {
        Label::new(self.class, self.untrusted)
    }
}

impl Reached {
    /// What one root says.
    pub fn of(root: &Root) -> Reached {
        Reached {
            label: root.label(),
            read_only: (!root.writable).then(|| root.path.clone()),
        }
    }

    /// What this and `other` say at once: the strictest of each.
    pub fn join(self, other: &Root) -> Reached {
        Reached {
            label: self.label.join(other.label()),
            read_only: self
                .read_only
                .or_else(|| (!other.writable).then(|| other.path.clone())),
        }
    }
}

/// A path split into the root it lies in and the part beneath that root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beneath<'a> {
    pub root: &'a Root,
    /// Relative to the root; empty for the root itself.
    pub rest: PathBuf,
}

impl Roots {
    /// Check each root's path: absolute, written without `.` or `..`, and listed once.
    pub fn new(roots: Vec<Root>) -> Result<Roots, RootsError> {
        for (i, r) in roots.iter().enumerate() {
            let normal = r.path.is_absolute()
                && r.path
                    .components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
            if !normal {
                return Err(RootsError::NotAbsolute(r.path.clone()));
            }
            if roots[..i].iter().any(|o| o.path == r.path) {
                return Err(RootsError::Twice(r.path.clone()));
            }
            if !good_name(r.name()) {
                return Err(RootsError::BadName(r.name().to_string()));
            }
            if roots[..i].iter().any(|o| o.name() == r.name()) {
                return Err(RootsError::NameTwice(r.name().to_string()));
            }
        }
        Ok(Roots(roots))
    }

    /// The first root: where a relative path that names no root is taken.
    pub fn first(&self) -> Option<&Root> {
        self.0.first()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Root> {
        self.0.iter()
    }

    /// The root `path` lies in and the rest of the path. Only the words of the path are looked
    /// at here; `open` lets the kernel walk the rest.
    ///
    /// - An absolute path lies in the root its words start in (the deepest, when roots nest).
    /// - A relative path whose first name is a root's name lies in that root (`notes/todo.txt`
    ///   is `todo.txt` in the root called `notes`), even when the first root has a directory of
    ///   that name: a root's name always wins.
    /// - Any other relative path lies in the first root (`todo.txt`).
    pub fn locate(&self, path: &str) -> Result<Beneath<'_>, ToolError> {
        let p = Path::new(path);
        if !p.is_absolute() {
            return self.locate_relative(p);
        }
        let root = self
            .0
            .iter()
            .filter(|r| p.starts_with(&r.path))
            .max_by_key(|r| r.path.components().count())
            .ok_or_else(|| {
                ToolError::Refused(format!(
                    "{path} is not in any workspace root{}",
                    self.list()
                ))
            })?;
        let rest = p
            .strip_prefix(&root.path)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Ok(Beneath { root, rest })
    }

    /// The labels of the object `fd` refers to, opened beneath `start` (which contains it): the
    /// join of every root whose directory is the object or one of its ancestors, as the kernel
    /// resolved it (the descriptor's path in `/proc/self/fd`, against each root's own). A
    /// non-directory with more than one name may also be named from any root on its file
    /// system, whose names cannot be found without a scan: it takes all of those roots' labels.
    pub fn labels(&self, start: &Root, fd: &OwnedFd) -> Result<Reached, ToolError> {
        let at = fd_path(fd)?;
        let st = nix::sys::stat::fstat(fd.as_raw_fd())
            .map_err(|e| ToolError::Failed(format!("{}: {}", at.display(), e.desc())))?;
        let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
        let mut labels = Reached::of(start);
        for root in &self.0 {
            let Ok(rfd) = open_root(root) else {
                // A root that is not there contains nothing.
                continue;
            };
            let contains = match fd_path(&rfd) {
                Ok(rpath) => at.starts_with(&rpath),
                Err(_) => false,
            };
            let linked = !is_dir
                && st.st_nlink > 1
                && nix::sys::stat::fstat(rfd.as_raw_fd()).is_ok_and(|r| r.st_dev == st.st_dev);
            if contains || linked {
                labels = labels.join(root);
            }
        }
        Ok(labels)
    }

    fn locate_relative(&self, p: &Path) -> Result<Beneath<'_>, ToolError> {
        let first = p.components().next();
        let named = match first {
            Some(Component::Normal(word)) => self.0.iter().find(|r| word == OsStr::new(r.name())),
            _ => None,
        };
        let (root, rest) = match (named, self.0.first()) {
            (Some(root), _) => (root, p.components().skip(1).collect::<PathBuf>()),
            (None, Some(first)) => (first, p.to_path_buf()),
            (None, None) => {
                return Err(ToolError::Refused(format!(
                    "{} is not in any workspace root{}",
                    p.display(),
                    self.list()
                )));
            }
        };
        Ok(Beneath { root, rest })
    }

    fn list(&self) -> String {
        if self.0.is_empty() {
            return " (no workspace root is configured)".to_string();
        }
        let names: Vec<String> = self
            .0
            .iter()
            .map(|r| format!("{} ({})", r.name(), r.path.display()))
            .collect();
        format!(" (the roots are {})", names.join(", "))
    }
}

impl Beneath<'_> {
    /// The labels of what the kernel's walk of this path reaches: the object itself, or, when
    /// the walk fails (a missing name, a file used as a directory, a step out of the root), the
    /// deepest object it did reach on the way. A walk that ran against a root's files tells what
    /// is there even when it fails, so it is labelled like a read of that place.
    pub fn reached(&self, roots: &Roots, rest: &Path) -> Reached {
        let Ok(root) = open_root(self.root) else {
            return Reached::of(self.root);
        };
        let mut prefix: Vec<Component<'_>> = rest.components().collect();
        loop {
            let p: PathBuf = prefix.iter().collect();
            let p: &Path = if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                &p
            };
            if let Ok(fd) = open_beneath(&root, p, OFlag::O_PATH, Mode::empty()) {
                return roots
                    .labels(self.root, &fd)
                    .unwrap_or_else(|_| Reached::of(self.root));
            }
            if prefix.pop().is_none() {
                return Reached::of(self.root);
            }
        }
    }

    /// The labels of the whole path, as [`Beneath::reached`] finds them.
    pub fn labels(&self, roots: &Roots) -> Reached {
        self.reached(roots, &self.rest)
    }

    /// The labels of the directory the path's last component lies in.
    pub fn parent_labels(&self, roots: &Roots) -> Reached {
        self.reached(roots, self.rest.parent().unwrap_or(Path::new("")))
    }

    /// Open the path beneath its root with `flags`; `mode` for a file `O_CREAT` makes.
    pub fn open(&self, shown: &str, flags: OFlag, mode: Mode) -> Result<OwnedFd, ToolError> {
        let root = open_root(self.root)?;
        let rest: &Path = if self.rest.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &self.rest
        };
        open_beneath(&root, rest, flags, mode).map_err(|e| beneath_error(shown, self.root, e))
    }

    /// The directory the path's last component lies in, opened beneath the root, and that
    /// component: for a write, which creates its file beside the target and renames it in.
    pub fn open_parent(&self, shown: &str) -> Result<(OwnedFd, &OsStr), ToolError> {
        let name = match self.rest.components().next_back() {
            Some(Component::Normal(name)) => name,
            _ => {
                return Err(ToolError::Refused(format!(
                    "{shown} does not name a file inside {}",
                    self.root.path.display()
                )));
            }
        };
        let parent = self.rest.parent().unwrap_or(Path::new(""));
        let parent: &Path = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        let root = open_root(self.root)?;
        let dir = open_beneath(
            &root,
            parent,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map_err(|e| beneath_error(shown, self.root, e))?;
        Ok((dir, name))
    }
}

/// Where the kernel says `fd` is: its path as `/proc/self/fd` shows it. An object whose name
/// was removed since it was opened has no place, and is refused.
fn fd_path(fd: &OwnedFd) -> Result<PathBuf, ToolError> {
    let link = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let at = std::fs::read_link(&link).map_err(|e| {
        ToolError::Failed(format!(
            "where an opened file lies cannot be found ({}: {e}); /proc must be mounted",
            link.display()
        ))
    })?;
    if !at.is_absolute() || at.as_os_str().as_encoded_bytes().ends_with(b" (deleted)") {
        return Err(ToolError::Failed(format!(
            "{} was removed while it was opened",
            at.display()
        )));
    }
    Ok(at)
}

fn open_root(root: &Root) -> Result<OwnedFd, ToolError> {
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
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2` beneath `dir`: `..` out, absolute symlinks, relative symlinks out and magic links are
/// refused by the kernel (`EXDEV`, `ELOOP`). Where `openat2` is refused with `ENOSYS` (systemd's
/// `RestrictSUIDSGID=` does that to the whole unit, since its mode cannot be filtered), the same
/// walk is done one component at a time by [`walk_beneath`].
pub fn open_beneath(
    dir: &OwnedFd,
    rest: &Path,
    flags: OFlag,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match openat2(dir.as_raw_fd(), rest, how) {
        // SAFETY: `openat2` returned a new descriptor that nothing else owns.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(Errno::ENOSYS) => walk_beneath(dir, rest, flags, mode),
        Err(e) => Err(e),
    }
}

/// The most symlinks one walk follows, as the kernel's own limit.
const MAX_LINKS: usize = 40;

/// What `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` does, done with `openat` one component
/// at a time: every directory on the way is opened `O_NOFOLLOW` and kept on a stack, so `..` goes
/// back to the directory the walk came from and past `dir` is `EXDEV`; a symlink is read and its
/// target walked in its place (absolute: `EXDEV`; more than 40: `ELOOP`); only the last component
/// is opened with `flags` (and `O_NOFOLLOW`, so nothing is created through a symlink). Last, the
/// object's own path must lie beneath `dir`'s, which a rename racing the walk cannot defeat.
pub fn walk_beneath(
    dir: &OwnedFd,
    rest: &Path,
    flags: OFlag,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStrExt;

    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|_| Errno::EMFILE);
    // The path's names as the kernel reads them (`Path::components` would drop a `.` and a
    // trailing `/`, both of which ask for a directory): a trailing `/` walks on to `.`.
    let components = |p: &Path| -> Result<Vec<OsString>, Errno> {
        let bytes = p.as_os_str().as_bytes();
        if bytes.starts_with(b"/") {
            return Err(Errno::EXDEV);
        }
        let mut names: Vec<OsString> = bytes
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .map(|c| OsStr::from_bytes(c).to_os_string())
            .collect();
        if bytes.ends_with(b"/") {
            names.push(OsString::from("."));
        }
        Ok(names)
    };
    let mut stack: Vec<OwnedFd> = vec![dup(dir)?];
    let mut todo: VecDeque<OsString> = components(rest)?.into();
    let mut links = 0;
    let last_flags = flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    let opened = loop {
        let Some(name) = todo.pop_front() else {
            // The path ended at a directory on the stack (empty, `.`, or `..`).
            let top = stack.last().ok_or(Errno::EXDEV)?;
            break openat_fd(top, Path::new("."), flags | OFlag::O_CLOEXEC, mode)?;
        };
        match name.as_bytes() {
            b"." => continue,
            b".." => {
                if stack.len() == 1 {
                    return Err(Errno::EXDEV);
                }
                stack.pop();
                continue;
            }
            _ => {}
        }
        let top = stack.last().ok_or(Errno::EXDEV)?;
        let last = todo.is_empty();
        let st = nix::sys::stat::fstatat(
            Some(top.as_raw_fd()),
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        let is_link = st.as_ref().is_ok_and(|st| {
            SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK
        });
        if is_link {
            if last && flags.contains(OFlag::O_CREAT | OFlag::O_EXCL) {
                return Err(Errno::EEXIST);
            }
            if last && flags.contains(OFlag::O_NOFOLLOW) {
                return Err(Errno::ELOOP);
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(Errno::ELOOP);
            }
            let target = nix::fcntl::readlinkat(Some(top.as_raw_fd()), name.as_os_str())?;
            for c in components(Path::new(&target))?.into_iter().rev() {
                todo.push_front(c);
            }
            continue;
        }
        match st {
            Err(Errno::ENOENT) if last => {}
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let name = Path::new(&name);
        if last {
            break openat_fd(top, name, last_flags, mode)?;
        }
        let next = openat_fd(
            top,
            name,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        stack.push(next);
    };
    let beneath = |fd: &OwnedFd| {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|_| Errno::ENOENT)
    };
    if !beneath(&opened)?.starts_with(beneath(dir)?) {
        return Err(Errno::EXDEV);
    }
    Ok(opened)
}

fn openat_fd(dir: &OwnedFd, name: &Path, flags: OFlag, mode: Mode) -> Result<OwnedFd, Errno> {
    let fd = nix::fcntl::openat(Some(dir.as_raw_fd()), name, flags, mode)?;
    // SAFETY: `openat` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn beneath_error(shown: &str, root: &Root, e: Errno) -> ToolError {
    match e {
        Errno::EXDEV | Errno::ELOOP => ToolError::Refused(format!(
            "{shown} leads out of the workspace root {} (through `..` or a symlink); \
             only paths that stay inside a root are allowed",
            root.path.display()
        )),
        Errno::ENOENT => ToolError::Failed(format!("{shown} does not exist")),
        Errno::ENOTDIR => {
            ToolError::Failed(format!("{shown}: a part of the path is not a directory"))
        }
        Errno::EISDIR => ToolError::Failed(format!("{shown} is a directory")),
        Errno::EACCES | Errno::EPERM => ToolError::Failed(format!("{shown}: permission denied")),
        Errno::ENOSYS => ToolError::Failed(
            "this kernel has no openat2 (Linux 5.6 or later is needed), so no workspace path \
             can be opened safely"
                .to_string(),
        ),
        other => ToolError::Failed(format!("{shown}: {}", other.desc())),
    }
}
