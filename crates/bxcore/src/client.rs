//! The client side of one request: connect, send one frame, read the answer's frames through one
//! deadline until the final one. Every client in the box that has no exits of its own fixed
//! elsewhere (loopd's `BrokerPort` has) asks through this.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::deadline::Deadline;
use crate::{Envelope, FrameError, Message, Pong, WireError, read_frame, write_frame};

/// Why a request got no final answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The timeout is past what the clock can hold.
    #[error("the timeout is too large")]
    TimeoutTooLarge,
    /// The socket could not be reached.
    #[error("cannot connect to {}: {error}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        error: std::io::Error,
    },
    /// The write timeout could not be set (a zero timeout cannot be).
    #[error("cannot set a timeout: {0}")]
    SetTimeout(#[source] std::io::Error),
    /// The request could not be sent (`TooLarge` included: the request is too big).
    #[error("cannot send the request: {0}")]
    Send(#[source] FrameError),
    /// The answer did not come whole in time, or was not a frame.
    #[error("{}", receive_text(.0))]
    Receive(#[source] FrameError),
    /// A frame answered another request.
    #[error("an answer for request {got}, not {want}")]
    WrongId { got: u64, want: u64 },
    /// The server answered with an `error` frame.
    #[error("the server answered {}: {}", .0.code, .0.detail)]
    Remote(WireError),
    /// A frame the request does not expect (a final frame of the wrong kind, say).
    #[error("an unexpected {0} message")]
    Unexpected(&'static str),
}

/// What a failed receive says: a close and a timeout in words, anything else as the frame error.
fn receive_text(e: &FrameError) -> String {
    match e {
        FrameError::Closed => "the connection closed before the final answer".to_string(),
        e if e.is_timeout() => "no answer in time".to_string(),
        e => format!("bad frame: {e}"),
    }
}

/// How a process that may make no socket of its own reaches a peer's: loopd's session worker,
/// whose seccomp list has no `socket` or `connect`, asks its monitor to connect for it and hand
/// the connection over (`loopd::control`). Set once, at the process's start, before any client
/// runs; every client below dials through it.
pub type Dialer = Box<dyn Fn(&Path) -> std::io::Result<UnixStream> + Send + Sync>;

static DIALER: OnceLock<Dialer> = OnceLock::new();

/// Make `dialer` the way every client of this process reaches a socket. `Err` gives it back
/// when one was set already: a process has one way to dial, for its whole life.
pub fn dial_through(dialer: Dialer) -> Result<(), Dialer> {
    DIALER.set(dialer)
}

/// A connection to `socket`: through the process's dialer when it has one, else `connect`.
pub fn dial(socket: &Path) -> std::io::Result<UnixStream> {
    match DIALER.get() {
        Some(d) => d(socket),
        None => UnixStream::connect(socket),
    }
}

/// One request on its own connection, and the frames of its answer.
#[derive(Debug)]
pub struct Exchange {
    stream: UnixStream,
    until: Instant,
    id: u64,
}

impl Exchange {
    /// Connect to `socket` and send `msg` as request `id`; the whole answer must come within
    /// `timeout` of now (see `extend`).
    pub fn start(
        socket: &Path,
        timeout: Duration,
        id: u64,
        msg: Message,
    ) -> Result<Exchange, ClientError> {
        let until = Instant::now()
            .checked_add(timeout)
            .ok_or(ClientError::TimeoutTooLarge)?;
        let mut stream = dial(socket).map_err(|error| ClientError::Connect {
            socket: socket.to_path_buf(),
            error,
        })?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(ClientError::SetTimeout)?;
        write_frame(&mut stream, &Envelope::new(id, true, msg)).map_err(ClientError::Send)?;
        Ok(Exchange { stream, until, id })
    }

    /// The next frame of the answer as it came, read within the deadline and nothing else
    /// checked: for a client whose exits fix the order of its own checks (loopd's broker port).
    pub fn next_envelope(&mut self) -> Result<Envelope, ClientError> {
        read_frame(&mut Deadline::new(&self.stream, self.until)).map_err(ClientError::Receive)
    }

    /// The next frame of the answer, its id checked. An `error` frame is `Remote`.
    pub fn next_frame(&mut self) -> Result<Envelope, ClientError> {
        let env = self.next_envelope()?;
        if env.id != self.id && !matches!(env.msg, Message::Error(_)) {
            return Err(ClientError::WrongId {
                got: env.id,
                want: self.id,
            });
        }
        match env.msg {
            Message::Error(e) => Err(ClientError::Remote(e)),
            _ => Ok(env),
        }
    }

    /// The connection, for a caller that must shut it down from another thread (a cancel).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Move the deadline for the rest of the answer (after a pending approval, say).
    pub fn extend(&mut self, until: Instant) {
        self.until = until;
    }

    pub fn until(&self) -> Instant {
        self.until
    }
}

/// The request is over: its connection is shut down both ways, so the server sees its end
/// whoever else holds a descriptor of it (loopd's monitor keeps one of each connection it makes
/// for a session's worker, to count them, `loopd::monitor`).
impl Drop for Exchange {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Send one request and return its final message; each interim frame's message is handed to
/// `on_interim` as it arrives.
pub fn call(
    socket: &Path,
    timeout: Duration,
    id: u64,
    msg: Message,
    mut on_interim: impl FnMut(&Message),
) -> Result<Message, ClientError> {
    let mut ex = Exchange::start(socket, timeout, id, msg)?;
    loop {
        let env = ex.next_frame()?;
        if env.last {
            return Ok(env.msg);
        }
        on_interim(&env.msg);
    }
}

/// Ask the daemon on `socket` who it is.
pub fn ping(socket: &Path, timeout: Duration) -> Result<Pong, ClientError> {
    match call(socket, timeout, 0, Message::Ping {}, |_| {})? {
        Message::Pong(p) => Ok(p),
        other => Err(ClientError::Unexpected(other.kind())),
    }
}
