//! loopd's monitor: one worker process per live session, and nothing of any session's content.
//!
//! The monitor accepts on loop.sock and bridge.sock and reads each connection's first frame (the
//! accept path's), then hands the connection to its session's worker, started for it or already
//! running, and sees nothing more of it. A worker (`crate::worker`) is `loopd worker`, started
//! from loopd's own binary: it serves one session, in a Landlock domain of its own (its own
//! directory, nothing of any other session's) and under a seccomp list with no `socket` and no
//! `connect`. So what a turn needs from outside, the monitor provides: the session's log,
//! opened here, and a connection to inferproxy, brokerd or memoryd each time the worker asks
//! (`crate::control`, the messages each side may send).
//!
//! Bounded: at most `[workers] max` run. A new session past it ends the worker idle longest;
//! with none idle, its turn is refused (`loopd-workers-full`). A worker with no turn to serve and
//! nothing in its outbox ends after `[workers] idle_seconds`.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bxcore::{SessionId, Turn, TurnKey};

use crate::baseline::Owner;
use crate::channel::refuse;
use crate::config::Config;
use crate::control::{self, ControlError, Peer, ToMonitor, ToWorker};
use crate::session;
use crate::turn::TurnError;

/// The runbook entry of a turn refused because every worker is busy.
pub const WORKERS_FULL_ANCHOR: &str = "loopd-workers-full";
/// The runbook entry of a worker that could not be started, or ended other than when asked.
pub const WORKER_ANCHOR: &str = "loopd-worker-failed";

/// How often idle workers are looked for.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// How long a worker has to take each message the monitor sends it: one that does not read its
/// channel is ended, and never holds the monitor.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// The most connections to one peer a worker may hold open at once: a turn makes one at a time
/// to each (inference, a tool call, recall and the outbox's hand-off). A connection counts until
/// its daemon has answered and closed it, so a worker cannot hold a shared socket's places.
pub const MAX_OPEN_PER_PEER: usize = 4;

/// The workers, by session.
pub struct Monitor {
    cfg: Config,
    /// The configuration file, handed to each worker.
    config: PathBuf,
    /// loopd's own binary, found before the sandbox closed.
    exe: PathBuf,
    workers: Mutex<HashMap<SessionId, Arc<Worker>>>,
}

/// One running worker, as the monitor holds it.
struct Worker {
    session: SessionId,
    pid: u32,
    /// The monitor's end of the channel: hands and dial answers, one message at a time, each
    /// taken within `SEND_TIMEOUT`.
    writer: Mutex<UnixStream>,
    /// The same channel, to shut it down without waiting for the writer.
    closer: UnixStream,
    /// The connections made for it, until their daemon closes them, by peer.
    dialed: Mutex<Vec<(Peer, UnixStream)>>,
    /// The connections handed over and not yet served, and since when it has had none.
    load: Mutex<(usize, Instant)>,
    child: Mutex<Option<Child>>,
    /// Set once the monitor has asked it to end: its end is then no failure.
    ending: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("workers", &lock(&self.workers).len())
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// The monitor of `cfg` (loaded from `config`), with loopd's binary at `exe`.
    pub fn new(cfg: Config, config: PathBuf, exe: PathBuf) -> Monitor {
        Monitor {
            cfg,
            config,
            exe,
            workers: Mutex::new(HashMap::new()),
        }
    }

    pub fn cfg(&self) -> &Config {
        &self.cfg
    }

    /// The pids of the workers running now, by session.
    pub fn running(&self) -> Vec<(SessionId, u32)> {
        lock(&self.workers)
            .values()
            .map(|w| (w.session.clone(), w.pid))
            .collect()
    }

    /// Hand a connection whose first frame asked for `turn` to the session's worker; a turn
    /// that cannot be handed is answered here, on the connection.
    pub fn hand(self: &Arc<Self>, stream: UnixStream, id: u64, turn: Turn, key: Option<TurnKey>) {
        let session = turn.session.clone();
        let create = !turn.resume;
        let msg = ToWorker::Hand { id, turn, key };
        // A worker that ended between being found and being handed the connection is started
        // again, once.
        let mut why = String::new();
        for _ in 0..2 {
            let worker = match self.worker_for(&session, create) {
                Ok(w) => w,
                Err(e) => return refuse(stream, id, &session, &e),
            };
            let sent = control::send(&mut lock(&worker.writer), &msg, Some(stream.as_fd()));
            match sent {
                Ok(()) => return,
                Err(e) => {
                    why = e.to_string();
                    self.forget(&worker);
                    worker.end();
                }
            }
        }
        refuse(stream, id, &session, &TurnError::Worker(why));
    }

    /// The session's worker, with one more connection counted on it: the one running, else one
    /// started now (its log opened, made when `create`).
    fn worker_for(
        self: &Arc<Self>,
        session: &SessionId,
        create: bool,
    ) -> Result<Arc<Worker>, TurnError> {
        let mut workers = lock(&self.workers);
        if let Some(w) = workers.get(session) {
            let mut load = lock(&w.load);
            load.0 += 1;
            return Ok(Arc::clone(w));
        }
        // A resume of a session with no log is answered before any worker is ended for it, and
        // a new session whose owner's baseline cannot be read makes no log.
        // A resume of a session with no log is answered before any worker is ended for it. A
        // new session's log is made only when its worker begins it (`ToMonitor::Create`), so a
        // turn that ends before (a broker outage, an unreadable baseline) leaves none.
        let dir = self.cfg.sessions_dir();
        let path = session::log_path(&dir, session);
        let log = match session::open_log(&dir, session, false) {
            Ok(log) => Some(log),
            Err(session::SessionError::NotFound(_)) if create => None,
            Err(e) => return Err(e.into()),
        };
        let begun = match &log {
            Some(log) => session::begun(log, &path)?,
            None => false,
        };
        // The owner's part of the baseline is read only for a session not begun: a resumed one
        // has its baseline in its log.
        let owner = if begun {
            Owner::default()
        } else {
            Owner::read(&self.cfg.loop_dir()).map_err(TurnError::Baseline)?
        };
        if workers.len() >= self.cfg.workers.max {
            let idle = workers
                .values()
                .filter_map(|w| {
                    let (n, since) = *lock(&w.load);
                    (n == 0).then_some((since, Arc::clone(w)))
                })
                .min_by_key(|(since, _)| *since);
            let Some((_, idle)) = idle else {
                return Err(TurnError::WorkersFull(self.cfg.workers.max));
            };
            workers.remove(&idle.session);
            bxharden::log::notice(&format!(
                "the worker of session {} (pid {}) ended, idle longest, to make room for session {session} ([workers] max = {})",
                idle.session, idle.pid, self.cfg.workers.max
            ));
            idle.end();
        }
        let w = self.start(session, log, owner)?;
        lock(&w.load).0 += 1;
        workers.insert(session.clone(), Arc::clone(&w));
        Ok(w)
    }

    /// Start the worker of `session`, hand it its log, and listen to it on a thread of its own.
    fn start(
        self: &Arc<Self>,
        session: &SessionId,
        log: Option<std::fs::File>,
        owner: Owner,
    ) -> Result<Arc<Worker>, TurnError> {
        let failed =
            |what: &str, e: &dyn std::fmt::Display| TurnError::Worker(format!("{what}: {e}"));
        let dir = self.cfg.worker_dir(session);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(failed(&dir.display().to_string(), &e)),
        }
        let (mut ours, theirs) = UnixStream::pair().map_err(|e| failed("socketpair", &e))?;
        let child = Command::new(&self.exe)
            .arg("worker")
            .arg("--config")
            .arg(&self.config)
            .arg("--session")
            .arg(session.as_str())
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // The service manager's descriptors and notify socket are the monitor's alone.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env_remove("LISTEN_FDNAMES")
            .spawn()
            .map_err(|e| failed(&self.exe.display().to_string(), &e))?;
        let pid = child.id();
        let sent = control::send(
            &mut ours,
            &ToWorker::Start {
                session: session.clone(),
                owner,
                log: log.is_some(),
            },
            log.as_ref().map(|l| l.as_fd()),
        );
        let timed = ours.set_write_timeout(Some(SEND_TIMEOUT));
        let (reader, closer) = match (timed, ours.try_clone(), ours.try_clone()) {
            (Ok(()), Ok(r), Ok(c)) => (Ok::<_, std::io::Error>(r), c),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed("its channel", &e));
            }
        };
        let w = Arc::new(Worker {
            session: session.clone(),
            pid,
            writer: Mutex::new(ours),
            closer,
            dialed: Mutex::new(Vec::new()),
            load: Mutex::new((0, Instant::now())),
            child: Mutex::new(Some(child)),
            ending: false.into(),
        });
        let reader = match (sent, reader) {
            (Ok(()), Ok(r)) => r,
            (Err(e), _) => {
                w.end();
                return Err(failed("its log could not be handed over", &e));
            }
            (_, Err(e)) => {
                w.end();
                return Err(failed("its channel", &e));
            }
        };
        let monitor = Arc::clone(self);
        let listened = Arc::clone(&w);
        let spawned = std::thread::Builder::new()
            .name(format!("worker-{pid}"))
            .spawn(move || monitor.listen(listened, reader));
        if let Err(e) = spawned {
            w.end();
            return Err(failed("a thread to listen to it", &e));
        }
        Ok(w)
    }

    /// Serve one worker's messages until its channel closes, then forget and reap it.
    fn listen(&self, w: Arc<Worker>, mut reader: UnixStream) {
        let end = loop {
            match control::recv_to_monitor(&mut reader) {
                Ok(ToMonitor::Dial { peer }) => {
                    let answer = self.dial(&w, peer).map(OwnedFd::from);
                    let sent =
                        w.answer(answer, ToWorker::Dialed, |why| ToWorker::NotDialed { why });
                    if let Err(e) = sent {
                        break Err(e);
                    }
                }
                Ok(ToMonitor::Create) => {
                    let made = session::open_log(&self.cfg.sessions_dir(), &w.session, true)
                        .map(OwnedFd::from)
                        .map_err(|e| e.to_string());
                    let sent =
                        w.answer(made, ToWorker::Created, |why| ToWorker::NotCreated { why });
                    if let Err(e) = sent {
                        break Err(e);
                    }
                }
                Ok(ToMonitor::Done) => {
                    {
                        let mut load = lock(&w.load);
                        load.0 = load.0.saturating_sub(1);
                        load.1 = Instant::now();
                    }
                    if let Err(e) = control::send(&mut lock(&w.writer), &ToWorker::Noted, None) {
                        break Err(e);
                    }
                }
                Err(ControlError::Closed) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.forget(&w);
        let asked = w.ending.load(std::sync::atomic::Ordering::SeqCst);
        if let Err(e) = &end {
            if !asked {
                bxharden::log::line(
                    WORKER_ANCHOR,
                    &format!(
                        "loopd: the worker of session {} (pid {}) broke its channel ({e}) and was ended; {}",
                        w.session,
                        w.pid,
                        bxcore::runbook::pointer(WORKER_ANCHOR)
                    ),
                );
            }
        }
        w.end();
        let status = lock(&w.child).take().and_then(reap);
        if let Some(status) = status {
            if !asked && !status.success() {
                bxharden::log::line(
                    WORKER_ANCHOR,
                    &format!(
                        "loopd: the worker of session {} (pid {}) ended: {status}; {}",
                        w.session,
                        w.pid,
                        bxcore::runbook::pointer(WORKER_ANCHOR)
                    ),
                );
            }
        }
    }

    /// A connection to one of the peers a worker may ask for, within its bound of open ones.
    fn dial(&self, w: &Worker, peer: Peer) -> Result<UnixStream, String> {
        let path: Option<&Path> = match peer {
            Peer::Inference => Some(&self.cfg.inference.socket),
            Peer::Broker => self.cfg.broker.socket.as_deref(),
            Peer::Memory => self.cfg.memory.socket.as_deref(),
        };
        let path = path.ok_or_else(|| format!("loopd has no {peer:?} socket configured"))?;
        let mut dialed = lock(&w.dialed);
        dialed.retain(|(_, s)| open(s));
        let n = dialed.iter().filter(|(p, _)| *p == peer).count();
        if n >= MAX_OPEN_PER_PEER {
            return Err(format!(
                "this session's worker holds {n} open connections to {}, its bound; one is \
                 free again when its daemon has answered",
                path.display()
            ));
        }
        let s = UnixStream::connect(path).map_err(|e| e.to_string())?;
        let kept = s.try_clone().map_err(|e| e.to_string())?;
        dialed.push((peer, kept));
        Ok(s)
    }

    /// Drop `w` from the table, if it is still the session's worker there.
    fn forget(&self, w: &Arc<Worker>) {
        let mut workers = lock(&self.workers);
        if workers.get(&w.session).is_some_and(|x| Arc::ptr_eq(x, w)) {
            workers.remove(&w.session);
        }
    }

    /// End, every `IDLE_TICK`, each worker idle for `[workers] idle_seconds` whose outbox is
    /// empty. Runs for the life of the process.
    pub fn reap_idle(&self) -> ! {
        let idle = Duration::from_secs(self.cfg.workers.idle_seconds);
        loop {
            std::thread::sleep(IDLE_TICK);
            let mut workers = lock(&self.workers);
            let done: Vec<SessionId> = workers
                .values()
                .filter(|w| {
                    let (n, since) = *lock(&w.load);
                    n == 0 && since.elapsed() >= idle && !self.outbox_holds(&w.session)
                })
                .map(|w| w.session.clone())
                .collect();
            for s in done {
                if let Some(w) = workers.remove(&s) {
                    bxharden::log::notice(&format!(
                        "the worker of session {s} (pid {}) ended, idle for {} s ([workers] idle_seconds)",
                        w.pid, self.cfg.workers.idle_seconds
                    ));
                    w.end();
                }
            }
        }
    }

    /// End every worker, at once (loopd is stopping): each session's log keeps what its turn
    /// wrote, and a turn cut here is one a channel sees end without its final frame.
    pub fn end_all(&self) {
        let workers: Vec<Arc<Worker>> = lock(&self.workers).drain().map(|(_, w)| w).collect();
        for w in workers {
            w.end();
            if let Some(c) = lock(&w.child).as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Whether the session's outbox holds a turn not yet taken by memoryd (its names only are
    /// read, never its content).
    fn outbox_holds(&self, session: &SessionId) -> bool {
        let dir = self.cfg.worker_dir(session).join("outbox");
        std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
    }
}

/// Whether a connection made for a worker is still open: its daemon has not closed it, nor the
/// worker shut it down.
fn open(s: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack for a descriptor this function borrows; no wait.
    match unsafe { libc::poll(&mut p, 1, 0) } {
        0 => true,
        n if n > 0 => p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) == 0,
        _ => false,
    }
}

/// Wait for a worker whose channel closed to end, at most a little longer than it lets its
/// turns finish their final frames (`crate::worker::END_GRACE`); then end it with `SIGKILL`.
fn reap(mut c: Child) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + crate::worker::END_GRACE + Duration::from_secs(1);
    while Instant::now() < until {
        match c.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break,
        }
    }
    let _ = c.kill();
    c.wait().ok()
}

impl Worker {
    /// Answer a question with its descriptor (`yes`), or why not.
    fn answer(
        &self,
        got: Result<OwnedFd, String>,
        yes: ToWorker,
        no: impl FnOnce(String) -> ToWorker,
    ) -> Result<(), ControlError> {
        let mut writer = lock(&self.writer);
        match got {
            Ok(fd) => control::send(&mut writer, &yes, Some(fd.as_fd())),
            Err(why) => control::send(&mut writer, &no(why), None),
        }
    }

    /// Ask the worker to end: its channel closed both ways, so it reads its end, lets a final
    /// frame go, and exits. Its listener reaps it, with a signal if it does not.
    /// Never waits: neither for the writer nor for the worker.
    fn end(&self) {
        self.ending.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.closer.shutdown(std::net::Shutdown::Both);
        for (_, s) in lock(&self.dialed).drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}
