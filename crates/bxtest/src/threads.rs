//! Waits on other threads with a deadline: a channel's `recv`, a thread's `join` and a barrier
//! all wait for ever when the other side hangs or died before it got there; these wait at most
//! a deadline and then fail saying what they waited for.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::DEADLINE;

/// The next message from `rx`, within [`DEADLINE`]; past it, or when every sender is gone,
/// panic saying `what` was awaited.
#[track_caller]
pub fn recv<T>(rx: &Receiver<T>, what: &str) -> T {
    match recv_within(rx, what, DEADLINE) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// The next message from `rx` within `deadline`; `Err` says what was awaited and why it did
/// not come.
pub fn recv_within<T>(rx: &Receiver<T>, what: &str, deadline: Duration) -> Result<T, String> {
    rx.recv_timeout(deadline).map_err(|e| match e {
        RecvTimeoutError::Timeout => format!("waited {deadline:?} for {what}, in vain"),
        RecvTimeoutError::Disconnected => {
            format!("waited for {what}, but every sender went away first")
        }
    })
}

/// A gate a helper thread waits on (a fake server holding its answer back until the test has
/// looked): true once the test sent on it, false when the test dropped its end or
/// [`DEADLINE`] passed, so a helper never waits for ever.
pub fn gate(rx: &Receiver<()>) -> bool {
    rx.recv_timeout(DEADLINE).is_ok()
}

/// Join `handle` within [`DEADLINE`]; past it, panic saying `what` did not end. A panic in the
/// thread is passed on as it is.
#[track_caller]
pub fn join<T>(handle: JoinHandle<T>, what: &str) -> T {
    join_within(handle, what, DEADLINE)
}

/// [`join`] with a deadline of its own.
#[track_caller]
pub fn join_within<T>(handle: JoinHandle<T>, what: &str, deadline: Duration) -> T {
    crate::wait_for(&format!("{what} to end"), deadline, || handle.is_finished());
    match handle.join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// A barrier whose `wait` gives up after [`DEADLINE`]: a thread that panicked before it got
/// there makes the others fail, saying so, rather than wait for ever.
#[derive(Debug)]
pub struct Barrier {
    n: usize,
    state: Mutex<(usize, u64)>,
    cv: Condvar,
}

impl Barrier {
    pub fn new(n: usize) -> Barrier {
        Barrier {
            n,
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
        }
    }

    /// Wait until `n` threads are here, or panic past [`DEADLINE`].
    #[track_caller]
    pub fn wait(&self, what: &str) {
        let until = Instant::now() + DEADLINE;
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let generation = g.1;
        g.0 += 1;
        if g.0 == self.n {
            g.0 = 0;
            g.1 += 1;
            self.cv.notify_all();
            return;
        }
        while g.1 == generation {
            let left = until.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "waited {DEADLINE:?} at the barrier for {what}: {} of {} threads came",
                g.0,
                self.n
            );
            g = self
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
