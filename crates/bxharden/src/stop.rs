//! A clean stop: SIGTERM and SIGINT write one byte into a pipe (`write` is async-signal-safe, so
//! nothing else runs in the handler), and a thread of the daemon's own reads it
//! ([`crate::daemon::Running::on_stop`]) to do what the daemon must at stop before the process
//! ends (brokerd logs its audit chain's head).

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

/// The write end of the pipe the stop signals write to (-1 before it exists).
static STOP_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_stop(_: libc::c_int) {
    let fd = STOP_PIPE.load(Ordering::Relaxed);
    // SAFETY: writing one byte from a static buffer to a descriptor this process owns.
    unsafe {
        libc::write(fd, b"x".as_ptr().cast(), 1);
    }
}

/// The read end of a pipe that SIGTERM and SIGINT write to, their handlers installed.
pub fn pipe() -> nix::Result<OwnedFd> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    STOP_PIPE.store(w.into_raw_fd(), Ordering::Relaxed);
    let action = SigAction::new(
        SigHandler::Handler(on_stop),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only calls `write`, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(r)
}

/// Wait for a stop signal's byte on `r`: true when one came, false when the pipe failed.
pub fn wait(r: &OwnedFd) -> bool {
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(r.as_raw_fd(), &mut byte) {
            Ok(1) => return true,
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return false,
        }
    }
}
