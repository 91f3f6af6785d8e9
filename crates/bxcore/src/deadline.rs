//! Reading through a deadline for a whole answer, never a per-read timeout.
//!
//! A read timeout set once lets a peer that sends one byte now and then hold a reader for ever.
//! `Deadline` allows each read only the time that is left, so a frame, however it trickles in,
//! is complete by the deadline or is an error.

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

    /// Move the deadline (after a pending approval, for one).
    pub fn set_until(&mut self, until: Instant) {
        self.until = until;
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
