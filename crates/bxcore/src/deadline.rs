//! Reading through a deadline for a whole answer, never a per-read timeout.
//!
//! A read timeout set once lets a peer that sends one byte now and then hold a reader for ever.
//! `Deadline` allows each read only the time that is left, so a frame, however it trickles in,
//! is complete by the deadline or is an error.
//!
//! The timeout it sets is the socket's (`SO_RCVTIMEO` belongs to the open file, so every clone
//! of the stream shares it): a `Deadline` clears it when it is dropped, so the deadline of one
//! read never becomes the timeout of the next reader of that stream (a thread that waits on a
//! clone for the peer's end of input, say).

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A reader over a stream that fails with a timeout once `until` has passed.
#[derive(Debug)]
pub struct Deadline<'a> {
    stream: &'a UnixStream,
    until: Instant,
}

impl<'a> Deadline<'a> {
    pub fn new(stream: &'a UnixStream, until: Instant) -> Deadline<'a> {
        Deadline { stream, until }
    }

    /// A deadline `timeout` from now, or `None` when that is past what the clock can hold.
    pub fn within(stream: &'a UnixStream, timeout: Duration) -> Option<Deadline<'a>> {
        Instant::now()
            .checked_add(timeout)
            .map(|until| Deadline { stream, until })
    }

    pub fn until(&self) -> Instant {
        self.until
    }
}

impl Drop for Deadline<'_> {
    /// The deadline was for this reader's reads only: the stream is left with no timeout.
    fn drop(&mut self) {
        let _ = self.stream.set_read_timeout(None);
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        // `set_read_timeout` refuses a zero duration: a deadline that has passed is a timeout.
        if left.is_zero() {
            return Err(io::Error::from(io::ErrorKind::TimedOut));
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

/// Whether `e` is a read that ran out of time: `WouldBlock` on Linux, `TimedOut` elsewhere and
/// from `Deadline` itself.
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Block until the peer's end of input on `stream` (or a byte, which a request-then-answer
/// protocol does not allow after the request, or the connection failing): what a watcher of a
/// waiting request waits for. A read that times out is not the end: whatever timeout the
/// socket carries (another reader's), the watcher only ever stops for the peer.
pub fn wait_for_hangup(stream: &UnixStream) {
    let mut byte = [0u8; 1];
    let mut s = stream;
    loop {
        match s.read(&mut byte) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted || is_timeout(&e) => continue,
            _ => return,
        }
    }
}
