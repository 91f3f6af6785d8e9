//! The turn in flight: its connection, kept where Ctrl-C (the signal thread, or the line
//! editor's own interrupt) can reach it, so that cancelling is the protocol's way (shut the
//! writing half, read on to loopd's `cancelled`) wherever the interrupt came from. A module of
//! its own so that `chat`, which sets it, and `prompt`, which cancels through it, do not depend
//! on each other.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

/// The connection of the turn in flight.
static IN_FLIGHT: Mutex<Option<UnixStream>> = Mutex::new(None);

/// Cancel the turn in flight, as the protocol says: shut down the writing half of its
/// connection and read on until loopd's final `cancelled`. False when no turn is in flight.
pub fn cancel_in_flight() -> bool {
    let slot = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
    match slot.as_ref() {
        Some(s) => s.shutdown(Shutdown::Write).is_ok(),
        None => false,
    }
}

/// The turn's connection is the one Ctrl-C cancels while this lives.
#[derive(Debug)]
pub struct InFlight(());

impl InFlight {
    /// `stream` (a clone of it) is the turn in flight until the guard is dropped.
    pub fn set(stream: &UnixStream) -> InFlight {
        *IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner()) = stream.try_clone().ok();
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}
