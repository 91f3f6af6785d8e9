//! The one connection path every socket of every daemon uses: one accept thread per socket, a
//! thread per connection (a small stack), the peer checked before a byte is read, a cap on the
//! connections a socket serves at once (a new one over it is answered `unavailable` and closed),
//! one request per connection read through a deadline and within the socket's own frame budget,
//! `ping` answered here, malformed frames answered here, and the socket's dispatch table
//! (`bxcore::layout`) checked here: a handler is given its socket's [`Requests`] value, never a
//! kind its socket does not accept.
//!
//! Every bound is the socket's own ([`Limits`], from the daemon's `[serve]` table): no principal
//! can use up what another's socket serves with. A frame's body is reserved from its socket's
//! budget as its bytes arrive (a chunk at a time), so a peer that names a large frame and sends
//! nothing holds one chunk until its deadline, not the frame.

use std::io::{self, Read};
use std::marker::PhantomData;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bxcore::deadline::Deadline;
use bxcore::layout::{Requests, SocketSpec, WrongKind};
use bxcore::{Envelope, ErrorCode, FrameError, Message, PROTOCOL_VERSION, Pong};

use crate::log::daemon;
use crate::peers::PeerPolicy;

/// The runbook anchor of the accept thread's lines.
pub const LISTENER_ANCHOR: &str = "listener-lost";
/// The runbook anchor of a refused peer.
pub const PEER_REFUSED_ANCHOR: &str = "socket-peer-refused";
/// The runbook anchor of a refused message kind.
pub const FORBIDDEN_ANCHOR: &str = "socket-forbidden";
/// The runbook anchor of a socket at its connection cap, or frames over its frame budget.
pub const BUSY_ANCHOR: &str = "socket-busy";

/// The stack of each connection's thread: a tenth of std's 2 MiB default, ample for one request
/// (serde's recursion is bounded at 128 levels), so a socket at its cap costs little.
pub const CONNECTION_STACK: usize = 512 * 1024;

/// The most of a frame's body reserved from the budget before those bytes are read.
pub const CHUNK: usize = 64 * 1024;

/// How one socket serves: what `[serve]` says for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How many connections it serves at once (at least 1).
    pub max_connections: usize,
    /// A new connection's whole first frame must arrive within this.
    pub first_frame: Duration,
    /// Each frame written must be taken within this.
    pub write: Duration,
    /// The bytes of frame bodies being read at once on this socket (at least one whole frame).
    pub frame_budget: usize,
}

impl Limits {
    /// The socket's defaults: its own cap (`bxcore::layout`), 10 s, 30 s, four whole frames.
    pub fn of(spec: &SocketSpec) -> Limits {
        Limits {
            max_connections: spec.max_connections,
            first_frame: Duration::from_millis(10_000),
            write: Duration::from_millis(30_000),
            frame_budget: crate::config::DEFAULT_FRAME_BUDGET,
        }
    }
}

/// One socket's frame budget: how many bytes of frame bodies the reads under way hold at once.
///
/// A read holds its body's bytes a chunk at a time, as they arrive, so a peer that sends a length
/// and nothing more holds nothing. A read that needs a chunk the budget has no room for waits for
/// one, within its deadline, while some other read that holds bytes is still reading (it will
/// finish or fail, and give them back). When every other holder waits too, waiting would be a
/// deadlock: the read gives way instead (`unavailable`, and what it held goes back).
#[derive(Debug)]
struct Budget {
    cap: usize,
    state: Mutex<Use>,
    freed: Condvar,
}

/// What the reads under way hold.
#[derive(Debug, Default)]
struct Use {
    /// Bytes held.
    bytes: usize,
    /// Reads that hold some.
    holders: usize,
    /// Of those, the ones waiting for room.
    waiting: usize,
}

/// Why a read got no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoRoom {
    /// The deadline passed while it waited.
    Late,
    /// Every other read that holds bytes waits for room too.
    GaveWay,
}

impl Budget {
    fn new(cap: usize) -> Arc<Budget> {
        Arc::new(Budget {
            cap: cap.max(bxcore::MAX_FRAME),
            state: Mutex::new(Use::default()),
            freed: Condvar::new(),
        })
    }

    /// Add `n` bytes to `held`, waiting until the budget has room or `until` passes.
    fn take(&self, held: &mut usize, n: usize, until: Instant) -> Result<(), NoRoom> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if state.bytes + n <= self.cap {
                state.bytes += n;
                if *held == 0 {
                    state.holders += 1;
                }
                *held += n;
                return Ok(());
            }
            let holding = *held > 0;
            let reading = state.holders - state.waiting - usize::from(holding);
            if holding && reading == 0 {
                return Err(NoRoom::GaveWay);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NoRoom::Late);
            }
            state.waiting += usize::from(holding);
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            state.waiting -= usize::from(holding);
        }
    }

    /// Give back everything a read held (`n` bytes, 0 when it held none).
    fn give_back(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.bytes -= n;
        state.holders -= 1;
        self.freed.notify_all();
    }
}

/// What one read holds of its socket's budget, given back when dropped.
struct Held<'a> {
    budget: &'a Budget,
    n: usize,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.budget.give_back(self.n);
    }
}

/// One socket to serve: its listener, who may connect, its limits, and the requests it takes
/// (`R`, which names its spec).
#[derive(Debug)]
pub struct Socket<R> {
    pub listener: UnixListener,
    pub policy: PeerPolicy,
    pub limits: Limits,
    budget: Arc<Budget>,
    requests: PhantomData<fn() -> R>,
}

impl<R: Requests> Socket<R> {
    /// `listener` serving `R`'s socket for `policy`, bounded by `limits`.
    pub fn new(listener: UnixListener, policy: PeerPolicy, limits: Limits) -> Socket<R> {
        let limits = Limits {
            max_connections: limits.max_connections.max(1),
            ..limits
        };
        Socket {
            listener,
            policy,
            budget: Budget::new(limits.frame_budget),
            limits,
            requests: PhantomData,
        }
    }

    /// What it is: `R`'s socket.
    pub fn spec(&self) -> SocketSpec {
        R::SPEC
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
pub fn accept_loop<R, H>(socket: Socket<R>, handler: H) -> io::Result<JoinHandle<()>>
where
    R: Requests,
    H: Fn(UnixStream, u64, R) + Send + Sync + 'static,
{
    thread::Builder::new()
        .name(format!("accept-{}", R::SPEC.name))
        .spawn(move || {
            let file = R::SPEC.file();
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
/// table does not list, and hands the rest to `handler` as an `R`.
///
/// A transient accept error (out of descriptors, ...) is logged once per episode with the
/// `listener-lost` pointer and retried every 200 ms.
pub fn accept_here<R, H>(socket: Socket<R>, handler: H) -> io::Error
where
    R: Requests,
    H: Fn(UnixStream, u64, R) + Send + Sync + 'static,
{
    let Socket {
        listener,
        policy,
        limits,
        budget,
        ..
    } = socket;
    let spec = R::SPEC;
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
        let max = limits.max_connections;
        if open.load(Ordering::Acquire) >= max {
            if !full {
                full = true;
                crate::runbook!(
                    BUSY_ANCHOR,
                    "{file} is serving {max} connections, its cap; new ones are answered unavailable"
                );
            }
            busy(
                stream,
                format!(
                    "{file} is serving {max} connections, its cap; {}",
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
        let budget = Arc::clone(&budget);
        let spawned = thread::Builder::new()
            .name(format!("conn-{}", spec.name))
            .stack_size(CONNECTION_STACK)
            .spawn(move || {
                let _conn = conn;
                let stream = taken.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(stream) = stream {
                    serve_one::<R, H>(stream, &limits, &budget, &*handler);
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
fn serve_one<R, H>(mut stream: UnixStream, limits: &Limits, budget: &Budget, handler: &H)
where
    R: Requests,
    H: Fn(UnixStream, u64, R),
{
    let spec = R::SPEC;
    let Some(env) = read_one(&mut stream, limits, budget) else {
        return;
    };
    match R::from_message(env.msg) {
        Ok(request) => handler(stream, env.id, request),
        Err(msg) => wrong_kind(&mut stream, &spec, env.id, &msg),
    }
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

/// Read the connection's one request as `limits` say: its whole first frame within their first
/// frame's time, its body's bytes held from the socket's own frame budget as they arrive, a
/// chunk at a time (waiting for room within the same deadline). See [`read_request`] for what
/// is answered here.
fn read_one(stream: &mut UnixStream, limits: &Limits, budget: &Budget) -> Option<Envelope> {
    let _ = stream.set_write_timeout(Some(limits.write.max(Duration::from_millis(1))));
    let first_ms = limits.first_frame.as_millis();
    let read = match Deadline::within(stream, limits.first_frame) {
        Some(mut deadline) => match bxcore::read_frame_len(&mut deadline) {
            Ok(n) => read_body(&mut deadline, n, budget),
            Err(e) => Err(Some(e)),
        },
        None => Err(Some(FrameError::Io(io::Error::from(
            io::ErrorKind::TimedOut,
        )))),
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
        // No room in the budget before the deadline.
        Err(None) => {
            let detail = format!(
                "frames being read on this socket take its whole budget of {} bytes; {}",
                budget.cap,
                bxcore::runbook::pointer(BUSY_ANCHOR)
            );
            let _ =
                bxcore::write_frame(stream, &Envelope::error(0, ErrorCode::Unavailable, detail));
            None
        }
        Err(Some(FrameError::Closed)) => None,
        Err(Some(e)) => {
            let detail = if e.is_timeout() {
                format!("no whole frame within {first_ms} ms")
            } else {
                e.to_string()
            };
            let _ = bxcore::write_frame(stream, &Envelope::error(0, e.code(), detail));
            None
        }
    }
}

/// The body of a frame of `n` bytes, each chunk held from `budget` before it is read;
/// `Err(None)`: the budget had no room (before the deadline, or every other read waited too).
fn read_body(
    r: &mut Deadline<'_>,
    n: usize,
    budget: &Budget,
) -> Result<Envelope, Option<FrameError>> {
    let mut held = Held { budget, n: 0 };
    let mut body: Vec<u8> = Vec::new();
    while body.len() < n {
        let chunk = CHUNK.min(n - body.len());
        budget
            .take(&mut held.n, chunk, r.until())
            .map_err(|_| None)?;
        let start = body.len();
        body.resize(start + chunk, 0);
        let mut got = start;
        while got < start + chunk {
            match r.read(&mut body[got..start + chunk]) {
                Ok(0) => {
                    return Err(Some(FrameError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the stream ended after {got} of {n} bytes"),
                    ))));
                }
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Some(FrameError::Io(e))),
            }
        }
    }
    bxcore::decode_body(body).map_err(Some)
}

/// Read the connection's one request with a socket's default [`Limits`] and a budget of its own:
/// for a server of one connection (a test's stand-in).
///
/// - `ping` is answered here (`pong {daemon, version, protocol}`, never logged): `None`.
/// - A malformed frame, a silent or trickling peer: answered here with an `error` frame, id 0,
///   code [`FrameError::code`]: `None`.
/// - No room in the budget before the deadline: `error unavailable`, id 0: `None`.
/// - The peer closed before sending anything: `None`, silently.
/// - Otherwise the envelope, for the daemon to answer.
pub fn read_request(stream: &mut UnixStream, limits: &Limits) -> Option<Envelope> {
    let budget = Budget::new(limits.frame_budget);
    read_one(stream, limits, &budget)
}

/// This daemon's `pong`: its name, its version, the protocol it speaks.
fn pong() -> Message {
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
fn forbid(stream: &mut UnixStream, id: u64, msg: &Message, socket: &str) {
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
