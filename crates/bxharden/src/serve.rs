//! The one connection path every daemon's sockets use: one accept thread per socket, a thread
//! per connection, the peer checked before a byte is read, one request per connection read
//! through a deadline, `ping` answered here, malformed frames answered here, and the
//! `forbidden` answer for a kind a socket does not take.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bxcore::deadline::Deadline;
use bxcore::{Envelope, ErrorCode, FrameError, Message, PROTOCOL_VERSION, Pong, read_frame};

use crate::log::daemon;
use crate::peers::PeerPolicy;

/// The runbook anchor of the accept thread's lines.
pub const LISTENER_ANCHOR: &str = "listener-lost";
/// The runbook anchor of a refused peer.
pub const PEER_REFUSED_ANCHOR: &str = "socket-peer-refused";
/// The runbook anchor of a refused message kind.
pub const FORBIDDEN_ANCHOR: &str = "socket-forbidden";

/// How long a peer has to send its whole first frame, and to take each frame written to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `first_frame_ms`: the first frame must be complete within this.
    pub first_frame_ms: u64,
    /// `write_ms`: each frame written must be taken within this.
    pub write_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            first_frame_ms: 10_000,
            write_ms: 30_000,
        }
    }
}

static TIMEOUTS: OnceLock<Timeouts> = OnceLock::new();

/// Set the daemon's timeouts, once, before serving (a daemon whose configuration has them).
/// `false`: they were set (or used) already and stay as they were.
pub fn set_timeouts(t: Timeouts) -> bool {
    TIMEOUTS.set(t).is_ok()
}

/// The timeouts in force: those set by [`set_timeouts`], else the defaults (10 s, 30 s).
pub fn timeouts() -> Timeouts {
    *TIMEOUTS.get_or_init(Timeouts::default)
}

/// Errors `accept` returns while the listener is fine: out of descriptors or memory for now, or
/// a connection that went away before it was taken.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::EPROTO
                | libc::EPERM
                | libc::ECONNABORTED
                | libc::EINTR
                | libc::EAGAIN
        )
    ) || e.kind() == io::ErrorKind::Interrupted
}

/// Serve `listener` on a thread named `thread_name`: each connection's peer is checked against
/// `policy` (a refused peer gets `error forbidden`, id 0, and one `socket-peer-refused` line),
/// then `handler` runs on a thread of its own with the stream (its write timeout set).
///
/// A transient accept error (out of descriptors, ...) is logged once per episode with the
/// `listener-lost` pointer and retried every 200 ms. Any other accept error means the listening
/// socket is gone: the line is logged and the process exits with status 1, so the service
/// manager restarts it rather than leave a daemon that answers nobody.
pub fn accept_loop<H>(
    listener: UnixListener,
    socket: &str,
    thread_name: &str,
    policy: PeerPolicy,
    handler: H,
) -> io::Result<JoinHandle<()>>
where
    H: Fn(UnixStream) + Send + Sync + 'static,
{
    let socket = socket.to_owned();
    let name = thread_name.to_owned();
    let handler = Arc::new(handler);
    thread::Builder::new()
        .name(thread_name.to_owned())
        .spawn(move || {
            let mut failing = false;
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if failing {
                            failing = false;
                            crate::log::notice(&format!("accepting on {name} again"));
                        }
                        serve_one(stream, &socket, &policy, &handler);
                    }
                    Err(e) if transient(&e) => {
                        if e.raw_os_error() == Some(libc::ECONNABORTED)
                            || e.kind() == io::ErrorKind::Interrupted
                        {
                            continue;
                        }
                        if !failing {
                            failing = true;
                            crate::runbook!(
                                LISTENER_ANCHOR,
                                "cannot accept on {name} for now, retrying: {e}"
                            );
                        }
                        thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => {
                        crate::runbook!(
                            LISTENER_ANCHOR,
                            "cannot accept on {name}, the listening socket {socket} is gone: {e}; stopping"
                        );
                        std::process::exit(1);
                    }
                }
            }
        })
}

fn serve_one<H>(mut stream: UnixStream, socket: &str, policy: &PeerPolicy, handler: &Arc<H>)
where
    H: Fn(UnixStream) + Send + Sync + 'static,
{
    let t = timeouts();
    let _ = stream.set_write_timeout(Some(Duration::from_millis(t.write_ms.max(1))));
    match policy.check(&stream) {
        Ok(_) => {}
        Err(uid) => {
            let uid = uid.map_or_else(|| "unknown".to_owned(), |u| u.to_string());
            crate::runbook!(
                PEER_REFUSED_ANCHOR,
                "refused a connection from uid {uid} on {socket}"
            );
            let _ = bxcore::write_frame(
                &mut stream,
                &Envelope::error(
                    0,
                    ErrorCode::Forbidden,
                    format!("uid {uid} may not connect to {socket}"),
                ),
            );
            return;
        }
    }
    let handler = Arc::clone(handler);
    let spawned = thread::Builder::new()
        .name("conn".to_owned())
        .spawn(move || handler(stream));
    if let Err(e) = spawned {
        // The stream went into the closure and is closed with it; the peer sees the close.
        crate::runbook!(
            LISTENER_ANCHOR,
            "cannot start a thread for a connection on {socket}, it is closed: {e}"
        );
    }
}

/// Read the connection's one request: its whole first frame within `first_frame_ms`.
///
/// - `ping` is answered here (`pong {daemon, version, protocol}`, never logged): `None`.
/// - A malformed frame, a silent or trickling peer: answered here with an `error` frame, id 0,
///   code [`FrameError::code`]: `None`.
/// - The peer closed before sending anything: `None`, silently.
/// - Otherwise the envelope, for the daemon to answer (with [`send`], or [`forbid`]).
pub fn read_request(stream: &mut UnixStream) -> Option<Envelope> {
    let t = timeouts();
    let _ = stream.set_write_timeout(Some(Duration::from_millis(t.write_ms.max(1))));
    let read = match Deadline::within(stream, Duration::from_millis(t.first_frame_ms)) {
        Some(mut deadline) => read_frame(&mut deadline),
        None => Err(FrameError::Io(io::Error::from(io::ErrorKind::TimedOut))),
    };
    match read {
        Ok(Envelope {
            id,
            msg: Message::Ping {},
            ..
        }) => {
            send(stream, id, true, pong());
            None
        }
        Ok(env) => Some(env),
        Err(FrameError::Closed) => None,
        Err(e) => {
            let detail = if e.is_timeout() {
                format!("no whole frame within {} ms", t.first_frame_ms)
            } else {
                e.to_string()
            };
            let _ = bxcore::write_frame(stream, &Envelope::error(0, e.code(), detail));
            None
        }
    }
}

/// This daemon's `pong`: its name, its version, the protocol it speaks.
pub fn pong() -> Message {
    let d = daemon();
    Message::Pong(Pong {
        daemon: d.name.to_owned(),
        version: d.version.to_owned(),
        protocol: PROTOCOL_VERSION,
    })
}

/// Send one frame. `false`: the peer went away (or did not take it within `write_ms`): stop
/// sending and finish the work quietly.
pub fn send(stream: &mut UnixStream, id: u64, last: bool, msg: Message) -> bool {
    bxcore::write_frame(stream, &Envelope::new(id, last, msg)).is_ok()
}

/// Refuse a kind `socket` does not accept: log `{daemon}: refused the message kind {kind} on
/// {socket}` with the `socket-forbidden` pointer, and answer `error forbidden` "`{kind} is not
/// accepted on {socket}`".
pub fn forbid(stream: &mut UnixStream, id: u64, msg: &Message, socket: &str) {
    let kind = msg.kind();
    crate::runbook!(
        FORBIDDEN_ANCHOR,
        "refused the message kind {kind} on {socket}"
    );
    let _ = bxcore::write_frame(
        stream,
        &Envelope::error(
            id,
            ErrorCode::Forbidden,
            format!("{kind} is not accepted on {socket}"),
        ),
    );
}
