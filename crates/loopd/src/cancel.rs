//! Cancelling a turn: a channel that shuts down its writing half of loop.sock (or closes the
//! connection, or goes away) cancels its turn. A watcher thread per turn waits for that end of
//! input; from then on the turn stops at the next safe point: no new model call or tool call
//! starts, and the connections of the calls in flight (to inferproxy, to brokerd) are shut down,
//! so the model call is abandoned and a pending approval is withdrawn by brokerd.
//!
//! The calls register their connections with the turn's token through [`guard`], which finds the
//! token of the thread's turn ([`Cancel::enter`]); so neither the `ToolPort` trait nor the
//! inference client needs a token in its signature.

use std::cell::RefCell;
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, recv};

#[derive(Debug, Default)]
struct Inner {
    cancelled: AtomicBool,
    next: AtomicU64,
    /// The connections of the calls in flight, each a clone of the caller's.
    streams: Mutex<Vec<(u64, UnixStream)>>,
    /// The channel being watched, while the turn runs: a safe point looks at it itself, so a
    /// channel that went away stops the turn there even before the watcher thread has run.
    channel: Mutex<Option<UnixStream>>,
}

/// One turn's cancel token.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    inner: Arc<Inner>,
}

thread_local! {
    static CURRENT: RefCell<Option<Cancel>> = const { RefCell::new(None) };
}

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancel the turn: mark it, and shut down every connection in flight.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        let streams = self.inner.streams.lock().unwrap_or_else(|p| p.into_inner());
        for (_, s) in streams.iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// At a safe point: cancelled already, or the watched channel has ended (or sent a byte,
    /// which the protocol does not allow) without the watcher having seen it yet. Looks without
    /// taking anything from the channel (`MSG_PEEK`) and without waiting (`MSG_DONTWAIT`).
    fn is_cancelled_now(&self) -> bool {
        if self.is_cancelled() {
            return true;
        }
        let ended = {
            let channel = self.inner.channel.lock().unwrap_or_else(|p| p.into_inner());
            channel.as_ref().is_some_and(|c| {
                let mut byte = [0u8; 1];
                let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
                !matches!(
                    recv(c.as_raw_fd(), &mut byte, flags),
                    Err(Errno::EAGAIN | Errno::EINTR)
                )
            })
        };
        if ended {
            self.cancel();
        }
        ended
    }

    /// Make this the token of the calling thread's turn until the returned value is dropped.
    pub fn enter(&self) -> Entered {
        CURRENT.with(|c| *c.borrow_mut() = Some(self.clone()));
        Entered(())
    }

    /// Watch `channel` for the end of its input (or any byte after the turn frame, which the
    /// protocol does not allow): either cancels the turn. `None` when no thread could be
    /// started: the turn then runs to its end.
    pub fn watch(&self, channel: &UnixStream) -> Option<Watch> {
        let clone = channel.try_clone().ok()?;
        let looked_at = channel.try_clone().ok()?;
        let token = self.clone();
        let done = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&done);
        // Unnamed: naming a thread is a `prctl`, which loopd's seccomp list does not allow.
        let thread = std::thread::Builder::new()
            .spawn(move || {
                // A timeout is not the channel's end: only its end of input (or a byte) is.
                bxcore::deadline::wait_for_hangup(&clone);
                if !seen.load(Ordering::SeqCst) {
                    token.cancel();
                }
            })
            .ok()?;
        *self.inner.channel.lock().unwrap_or_else(|p| p.into_inner()) = Some(looked_at);
        Some(Watch {
            token: self.clone(),
            channel: channel.try_clone().ok(),
            done,
            thread: Some(thread),
        })
    }

    fn register(&self, stream: &UnixStream) -> Option<u64> {
        let clone = stream.try_clone().ok()?;
        let id = self.inner.next.fetch_add(1, Ordering::SeqCst);
        let mut streams = self.inner.streams.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_cancelled() {
            let _ = clone.shutdown(Shutdown::Both);
        }
        streams.push((id, clone));
        Some(id)
    }

    fn unregister(&self, id: u64) {
        let mut streams = self.inner.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.retain(|(i, _)| *i != id);
    }
}

/// The calling thread's turn token is set while this lives.
#[derive(Debug)]
pub struct Entered(());

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = None);
    }
}

/// The watcher of one channel; dropping it stops the watcher (the turn is over) and waits for it.
#[derive(Debug)]
pub struct Watch {
    token: Cancel,
    channel: Option<UnixStream>,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        // The turn is over: no safe point looks at the channel any more (it is about to be shut
        // down for reading, which would read as its end).
        *self
            .token
            .inner
            .channel
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        // Shutting down our reading half wakes the watcher's read with an end of input.
        if let Some(c) = &self.channel {
            let _ = c.shutdown(Shutdown::Read);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A connection registered with the thread's turn token while this lives.
#[derive(Debug)]
pub struct Guard {
    token: Option<(Cancel, u64)>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some((token, id)) = self.token.take() {
            token.unregister(id);
        }
    }
}

/// Shut `stream` down when the thread's turn is cancelled (at once, if it is already).
pub fn guard(stream: &UnixStream) -> Guard {
    let token = CURRENT.with(|c| c.borrow().clone());
    Guard {
        token: token.and_then(|t| t.register(stream).map(|id| (t, id))),
    }
}

/// Whether the thread's turn was cancelled.
pub fn cancelled() -> bool {
    CURRENT.with(|c| c.borrow().as_ref().is_some_and(Cancel::is_cancelled_now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_channel_that_shuts_down_its_writing_half_cancels_and_its_calls_are_shut_down() {
        let (channel, ours) = UnixStream::pair().unwrap();
        let token = Cancel::new();
        let _entered = token.enter();
        let (call, mut peer) = UnixStream::pair().unwrap();
        let _g = guard(&call);
        let watch = token.watch(&ours).unwrap();
        channel.shutdown(Shutdown::Write).unwrap();
        // The call's peer sees the end of input once the watcher cancelled.
        let mut buf = [0u8; 1];
        assert_eq!(peer.read(&mut buf).unwrap(), 0);
        assert!(cancelled());
        drop(watch);
    }

    #[test]
    fn a_turn_that_ends_stops_its_watcher_without_cancelling() {
        let (_channel, ours) = UnixStream::pair().unwrap();
        let token = Cancel::new();
        let watch = token.watch(&ours).unwrap();
        drop(watch);
        assert!(!token.is_cancelled());
    }

    #[test]
    fn a_timeout_left_on_the_channel_is_not_its_end() {
        let (_channel, ours) = UnixStream::pair().unwrap();
        // What a first-frame deadline used to leave behind: every read of the socket (a clone
        // shares it) times out after this long.
        ours.set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .unwrap();
        let token = Cancel::new();
        let watch = token.watch(&ours).unwrap();
        // Many times the timeout: the watcher has timed out again and again by now.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            !token.is_cancelled(),
            "a timeout was taken for the channel's end"
        );
        drop(watch);
        assert!(!token.is_cancelled());
    }

    #[test]
    fn a_call_registered_after_the_cancel_is_shut_down_at_once() {
        let token = Cancel::new();
        let _entered = token.enter();
        token.cancel();
        let (call, mut peer) = UnixStream::pair().unwrap();
        let _g = guard(&call);
        let mut buf = [0u8; 1];
        assert_eq!(peer.read(&mut buf).unwrap(), 0);
    }
}
