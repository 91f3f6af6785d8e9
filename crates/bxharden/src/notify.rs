//! Readiness for systemd (`Type=notify`): `READY=1` once every socket is served, `STOPPING=1` when
//! shutting down. Without `NOTIFY_SOCKET` (started by hand, by a test) both do nothing.
//!
//! The datagram socket is connected once, by [`prepare`] (which `apply` calls before the
//! sandbox closes): an abstract `NOTIFY_SOCKET` would be out of reach after Landlock's scoping, and
//! `socket`/`connect` need not stay on the seccomp list for it.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;

static SOCKET: OnceLock<Option<UnixDatagram>> = OnceLock::new();

/// Connect to `NOTIFY_SOCKET` now, if it is set. A second call changes nothing.
pub fn prepare() -> io::Result<()> {
    if SOCKET.get().is_some() {
        return Ok(());
    }
    let sock = connect()?;
    let _ = SOCKET.set(sock);
    Ok(())
}

fn connect() -> io::Result<Option<UnixDatagram>> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(None);
    };
    let target = target.to_string_lossy().into_owned();
    let addr = match target.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None if target.starts_with('/') => SocketAddr::from_pathname(&target)?,
        None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("NOTIFY_SOCKET={target} is neither a path nor an abstract name"),
            ));
        }
    };
    let sock = UnixDatagram::unbound()?;
    sock.connect_addr(&addr)?;
    Ok(Some(sock))
}

/// Tell systemd the daemon is ready: every socket is listening and the sandbox is applied.
/// `Ok(false)`: no `NOTIFY_SOCKET`, nothing sent.
pub fn ready() -> io::Result<bool> {
    send("READY=1\n")
}

/// Tell systemd the daemon is stopping.
pub fn stopping() -> io::Result<bool> {
    send("STOPPING=1\n")
}

/// Send one notification: `Ok(false)` when `NOTIFY_SOCKET` is not set, `Ok(true)` when sent.
pub fn send(state: &str) -> io::Result<bool> {
    prepare()?;
    match SOCKET.get() {
        Some(Some(sock)) => {
            sock.send(state.as_bytes())?;
            Ok(true)
        }
        _ => Ok(false),
    }
}
