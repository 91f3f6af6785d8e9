//! `loopd worker`: one session's process, started by the monitor (`crate::monitor`) with its
//! channel on stdin. It serves that session's turns and no other's.
//!
//! In order, before any thread: the session's log and the owner's baseline from the monitor;
//! the outbox in its own directory; non-dumpable; then its sandbox, nested in the monitor's:
//! Landlock to its own directory (`<home>/loop/workers/<session>`) and its configuration,
//! seccomp with no `socket` and no `connect` (`SeccompProfile::LoopWorker`). So it can read no
//! other session's log or outbox, reach no socket but through the monitor, signal or trace no
//! process outside its domain. Every client in it (inference, the broker port, recall, the
//! memory outbox) dials through the monitor ([`bxcore::client::dial_through`]).

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bxcore::SessionId;
use bxharden::daemon::{Start, StartError};
use bxharden::profiles::SeccompProfile;
use bxharden::{Profile, STATE_DIR_ANCHOR};

use crate::channel::{OneSession, serve_turn};
use crate::config::Config;
use crate::control::{self, Peer, ToMonitor, ToWorker};
use crate::monitor::WORKER_ANCHOR;
use crate::outbox::Outbox;

/// How long a worker asked to end lets its turns finish their final frames.
pub const END_GRACE: Duration = Duration::from_secs(5);

/// One turn running, counted while it lives.
struct Running(Arc<std::sync::atomic::AtomicUsize>);

impl Running {
    fn enter(n: &Arc<std::sync::atomic::AtomicUsize>) -> Running {
        n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Running(Arc::clone(n))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How long a question waits for the monitor's answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(30);

/// The worker's end of its channel to the monitor.
struct Channel {
    writer: Mutex<UnixStream>,
    /// One question at a time (a dial, the log made): the one waiting for the monitor's
    /// answer, and the kind of answer it waits for.
    asking: Mutex<()>,
    answer: Mutex<Option<Waiting>>,
}

/// A question waiting: the answer it wants, and where to give it.
type Waiting = (Answer, SyncSender<Result<Option<OwnedFd>, String>>);

/// Which answer a question waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Dialed,
    Created,
    Noted,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Channel {
    /// Ask the monitor `question`, and wait for its answer (and descriptor).
    fn ask(&self, question: ToMonitor, wants: Answer) -> std::io::Result<Option<OwnedFd>> {
        let _one = lock(&self.asking);
        let (tx, rx): (_, Receiver<_>) = mpsc::sync_channel(1);
        *lock(&self.answer) = Some((wants, tx));
        control::send(&mut lock(&self.writer), &question, None).map_err(std::io::Error::other)?;
        match rx.recv_timeout(ASK_TIMEOUT) {
            Ok(Ok(fd)) => Ok(fd),
            Ok(Err(why)) => Err(std::io::Error::other(why)),
            Err(_) => {
                // An answer that comes later is one nobody asked for: it ends the worker, and
                // never answers the next question.
                *lock(&self.answer) = None;
                Err(std::io::Error::other(
                    "loopd's monitor did not answer in time",
                ))
            }
        }
    }

    /// A connection to `peer`, made by the monitor.
    fn dial(&self, peer: Peer) -> std::io::Result<UnixStream> {
        self.ask(ToMonitor::Dial { peer }, Answer::Dialed)?
            .map(UnixStream::from)
            .ok_or_else(|| std::io::Error::other("a dial answered without its connection"))
    }

    /// The session's log, made by the monitor.
    fn create(&self) -> std::io::Result<File> {
        self.ask(ToMonitor::Create, Answer::Created)?
            .map(File::from)
            .ok_or_else(|| std::io::Error::other("the log answered without its descriptor"))
    }

    /// Tell the monitor a connection is served, and wait until it has noted it: the channel's
    /// final frame comes after, so a channel that sends its next turn at once (to another
    /// session, at the bound) finds this worker idle.
    fn done(&self) {
        let _ = self.ask(ToMonitor::Done, Answer::Noted);
    }
}

/// What a worker may touch: its own directory read-write and its configuration read-only; its
/// log comes as a descriptor.
pub fn profile(cfg: &Config, session: &SessionId, config: &Path) -> Profile {
    let config = std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf());
    Profile::new(SeccompProfile::LoopWorker)
        .read_write(cfg.worker_dir(session))
        .read_only(config)
}

/// `loopd worker --config FILE --session ID`.
pub fn run(spec: bxharden::daemon::Spec, config: &Path, session: &str) -> ExitCode {
    match serve(spec, config, session) {
        Ok(never) => match never {},
        Err(e) => bxharden::daemon::exit(&e),
    }
}

fn serve(
    spec: bxharden::daemon::Spec,
    config: &Path,
    session: &str,
) -> Result<std::convert::Infallible, StartError> {
    let broken = |e: &dyn std::fmt::Display| {
        StartError::own(
            WORKER_ANCHOR,
            format!("the channel to loopd's monitor: {e}"),
        )
    };
    let session = SessionId::new(session).map_err(|e| StartError::own(WORKER_ANCHOR, e))?;
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| broken(&e))?;
    let mut reader = UnixStream::from(fd);
    let (log, owner) = match control::recv_to_worker(&mut reader).map_err(|e| broken(&e))? {
        (
            ToWorker::Start {
                session: s, owner, ..
            },
            fd,
        ) if s == session => (fd.map(File::from), owner),
        (other, _) => return Err(broken(&format!("a first message {other:?}, not its start"))),
    };
    let start = Start::<Config>::load_within(spec, config)?;
    let cfg = start.cfg();
    let outbox = match &cfg.memory.socket {
        Some(_) => {
            let dir = cfg.worker_dir(&session).join("outbox");
            let outbox = Outbox::open(&dir, cfg.memory.max_outbox).map_err(|e| {
                StartError::own(
                    STATE_DIR_ANCHOR,
                    format!("{}: cannot open the memory outbox: {e}", dir.display()),
                )
            })?;
            Some(Arc::new(outbox))
        }
        None => None,
    };
    let path = crate::session::log_path(&cfg.sessions_dir(), &session);
    let profile = profile(cfg, &session, config);
    // SAFETY: prctl with PR_SET_DUMPABLE takes integer arguments only. Not dumpable: no process
    // of loopd's user may trace this one or read its memory.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(StartError::own(
            WORKER_ANCHOR,
            format!("PR_SET_DUMPABLE: {}", std::io::Error::last_os_error()),
        ));
    }
    let (cfg, running) = start.sandbox(&profile)?;
    bxharden::log::notice(&format!(
        "the worker of session {session} (pid {}) is in its sandbox, serving that session only",
        std::process::id()
    ));
    let channel = Arc::new(Channel {
        writer: Mutex::new(reader.try_clone().map_err(|e| broken(&e))?),
        asking: Mutex::new(()),
        answer: Mutex::new(None),
    });
    let peers = Peers::of(&cfg);
    let dialer = Arc::clone(&channel);
    let _ = bxcore::client::dial_through(Box::new(move |path| match peers.which(path) {
        Some(peer) => dialer.dial(peer),
        None => Err(std::io::Error::other(
            "a session's worker reaches only inferproxy, brokerd and memoryd, through loopd's monitor",
        )),
    }));
    let creator = Arc::clone(&channel);
    let ctx = crate::daemon::context(cfg, outbox, &running)?.with_one(OneSession {
        session,
        path,
        owner,
        log: Mutex::new(log),
        create: Box::new(move || creator.create()),
    });
    let ctx = Arc::new(ctx);
    let turns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        match control::recv_to_worker(&mut reader) {
            Ok((ToWorker::Hand { id, turn, key }, Some(fd))) => {
                let (ctx, for_turn) = (Arc::clone(&ctx), Arc::clone(&channel));
                let running = Running::enter(&turns);
                let spawned =
                    std::thread::Builder::new()
                        .name("turn".to_owned())
                        .spawn(move || {
                            let _running = running;
                            let served = Box::new(|| for_turn.done());
                            serve_turn(
                                UnixStream::from(fd),
                                id,
                                turn,
                                key.as_ref(),
                                &ctx,
                                Some(served),
                            );
                        });
                if let Err(e) = spawned {
                    bxharden::log::line(
                        WORKER_ANCHOR,
                        &format!(
                            "loopd: a turn's thread could not start: {e}; {}",
                            bxcore::runbook::pointer(WORKER_ANCHOR)
                        ),
                    );
                    channel.done();
                }
            }
            Ok((ToWorker::Dialed, Some(fd))) => answer(&channel, Answer::Dialed, Ok(Some(fd)))?,
            Ok((ToWorker::NotDialed { why }, _)) => answer(&channel, Answer::Dialed, Err(why))?,
            Ok((ToWorker::Created, Some(fd))) => answer(&channel, Answer::Created, Ok(Some(fd)))?,
            Ok((ToWorker::Noted, _)) => answer(&channel, Answer::Noted, Ok(None))?,
            Ok((ToWorker::NotCreated { why }, _)) => answer(&channel, Answer::Created, Err(why))?,
            // The monitor closed the channel: it asked the worker to end (idle, and so only
            // finishing the final frame of a turn it said it was done with), or it ended itself.
            Err(control::ControlError::Closed) => {
                let until = std::time::Instant::now() + END_GRACE;
                while turns.load(std::sync::atomic::Ordering::SeqCst) > 0
                    && std::time::Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                std::process::exit(0)
            }
            Ok((other, _)) => return Err(broken(&format!("an unexpected {other:?}"))),
            Err(e) => return Err(broken(&e)),
        }
    }
}

/// Give the waiting question its answer; an answer nobody asked for, or of another kind,
/// breaks the channel.
fn answer(
    channel: &Channel,
    kind: Answer,
    a: Result<Option<OwnedFd>, String>,
) -> Result<(), StartError> {
    match lock(&channel.answer).take() {
        Some((wants, tx)) if wants == kind => {
            let _ = tx.send(a);
            Ok(())
        }
        _ => Err(StartError::own(
            WORKER_ANCHOR,
            format!("the channel to loopd's monitor: a {kind:?} answer nobody asked for"),
        )),
    }
}

/// The three sockets a worker's clients name, and which peer each is.
struct Peers(Vec<(PathBuf, Peer)>);

impl Peers {
    fn of(cfg: &Config) -> Peers {
        let mut v = vec![(cfg.inference.socket.clone(), Peer::Inference)];
        if let Some(p) = &cfg.broker.socket {
            v.push((p.clone(), Peer::Broker));
        }
        if let Some(p) = &cfg.memory.socket {
            v.push((p.clone(), Peer::Memory));
        }
        Peers(v)
    }

    fn which(&self, path: &Path) -> Option<Peer> {
        self.0
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, peer)| *peer)
    }
}
