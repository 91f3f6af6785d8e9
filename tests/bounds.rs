//! Every socket of the dev box is bounded: 2 000 idle connections get the socket's cap of threads
//! and an `unavailable` answer for the rest, while the daemon's other sockets and the other
//! daemons go on serving; many 1 MiB frames at once stay within the daemon's frame budget; and
//! the owner's sockets answer while another principal holds every place of its own socket with
//! a frame it never finishes.
//! Real daemons on a temporary home; every wait has a deadline and says what it waited for.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Instant;

use boxmaker_e2e::{DEADLINE, DevBox, hold_with_unfinished_frames, owners_question};
use bxcore::layout::{self, SocketSpec};
use bxcore::{Envelope, ErrorCode, FrameError, Message, read_frame};

/// Connections opened to each socket.
const FLOOD: usize = 2_000;

/// The default frame budget of every daemon (`bxharden::serve::DEFAULT_FRAME_BUDGET`).
const BUDGET: u64 = 4 << 20;

/// One field of `/proc/<pid>/status`, as a number (`VmRSS` in kB, `Threads`).
fn status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The largest value `field` of `pid` takes while it is watched, sampled as fast as `/proc` is
/// read (a sample, not a wait).
struct Peak {
    max: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    watcher: Option<thread::JoinHandle<()>>,
}

impl Peak {
    fn watch(pid: u32, field: &'static str) -> Peak {
        let max = Arc::new(AtomicU64::new(status(pid, field)));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s) = (Arc::clone(&max), Arc::clone(&stop));
        let watcher = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                m.fetch_max(status(pid, field), Ordering::Relaxed);
                thread::yield_now();
            }
        });
        Peak {
            max,
            stop,
            watcher: Some(watcher),
        }
    }

    fn max(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.watcher.take() {
            bxtest::join(w, "the memory watcher");
        }
        self.max.load(Ordering::Relaxed)
    }
}

fn raise_descriptor_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let want = (FLOOD as u64) * 2 + 256;
    let soft = if hard < want && nix::unistd::geteuid().is_root() {
        setrlimit(Resource::RLIMIT_NOFILE, want, want).unwrap();
        want
    } else {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
        hard
    };
    assert!(
        soft >= want,
        "the test needs {want} descriptors and may have only {soft}: raise `ulimit -Hn`"
    );
}

/// Ping `path` until it answers (a socket whose flood has just ended frees its places as the
/// connections' threads see them close).
/// `spec`'s socket of `b` answers ping (asked as its client) within the deadline.
fn served(b: &DevBox, spec: &SocketSpec, what: &str) {
    let path = spec.path(b.home());
    let until = Instant::now() + DEADLINE;
    loop {
        match b.as_client(spec, || bxcore::client::ping(&path, DEADLINE)) {
            Ok(_) => return,
            Err(e) => assert!(
                Instant::now() < until,
                "{what}: {} did not answer ping within {DEADLINE:?}: {e}",
                path.display()
            ),
        }
    }
}

/// The threads a daemon may have with every socket at its cap: a connection thread per place,
/// an accept thread per socket, its main thread and a few of its own (loopd's outbox sender).
fn thread_bound(daemon: &str) -> u64 {
    let sockets: Vec<&SocketSpec> = layout::SOCKETS
        .iter()
        .filter(|s| s.server == daemon)
        .collect();
    let places: usize = sockets.iter().map(|s| s.max_connections).sum();
    (places + sockets.len() + 4) as u64
}

fn pid_of(b: &DevBox, daemon: &str) -> u32 {
    b.pid(daemon)
        .unwrap_or_else(|| panic!("{daemon} has no pid file"))
}

#[test]
fn two_thousand_idle_connections_get_the_cap_then_unavailable_and_everyone_else_is_served() {
    raise_descriptor_limit();
    let b = DevBox::new();
    b.up(&[]);
    let home = b.home().to_path_buf();
    let sockets = [
        layout::LOOP,
        layout::BROKER,
        layout::ADMIN,
        layout::STATE,
        layout::INFER,
    ];
    for spec in sockets {
        let path = spec.path(&home);
        let pid = pid_of(&b, spec.server);
        let peak = Peak::watch(pid, "Threads");
        let flood: Vec<UnixStream> = (0..FLOOD)
            .map(|i| {
                b.as_client(&spec, || UnixStream::connect(&path))
                    .unwrap_or_else(|e| panic!("connection {i} to {}: {e}", path.display()))
            })
            .collect();
        // Accepted in order: once the last one has its answer, every one before it was taken.
        let mut last = &flood[FLOOD - 1];
        last.set_read_timeout(Some(DEADLINE)).unwrap();
        let mut first = [0u8; 1];
        let got = last.read(&mut first).unwrap_or_else(|e| {
            panic!(
                "{}: no answer to the last connection in {DEADLINE:?}: {e}",
                spec.file()
            )
        });
        assert_eq!(
            got,
            1,
            "{}: the last connection was closed unanswered",
            spec.file()
        );

        // Every other socket of the box is served meanwhile, this daemon's own included.
        for other in sockets.iter().filter(|o| o.name != spec.name) {
            served(&b, other, &format!("while {} is flooded", spec.file()));
        }

        let (mut unavailable, mut waiting) = (0usize, 0usize);
        for (i, mut s) in flood.iter().take(FLOOD - 1).enumerate() {
            s.set_nonblocking(true).unwrap();
            let mut byte = [0u8; 1];
            match s.read(&mut byte) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => waiting += 1,
                Ok(1) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(DEADLINE)).unwrap();
                    let env = rest_of_frame(byte[0], &mut s);
                    match &env.msg {
                        Message::Error(e) if e.code == ErrorCode::Unavailable => {
                            assert_eq!(
                                e.detail,
                                format!(
                                    "{} is serving {} connections, its cap; {}",
                                    spec.file(),
                                    spec.max_connections,
                                    bxcore::runbook::pointer("socket-busy")
                                )
                            );
                            unavailable += 1;
                        }
                        // A place taken early whose first-frame deadline passed while the
                        // flood was still connecting: answered and closed, as any silent peer.
                        Message::Error(e) if e.code == ErrorCode::BadFrame => {}
                        other => panic!("{}: connection {i}: {other:?}", spec.file()),
                    }
                }
                other => panic!("{}: connection {i}: {other:?}", spec.file()),
            }
        }
        let threads = peak.max();
        eprintln!(
            "{}: {waiting} held, {unavailable} unavailable, at most {threads} threads",
            spec.file()
        );
        assert!(
            waiting <= spec.max_connections,
            "{}: {waiting} connections are held, over the cap of {}",
            spec.file(),
            spec.max_connections
        );
        assert!(
            unavailable >= FLOOD - 1 - spec.max_connections * 4,
            "{}: only {unavailable} of {FLOOD} connections were answered unavailable",
            spec.file()
        );
        assert!(
            threads <= thread_bound(spec.server),
            "{}: {} ran {threads} threads, over {}",
            spec.file(),
            spec.server,
            thread_bound(spec.server)
        );
        drop(flood);
        served(&b, &spec, &format!("after the flood on {}", spec.file()));
    }
}

#[test]
fn the_owners_sockets_answer_while_another_principal_holds_every_place_with_an_unfinished_frame() {
    let b = DevBox::new();
    b.up(&[]);
    // Each socket another uid may hold, beside the owner's socket of the same daemon (or of the
    // daemon it asks): loopd's uid on broker.sock and memory.sock, memoryd's on state.sock.
    let cases = [
        (layout::BROKER, layout::ADMIN),
        (layout::STATE, layout::ADMIN),
        (layout::MEMORY, layout::MEMORIES),
    ];
    for (held, owners) in cases {
        let hold = hold_with_unfinished_frames(&b, &held);
        let holding = hold.unanswered();
        let (question, right) = owners_question(&owners);
        let path = owners.path(b.home());
        for i in 0..5 {
            let answer = b.as_client(&owners, || {
                bxcore::client::call(&path, DEADLINE, 1, question.clone(), |_| {})
            });
            match answer {
                Ok(m) if right(&m) => {}
                other => panic!(
                    "{} asked {i} while {} is held by {}: {other:?}",
                    owners.file(),
                    held.file(),
                    held.client
                ),
            }
        }
        // The hold is as it was: the answers did not wait for the held frames' room, which
        // comes only once the server gives those connections up at their first-frame deadline.
        assert_eq!(
            hold.unanswered(),
            holding,
            "{} was answered only once {} was let go",
            owners.file(),
            held.file()
        );
        drop(hold);
        served(&b, &held, &format!("after {} was held", held.file()));
    }
}

/// The rest of a frame whose first byte was read already.
fn rest_of_frame(first: u8, s: &mut impl Read) -> Envelope {
    let mut bytes = vec![first];
    s.read_to_end(&mut bytes).unwrap(); // bounded: the caller set a read timeout
    read_frame(&mut bytes.as_slice()).expect("a whole frame")
}

/// A frame of `size` bytes: a `ping` with a key no envelope has, so it is read whole, parsed, and
/// answered `bad_message`.
fn big_frame(size: usize) -> Vec<u8> {
    let head = br#"{"v":1,"id":1,"final":true,"msg":{"kind":"ping","pad":""#;
    let tail = br#""}}"#;
    let mut body = head.to_vec();
    body.resize(size - tail.len(), b'x');
    body.extend_from_slice(tail);
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

#[test]
fn many_frames_of_one_mebibyte_at_once_stay_within_the_frame_budget() {
    let b = DevBox::new();
    b.up(&[]);
    let path: PathBuf = layout::BROKER.path(b.home());
    let pid = pid_of(&b, "brokerd");
    served(&b, &layout::BROKER, "before the frames");
    let idle = status(pid, "VmRSS");
    let clients = layout::BROKER.max_connections - 2;
    let frame = Arc::new(big_frame(bxcore::MAX_FRAME));
    let start = Arc::new(bxtest::Barrier::new(clients));
    let peak = Peak::watch(pid, "VmRSS");
    let senders: Vec<_> = (0..clients)
        .map(|_| {
            let (frame, start) = (Arc::clone(&frame), Arc::clone(&start));
            let mut s = b
                .as_client(&layout::BROKER, || UnixStream::connect(&path))
                .unwrap();
            thread::spawn(move || {
                s.set_read_timeout(Some(DEADLINE)).unwrap();
                s.set_write_timeout(Some(DEADLINE)).unwrap();
                start.wait("every sender to connect");
                // A server that answers before reading everything may close early: that is an
                // answer too, read below.
                let _ = s.write_all(&frame);
                match read_frame(&mut s) {
                    Ok(env) => env,
                    Err(FrameError::Io(e)) => panic!("no answer in {DEADLINE:?}: {e}"),
                    Err(e) => panic!("no answer: {e}"),
                }
            })
        })
        .collect();
    for s in senders {
        let env = bxtest::join(s, "a sender of a big frame");
        match &env.msg {
            Message::Error(e)
                if e.code == ErrorCode::BadMessage || e.code == ErrorCode::Unavailable => {}
            other => panic!("a big frame was answered {other:?}"),
        }
    }
    let peak = peak.max();
    eprintln!("brokerd: {idle} kB idle, at most {peak} kB with {clients} frames of 1 MiB");
    // The budget holds the frames being read; their decoding takes about as much again, and the
    // heap its own overhead: three budgets over the idle size, where a frame per connection
    // would take `clients` MiB several times over.
    let bound = idle + 3 * BUDGET / 1024;
    assert!(
        peak <= bound,
        "brokerd grew from {idle} kB to {peak} kB with {clients} frames of 1 MiB at once, over \
         {bound} kB"
    );
    served(&b, &layout::BROKER, "after the frames");
}
