//! The one connection path every socket of every daemon uses: one accept thread per socket, a
//! thread per connection (a small stack), the peer checked before a byte is read, a cap on the
//! connections a socket serves at once (a new one over it is answered `unavailable` and closed),
//! one request per connection read through a deadline and within the daemon's frame budget,
//! `ping` answered here, malformed frames answered here, and the socket's dispatch table
//! (`bxcore::layout`) checked here: a handler sees only a kind its socket accepts.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bxcore::deadline::Deadline;
use bxcore::layout::{SocketSpec, WrongKind};
use bxcore::{Envelope, ErrorCode, FrameError, Message, PROTOCOL_VERSION, Pong};

use crate::log::daemon;
use crate::peers::PeerPolicy;

/// The runbook anchor of the accept thread's lines.
pub const LISTENER_ANCHOR: &str = "listener-lost";
/// The runbook anchor of a refused peer.
pub const PEER_REFUSED_ANCHOR: &str = "socket-peer-refused";
/// The runbook anchor of a refused message kind.
pub const FORBIDDEN_ANCHOR: &str = "socket-forbidden";
/// The runbook anchor of a socket at its connection cap, or frames over the frame budget.
pub const BUSY_ANCHOR: &str = "socket-busy";

/// The stack of each connection's thread: a tenth of std's 2 MiB default, ample for one request
/// (serde's recursion is bounded at 128 levels), so a socket at its cap costs little.
pub const CONNECTION_STACK: usize = 512 * 1024;
/// The default frame budget (`[serve] frame_budget`), until the start-up sets the configured one.
pub use crate::config::DEFAULT_FRAME_BUDGET;
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

/// The frame budget: how many bytes of frame bodies may be held by reads under way at once.
#[derive(Debug)]
struct Budget {
    cap: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// Set the daemon's frame budget, once, before serving. It is raised to one whole frame
/// (`MAX_FRAME`) when smaller, so any frame can be read. `false`: it was set (or used) already.
///
/// It also fixes how the heap takes big buffers, so that memory a frame used goes back to the
/// system once the frame is done: glibc maps every allocation of 128 KiB and more on its own and
/// unmaps it when freed (by default the threshold rises with the first such free, after which
/// frame-sized buffers stay in the heap), and keeps two arenas, not eight per core, so that a
/// thread per connection does not mean a heap per thread.
pub fn set_frame_budget(bytes: usize) -> bool {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets glibc's allocator parameters; it takes plain integers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    BUDGET
        .set(Budget {
            cap: bytes.max(bxcore::MAX_FRAME),
            used: Mutex::new(0),
            freed: Condvar::new(),
        })
        .is_ok()
}

fn budget() -> &'static Budget {
    BUDGET.get_or_init(|| Budget {
        cap: DEFAULT_FRAME_BUDGET,
        used: Mutex::new(0),
        freed: Condvar::new(),
    })
}

/// The frame budget in force, in bytes.
pub fn frame_budget() -> usize {
    budget().cap
}

/// `n` bytes of the budget, given back when dropped.
struct Reserved(usize);

impl Budget {
    /// Wait until `n` bytes are free, or `until` passes (`None`).
    fn reserve(&'static self, n: usize, until: Instant) -> Option<Reserved> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if *used + n <= self.cap {
                *used += n;
                return Some(Reserved(n));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            used = self
                .freed
                .wait_timeout(used, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let b = budget();
        let mut used = b.used.lock().unwrap_or_else(|p| p.into_inner());
        *used -= self.0;
        b.freed.notify_all();
    }
}

/// One socket to serve: its listener, what it is (its name and dispatch table), who may connect,
/// and how many connections it serves at once.
#[derive(Debug)]
pub struct Socket {
    pub listener: UnixListener,
    pub spec: SocketSpec,
    pub policy: PeerPolicy,
    pub max_connections: usize,
}

impl Socket {
    /// `listener` serving `spec` for `policy`, capped at `max_connections` (at least 1).
    pub fn new(
        listener: UnixListener,
        spec: SocketSpec,
        policy: PeerPolicy,
        max_connections: usize,
    ) -> Socket {
        Socket {
            listener,
            spec,
            policy,
            max_connections: max_connections.max(1),
        }
    }
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

/// Serve `socket` on a thread of its own named `accept-<name>` (see [`accept_here`]). Any accept
/// error that is not transient means the listening socket is gone: the line is logged and the
/// process exits with status 1, so the service manager restarts it rather than leave a daemon
/// that answers nobody.
pub fn accept_loop<H>(socket: Socket, handler: H) -> io::Result<JoinHandle<()>>
where
    H: Fn(UnixStream, Envelope) + Send + Sync + 'static,
{
    thread::Builder::new()
        .name(format!("accept-{}", socket.spec.name))
        .spawn(move || {
            let file = socket.spec.file();
            let e = accept_here(socket, handler);
            crate::runbook!(
                LISTENER_ANCHOR,
                "cannot accept on {file}, the listening socket is gone: {e}; stopping"
            );
            std::process::exit(1);
        })
}

/// Serve `socket` on this thread until its listener fails for good; return that error.
///
/// Each connection: the peer is checked against the policy (a refused one gets `error forbidden`,
/// id 0, and one `socket-peer-refused` line); at the cap, it gets `error unavailable` naming the
/// `socket-busy` entry and is closed (one line per episode); otherwise it gets a thread with a
/// small stack, which reads its one request ([`read_request`]), answers `ping` and a kind the
/// table does not list, and hands the rest to `handler`.
///
/// A transient accept error (out of descriptors, ...) is logged once per episode with the
/// `listener-lost` pointer and retried every 200 ms.
pub fn accept_here<H>(socket: Socket, handler: H) -> io::Error
where
    H: Fn(UnixStream, Envelope) + Send + Sync + 'static,
{
    let Socket {
        listener,
        spec,
        policy,
        max_connections,
    } = socket;
    let file = spec.file();
    let handler = Arc::new(handler);
    let open = Arc::new(AtomicUsize::new(0));
    let mut failing = false;
    let mut full = false;
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
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
                        "cannot accept on {file} for now, retrying: {e}"
                    );
                }
                thread::sleep(Duration::from_millis(200));
                continue;
            }
            Err(e) => return e,
        };
        if failing {
            failing = false;
            crate::log::notice(&format!("accepting on {file} again"));
        }
        if let Err(uid) = policy.check(&stream) {
            refuse_peer(stream, &file, uid);
            continue;
        }
        if open.load(Ordering::Acquire) >= max_connections {
            if !full {
                full = true;
                crate::runbook!(
                    BUSY_ANCHOR,
                    "{file} is serving {max_connections} connections, its cap; new ones are answered unavailable"
                );
            }
            busy(
                stream,
                format!(
                    "{file} is serving {max_connections} connections, its cap; {}",
                    bxcore::runbook::pointer(BUSY_ANCHOR)
                ),
            );
            continue;
        }
        full = false;
        open.fetch_add(1, Ordering::AcqRel);
        let slot = Arc::new(Mutex::new(Some(stream)));
        let conn = Connection {
            open: Arc::clone(&open),
        };
        let taken = Arc::clone(&slot);
        let handler = Arc::clone(&handler);
        let spawned = thread::Builder::new()
            .name(format!("conn-{}", spec.name))
            .stack_size(CONNECTION_STACK)
            .spawn(move || {
                let _conn = conn;
                let stream = taken.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(stream) = stream {
                    serve_one(stream, &spec, &*handler);
                }
            });
        if let Err(e) = spawned {
            // The closure, and with it the count, is gone; the stream is still here.
            let stream = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            crate::runbook!(
                BUSY_ANCHOR,
                "cannot start a thread for a connection on {file}, it is answered unavailable: {e}"
            );
            if let Some(stream) = stream {
                busy(
                    stream,
                    format!(
                        "{file} cannot take a connection now; {}",
                        bxcore::runbook::pointer(BUSY_ANCHOR)
                    ),
                );
            }
        }
    }
}

/// A connection being served: one of its socket's count, given back when dropped.
struct Connection {
    open: Arc<AtomicUsize>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answer `error unavailable`, id 0, without ever blocking the accept thread, and close.
fn busy(mut stream: UnixStream, detail: String) {
    let _ = stream.set_nonblocking(true);
    let _ = bxcore::write_frame(
        &mut stream,
        &Envelope::error(0, ErrorCode::Unavailable, detail),
    );
}

/// A peer the socket's policy does not list: one line, `forbidden`, closed.
fn refuse_peer(mut stream: UnixStream, socket: &str, uid: Option<u32>) {
    let uid = uid.map_or_else(|| "unknown".to_owned(), |u| u.to_string());
    crate::runbook!(
        PEER_REFUSED_ANCHOR,
        "refused a connection from uid {uid} on {socket}"
    );
    let _ = stream.set_nonblocking(true);
    let _ = bxcore::write_frame(
        &mut stream,
        &Envelope::error(
            0,
            ErrorCode::Forbidden,
            format!("uid {uid} may not connect to {socket}"),
        ),
    );
}

/// One connection on its own thread: the request, checked against the table, to the handler.
fn serve_one<H>(mut stream: UnixStream, spec: &SocketSpec, handler: &H)
where
    H: Fn(UnixStream, Envelope),
{
    let Some(env) = read_request(&mut stream) else {
        return;
    };
    if !spec.accepts(env.msg.kind()) {
        wrong_kind(&mut stream, spec, env.id, &env.msg);
        return;
    }
    handler(stream, env);
}

/// Answer a kind the socket's table does not list, as the table says.
fn wrong_kind(stream: &mut UnixStream, spec: &SocketSpec, id: u64, msg: &Message) {
    match spec.wrong_kind {
        WrongKind::Forbidden => forbid(stream, id, msg, &spec.file()),
        WrongKind::BadMessage => {
            let takes = spec.accepts.join(" or ");
            let article = if takes.starts_with(['a', 'e', 'i', 'o', 'u']) {
                "an"
            } else {
                "a"
            };
            let _ = bxcore::write_frame(
                stream,
                &Envelope::error(
                    id,
                    ErrorCode::BadMessage,
                    format!(
                        "{} takes {article} {takes}, not {}",
                        spec.file(),
                        msg.kind()
                    ),
                ),
            );
        }
    }
}

/// Read the connection's one request: its whole first frame within `first_frame_ms`, its body
/// only once the frame budget has room for it (waiting within the same deadline).
///
/// - `ping` is answered here (`pong {daemon, version, protocol}`, never logged): `None`.
/// - A malformed frame, a silent or trickling peer: answered here with an `error` frame, id 0,
///   code [`FrameError::code`]: `None`.
/// - No room in the budget before the deadline: `error unavailable`, id 0: `None`.
/// - The peer closed before sending anything: `None`, silently.
/// - Otherwise the envelope, for the daemon to answer.
pub fn read_request(stream: &mut UnixStream) -> Option<Envelope> {
    let t = timeouts();
    let _ = stream.set_write_timeout(Some(Duration::from_millis(t.write_ms.max(1))));
    let read = match Deadline::within(stream, Duration::from_millis(t.first_frame_ms)) {
        Some(mut deadline) => bxcore::read_frame_len(&mut deadline).map(|n| {
            // The body's bytes are held only with the budget's leave.
            budget()
                .reserve(n, deadline.until())
                .map(|_reserved| bxcore::read_frame_body(&mut deadline, n))
        }),
        None => Err(FrameError::Io(io::Error::from(io::ErrorKind::TimedOut))),
    };
    let read = match read {
        Ok(Some(body)) => body,
        Ok(None) => {
            let detail = format!(
                "frames being read take the whole budget of {} bytes; {}",
                budget().cap,
                bxcore::runbook::pointer(BUSY_ANCHOR)
            );
            let _ =
                bxcore::write_frame(stream, &Envelope::error(0, ErrorCode::Unavailable, detail));
            return None;
        }
        Err(e) => Err(e),
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

/// Answer a kind the socket's table lists but its handler does not take: a fault of the daemon
/// (its table and its handler disagree), answered `internal`. The dispatch table test of each
/// daemon keeps this from happening.
pub fn unhandled(stream: &mut UnixStream, id: u64, msg: &Message) {
    let _ = bxcore::write_frame(
        stream,
        &Envelope::error(
            id,
            ErrorCode::Internal,
            format!("{} is in the socket's table but has no handler", msg.kind()),
        ),
    );
}
