//! Listening sockets: the descriptors systemd hands over (socket activation), or, off the
//! device, a socket bound here with the modes the design fixes (directory 0700, socket 0600).

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::sys::socket::{SockType, getsockopt, sockopt};
use nix::sys::stat::{Mode, umask};
use nix::unistd::{Gid, Uid, chown};

use bxcore::runbook::Anchored;

use crate::dirs::DirError;
use crate::identity::Owner;
use crate::threads;

/// The runbook anchor of every error here.
pub const LISTEN_ANCHOR: &str = "socket-listen-failed";

/// Why a socket could not be listened on. Nothing was removed or changed but what is said. Its
/// runbook entry is [`LISTEN_ANCHOR`].
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The socket path has no parent directory or no file name.
    #[error("{}: not a socket path in a directory", .0.display())]
    BadPath(PathBuf),
    /// Something that is not a socket is at the socket's path: never removed.
    #[error(
        "{}: {} is in the socket's place, and only a stale socket is ever removed",
        .0.display(),
        .1
    )]
    NotASocket(PathBuf, &'static str),
    /// The directory is not a directory (a symlink, a file).
    #[error(
        "{}: the socket's directory is not a directory (a symlink or a file)",
        .0.display()
    )]
    NotADirectory(PathBuf),
    /// The directory belongs to another user, and this process cannot take it.
    #[error(
        "{}: the socket's directory belongs to uid {}, not to this daemon",
        .0.display(),
        .1
    )]
    ForeignDirectory(PathBuf, u32),
    /// A live daemon answers on the socket already.
    #[error("{}: another process is serving this socket", .0.display())]
    InUse(PathBuf),
    /// The bound socket did not come out 0600.
    #[error("{}: the socket came out {:04o}, not 0600", .0.display(), .1)]
    Mode(PathBuf, u32),
    /// A system call failed.
    #[error("{}: cannot {}: {}", .0.display(), .1, .2)]
    Io(PathBuf, &'static str, #[source] io::Error),
}

impl Anchored for ListenError {
    fn anchor(&self) -> &str {
        LISTEN_ANCHOR
    }
}

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> ListenError + 'a {
    move |e| ListenError::Io(path.to_owned(), what, e)
}

fn nix_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(nix::Error) -> ListenError + 'a {
    move |e| ListenError::Io(path.to_owned(), what, io::Error::from(e))
}

/// Bind a Unix stream socket at `path`, the fallback when systemd hands nothing over.
///
/// The directory is made 0700 (missing parents 0711: traversable, not listable) and kept so (a
/// wider one is tightened); a stale socket is removed, but a regular file, a directory, a symlink
/// or a socket someone still serves are errors; the bind runs under umask 0177 and the socket is
/// checked to be 0600. With `owner` (root, before the drop) the directory and the socket are
/// given to it. The umask is process-wide: call this before any thread exists.
pub fn listen(path: &Path, owner: Option<Owner>) -> Result<UnixListener, ListenError> {
    let dir = match (path.parent(), path.file_name()) {
        (Some(d), Some(_)) if !d.as_os_str().is_empty() => d,
        _ => return Err(ListenError::BadPath(path.to_owned())),
    };
    prepare_dir(dir, owner)?;
    remove_stale(path)?;

    let old = umask(Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    umask(old);
    let listener = bound.map_err(io_err(path, "bind"))?;

    let mode = fs::symlink_metadata(path)
        .map_err(io_err(path, "read the socket's mode"))?
        .mode()
        & 0o7777;
    if mode != 0o600 {
        let _ = fs::remove_file(path);
        return Err(ListenError::Mode(path.to_owned(), mode));
    }
    if let Some(o) = owner {
        chown(path, Some(Uid::from_raw(o.uid)), Some(Gid::from_raw(o.gid)))
            .map_err(nix_err(path, "give the socket to its owner"))?;
    }
    Ok(listener)
}

/// The socket's directory is the daemon's own, by the same rules as its state directory.
fn prepare_dir(dir: &Path, owner: Option<Owner>) -> Result<(), ListenError> {
    crate::dirs::own_dir(dir, owner).map_err(|e| match e {
        DirError::NotADirectory(p) => ListenError::NotADirectory(p),
        DirError::Foreign { path, uid, .. } => ListenError::ForeignDirectory(path, uid),
        DirError::Io { path, what, error } => ListenError::Io(path, what, error),
    })
}

fn remove_stale(path: &Path) -> Result<(), ListenError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ListenError::Io(path.to_owned(), "look at the path", e)),
    };
    let ft = meta.file_type();
    let what = if ft.is_socket() {
        None
    } else if ft.is_symlink() {
        Some("a symlink")
    } else if ft.is_dir() {
        Some("a directory")
    } else if ft.is_file() {
        Some("a regular file")
    } else {
        Some("a special file")
    };
    if let Some(what) = what {
        return Err(ListenError::NotASocket(path.to_owned(), what));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(ListenError::InUse(path.to_owned()));
    }
    fs::remove_file(path).map_err(io_err(path, "remove the stale socket"))
}

/// The listening sockets systemd handed over, by their names (`FileDescriptorName=`).
#[derive(Debug, Default)]
pub struct Activated {
    sockets: Vec<(String, UnixListener)>,
}

impl Activated {
    /// Take the socket named `name`, if systemd handed one over.
    pub fn take(&mut self, name: &str) -> Option<UnixListener> {
        let at = self.sockets.iter().position(|(n, _)| n == name)?;
        Some(self.sockets.remove(at).1)
    }

    /// The names not taken yet.
    pub fn names(&self) -> Vec<&str> {
        self.sockets.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Whether nothing (left) was handed over.
    pub fn is_empty(&self) -> bool {
        self.sockets.is_empty()
    }
}

/// Why the handed-over descriptors could not be taken. Its runbook entry is [`LISTEN_ANCHOR`].
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    /// `LISTEN_FDS` or `LISTEN_PID` is not a number.
    #[error("{0}={1:?} is not a number")]
    BadEnv(&'static str, String),
    /// `LISTEN_FDNAMES` names a different number of descriptors than `LISTEN_FDS`.
    #[error("LISTEN_FDS says {0} descriptors but LISTEN_FDNAMES names {1}")]
    Names(usize, usize),
    /// A handed-over descriptor is not a listening Unix stream socket.
    #[error("descriptor {0} handed over is not a listening Unix stream socket: {1}")]
    NotAListener(i32, String),
    /// Called while other threads exist: the environment cannot be cleared safely.
    #[error("cannot take the handed-over sockets: {0}")]
    Threads(String),
}

impl Anchored for ActivationError {
    fn anchor(&self) -> &str {
        LISTEN_ANCHOR
    }
}

const SD_LISTEN_FDS_START: i32 = 3;

/// The listening sockets systemd handed over (`LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES`),
/// by name, each checked to be a listening Unix stream socket and made close-on-exec. The three
/// variables are removed from the environment afterwards, so no child inherits them. When
/// `LISTEN_PID` is not this process, nothing was handed to it: empty. Call it in `main` before
/// any thread exists.
pub fn activated() -> Result<Activated, ActivationError> {
    threads::alone().map_err(ActivationError::Threads)?;
    let result = take_fds();
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        // SAFETY: no other thread exists (checked above), so nothing reads the environment
        // while it changes.
        unsafe { std::env::remove_var(var) };
    }
    result
}

fn take_fds() -> Result<Activated, ActivationError> {
    let Ok(pid) = std::env::var("LISTEN_PID") else {
        return Ok(Activated::default());
    };
    let pid: u32 = pid
        .trim()
        .parse()
        .map_err(|_| ActivationError::BadEnv("LISTEN_PID", pid.clone()))?;
    if pid != std::process::id() {
        return Ok(Activated::default());
    }
    let fds = std::env::var("LISTEN_FDS").unwrap_or_default();
    let n: usize = fds
        .trim()
        .parse()
        .map_err(|_| ActivationError::BadEnv("LISTEN_FDS", fds.clone()))?;
    let names: Vec<String> = match std::env::var("LISTEN_FDNAMES") {
        Ok(v) if !v.is_empty() => v.split(':').map(str::to_owned).collect(),
        _ => vec!["unknown".to_owned(); n],
    };
    if names.len() != n {
        return Err(ActivationError::Names(n, names.len()));
    }
    let mut sockets = Vec::with_capacity(n);
    for (i, name) in names.into_iter().enumerate() {
        let fd = SD_LISTEN_FDS_START + i as i32;
        // SAFETY: systemd hands descriptors 3.. over to this process, which owns them from now;
        // nothing else in the process uses them (they are taken once: the variables go next).
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        check_listener(&owned).map_err(|why| ActivationError::NotAListener(fd, why))?;
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|e| ActivationError::NotAListener(fd, e.to_string()))?;
        sockets.push((name, UnixListener::from(owned)));
    }
    Ok(Activated { sockets })
}

fn check_listener(fd: &OwnedFd) -> Result<(), String> {
    let fd = fd.as_fd();
    let ty = getsockopt(&fd, sockopt::SockType).map_err(|e| e.to_string())?;
    if ty != SockType::Stream {
        return Err(format!("its type is {ty:?}"));
    }
    let listening = getsockopt(&fd, sockopt::AcceptConn).map_err(|e| e.to_string())?;
    if !listening {
        return Err("it is not listening".to_owned());
    }
    let addr: nix::sys::socket::SockaddrStorage =
        nix::sys::socket::getsockname(fd.as_raw_fd()).map_err(|e| e.to_string())?;
    if addr.as_unix_addr().is_none() {
        return Err("it is not a Unix socket".to_owned());
    }
    Ok(())
}

/// The socket `name` systemd handed over, else one bound by [`listen`] at `path`.
pub fn socket_for(
    activated: &mut Activated,
    name: &str,
    path: &Path,
    owner: Option<Owner>,
) -> Result<UnixListener, ListenError> {
    match activated.take(name) {
        Some(l) => Ok(l),
        None => listen(path, owner),
    }
}
