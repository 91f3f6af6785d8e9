//! Fake servers with deadlines: a test's stand-in for a daemon or a provider accepts until the
//! test drops it (never for ever), and every connection it accepts reads and writes with
//! [`DEADLINE`](crate::DEADLINE), so no helper thread outlives its test waiting on a peer that
//! went away.

use std::io::{self, BufRead};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, poll};

use crate::DEADLINE;

/// How often an accept loop looks whether its server was dropped.
const TICK: u16 = 50;

/// A listening socket a test serves: Unix or TCP.
pub trait Listener: AsFd + Send + 'static {
    type Stream: Stream;
    fn accept_stream(&self) -> io::Result<Self::Stream>;
}

/// A connected socket: Unix or TCP.
pub trait Stream: Send + 'static {
    /// Blocking, with reads and writes that give up after `d`.
    fn bound(&self, d: Duration) -> io::Result<()>;
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    fn accept_stream(&self) -> io::Result<UnixStream> {
        self.accept().map(|(s, _)| s)
    }
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    fn accept_stream(&self) -> io::Result<TcpStream> {
        self.accept().map(|(s, _)| s)
    }
}

impl Stream for UnixStream {
    fn bound(&self, d: Duration) -> io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

impl Stream for TcpStream {
    fn bound(&self, d: Duration) -> io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

/// Whether `l` has a connection waiting, looking for at most `ms` milliseconds.
fn readable(l: &impl Listener, ms: u16) -> bool {
    let mut fds = [PollFd::new(l.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, ms), Ok(n) if n > 0)
}

/// One connection on `l` within `deadline`, its reads and writes bounded by
/// [`DEADLINE`](crate::DEADLINE); `Err` says what was awaited.
pub fn accept_within<L: Listener>(
    l: &L,
    what: &str,
    deadline: Duration,
) -> Result<L::Stream, String> {
    let until = Instant::now() + deadline;
    loop {
        if readable(l, TICK) {
            let s = l
                .accept_stream()
                .map_err(|e| format!("cannot accept {what}: {e}"))?;
            s.bound(DEADLINE)
                .map_err(|e| format!("cannot set deadlines on {what}: {e}"))?;
            return Ok(s);
        }
        if Instant::now() >= until {
            return Err(format!(
                "waited {deadline:?} for {what} to connect, in vain"
            ));
        }
    }
}

/// One connection on `l` within [`DEADLINE`](crate::DEADLINE), or a panic saying `what` never
/// connected.
#[track_caller]
pub fn accept<L: Listener>(l: &L, what: &str) -> L::Stream {
    match accept_within(l, what, DEADLINE) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

/// A fake server: a thread accepting on a listener until this is dropped, each connection's
/// reads and writes bounded by [`DEADLINE`](crate::DEADLINE).
#[derive(Debug)]
pub struct Server {
    stop: Arc<AtomicBool>,
    accepting: Option<JoinHandle<()>>,
}

impl Server {
    /// Serve each connection on a thread of its own with `handler`.
    pub fn each<L, F>(listener: L, handler: F) -> Server
    where
        L: Listener,
        F: Fn(L::Stream) + Send + Sync + 'static,
    {
        let handler = Arc::new(handler);
        Server::start(listener, move |s| {
            let handler = Arc::clone(&handler);
            thread::spawn(move || handler(s));
        })
    }

    /// Serve the connections one after the other, in the order they came, with `handler`.
    pub fn in_turn<L, F>(listener: L, handler: F) -> Server
    where
        L: Listener,
        F: FnMut(L::Stream) + Send + 'static,
    {
        Server::start(listener, handler)
    }

    fn start<L, F>(listener: L, mut handler: F) -> Server
    where
        L: Listener,
        F: FnMut(L::Stream) + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let accepting = thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                if !readable(&listener, TICK) {
                    continue;
                }
                let Ok(s) = listener.accept_stream() else {
                    continue;
                };
                if s.bound(DEADLINE).is_ok() {
                    handler(s);
                }
            }
        });
        Server {
            stop,
            accepting: Some(accepting),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The accept loop ends within a tick (or, serving in turn, once that connection ends
        // or gives up at its deadline); nothing here waits for it.
        self.stop.store(true, Ordering::Relaxed);
        drop(self.accepting.take());
    }
}

/// One HTTP/1.1 request as a test's stand-in server reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    pub path: String,
    /// In the order sent: names lower-cased, values trimmed.
    pub headers: Vec<(String, String)>,
    /// `content-length` bytes.
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The first value of the header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Read one request from `reader`, whose connection reads with a timeout (a [`Server`] gives
/// every connection one): `Ok(None)` when the peer closed before a request line, an error when
/// it closed or went silent inside one.
pub fn read_http_request(reader: &mut impl BufRead) -> io::Result<Option<HttpRequest>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            let n = n.trim().to_ascii_lowercase();
            let v = v.trim().to_string();
            if n == "content-length" {
                length = v.parse().unwrap_or(0);
            }
            headers.push((n, v));
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(Some(HttpRequest {
        method,
        path,
        headers,
        body,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_read_with_its_headers_and_its_body() {
        let raw = "POST /v3/x HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nAuthorization:  Bearer t \r\n\r\nbodyNEXT";
        let mut r = io::BufReader::new(raw.as_bytes());
        let req = read_http_request(&mut r).unwrap().unwrap();
        assert_eq!((req.method.as_str(), req.path.as_str()), ("POST", "/v3/x"));
        assert_eq!(req.header("AUTHORIZATION"), Some("Bearer t"));
        assert_eq!(req.headers[0], ("host".to_string(), "h".to_string()));
        assert_eq!(req.body, b"body");
    }

    #[test]
    fn a_closed_connection_is_no_request_and_a_cut_one_an_error() {
        let mut r = io::BufReader::new(&b""[..]);
        assert!(read_http_request(&mut r).unwrap().is_none());
        let mut r = io::BufReader::new(&b"GET / HTTP/1.1\r\nHost: h\r\n"[..]);
        assert!(read_http_request(&mut r).is_err());
        let mut r = io::BufReader::new(&b"GET / HTTP/1.1\r\ncontent-length: 9\r\n\r\nabc"[..]);
        assert!(read_http_request(&mut r).is_err());
    }
}
