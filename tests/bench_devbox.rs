//! The dev box's start-up and footprint (quality.md), printed as tables. Not a test: numbers
//! depend on the machine; `docs/performance.md` records them with the machine they came from.
//!
//! - start-up: `bxctl dev up` until every socket answers `ping`, on fresh homes; beside it, in
//!   the same run, the floor of spawning and reaping three trivial processes.
//! - the owner under a flood: `approvals_list` on admin.sock and `memory_recent` on memories.sock
//!   while loopd's uid (broker.sock, memory.sock) or memoryd's (state.sock) holds every place of
//!   its socket with a frame it never finishes.
//! - footprint: each daemon's resident memory idle, after `BENCH_CALLS` allowed tool calls on
//!   broker.sock (default 100 000, from 8 callers) and `BENCH_TURNS` turns on loop.sock (default
//!   2 000, each with one tool call), and again after as many more (growth between the rounds).
//!
//! - workers: what one process per session costs: a new session's first turn (which starts
//!   its worker) against a second turn in the same session (its worker running), medians over
//!   `BENCH_SESSIONS` sessions (default 20); then, with two sessions live and idle, each
//!   worker's resident memory (and the part of it that is its own: `RssAnon`; its code pages
//!   are the monitor's too), and the whole box's.
//!
//! `BENCH_ONLY=<section>` (startup, flood, footprint, workers) runs one section.
//!
//! Run `make bench`, or: `cargo build --release --workspace --bins && cargo bench -p
//! boxmaker-e2e --bench devbox`.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use boxmaker_e2e::{
    DAEMONS, DevBox, bin_dir, bxctl, hold_with_unfinished_frames, owners_question, said,
};
use bxcore::client;
use bxcore::layout;
use bxcore::{CallId, Message, SessionId, ToolRequest, ToolResponse, Turn};
use serde_json::json;

fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn status_kb(pid: u32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

/// loopd's session workers: the children of `monitor` that run `loopd worker`.
fn workers_of(monitor: u32) -> Vec<u32> {
    bxctl::procfs::workers_of(monitor)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

fn one_turn(home: &Path, session: &str, resume: bool) -> Duration {
    let msg = Message::Turn(Turn {
        session: SessionId::new(session).unwrap(),
        resume,
        text: "hello".into(),
    });
    let t = Instant::now();
    match client::call(
        &layout::LOOP.path(home),
        Duration::from_secs(60),
        1,
        msg,
        |_| {},
    ) {
        Ok(Message::TurnDone(_)) => {}
        other => panic!("{session}: {other:?}"),
    }
    t.elapsed()
}

fn workers() {
    let n = env_count("BENCH_SESSIONS", 20);
    let b = DevBox::new();
    b.up(&[]);
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for i in 0..n {
        let s = format!("bench-w{i}");
        first.push(one_turn(b.home(), &s, false));
        second.push(one_turn(b.home(), &s, true));
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (f, s) = (median(first), median(second));
    println!(
        "workers: a new session's first turn {:.1} ms, its second {:.1} ms (medians of {n}): the worker's start adds {:.1} ms   target: <= 5 ms",
        ms(f),
        ms(s),
        ms(f.saturating_sub(s))
    );
    b.down();
    let b = DevBox::new();
    b.up(&[]);
    for s in ["bench-live-a", "bench-live-b"] {
        one_turn(b.home(), s, false);
    }
    thread::sleep(Duration::from_secs(2));
    let monitor = b.pid("loopd").unwrap();
    let ws = workers_of(monitor);
    assert_eq!(ws.len(), 2, "two sessions, two workers");
    for w in &ws {
        println!(
            "  worker pid {w}: VmRSS {} kB, of it its own (RssAnon) {} kB, the binary's pages it shares with the monitor (RssFile) {} kB   target: <= 2048 kB",
            status_kb(*w, "VmRSS:"),
            status_kb(*w, "RssAnon:"),
            status_kb(*w, "RssFile:")
        );
    }
    let daemons: u64 = DAEMONS.iter().map(|d| rss_kb(b.pid(d).unwrap())).sum();
    let own: u64 = ws.iter().map(|w| status_kb(*w, "RssAnon:")).sum();
    let all: u64 = ws.iter().map(|w| status_kb(*w, "VmRSS:")).sum();
    println!(
        "  the box with two sessions live: its daemons {daemons} kB, with the workers' own {} kB, with their whole VmRSS {} kB   target: <= 20480 kB",
        daemons + own,
        daemons + all
    );
}

fn rss_kb(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn startup() {
    const RUNS: usize = 7;
    let mut ups = Vec::new();
    for _ in 0..RUNS {
        let b = DevBox::new();
        let t = Instant::now();
        let out = b.try_up(&[]);
        ups.push(t.elapsed());
        assert!(out.status.success(), "dev up: {}", said(&out));
        assert!(b.down().status.success());
    }
    let mut floors = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        for _ in 0..3 {
            // bounded: `true` ends at once; spawned bare, as the floor it measures
            Command::new("true").status().expect("true runs");
        }
        floors.push(t.elapsed());
    }
    ups.sort();
    floors.sort();
    let p50 = ups[RUNS / 2];
    let floor = floors[RUNS / 2];
    println!("start-up: bxctl dev up until every socket answers ping ({RUNS} fresh homes)");
    println!(
        "  p50 {:.1} ms (min {:.1}, max {:.1}); floor, three processes spawned and reaped: {:.1} ms; \
         ratio {:.1}; target <= 150 ms",
        ms(p50),
        ms(ups[0]),
        ms(ups[RUNS - 1]),
        ms(floor),
        ms(p50) / ms(floor).max(0.001)
    );
}

/// `n` allowed calls of a trivial tool on broker.sock, from `callers` threads.
fn broker_calls(home: &Path, n: u64, callers: u64) -> Duration {
    let socket = layout::BROKER.path(home);
    let dir = home.join("workspace/notes").display().to_string();
    let next = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let threads: Vec<_> = (0..callers)
        .map(|c| {
            let socket = socket.clone();
            let dir = dir.clone();
            let next = Arc::clone(&next);
            let target = bxctl::dev::DevHome::new(home).expect("the dev box's home");
            // Each caller as broker.sock's client (loopd's user, when the box has users per
            // daemon): only this thread takes its ids.
            thread::spawn(move || {
                bxctl::target::as_client(&target, &layout::BROKER, || {
                    calls(&socket, &dir, c, &next, n)
                })
                .unwrap_or_else(|e| panic!("{e}"))
            })
        })
        .collect();
    for t in threads {
        bxtest::join(t, "a caller of broker.sock");
    }
    t.elapsed()
}

/// Caller `c`'s share of the `n` calls.
fn calls(socket: &Path, dir: &str, c: u64, next: &AtomicU64, n: u64) {
    let session = SessionId::new(format!("bench-{c}")).unwrap();
    loop {
        let i = next.fetch_add(1, Ordering::SeqCst);
        if i >= n {
            return;
        }
        let msg = Message::ToolRequest(ToolRequest {
            session: session.clone(),
            call: CallId(i + 1),
            tool: "workspace_list".into(),
            args: json!({ "path": dir }),
        });
        match client::call(socket, Duration::from_secs(60), i + 1, msg, |_| {}) {
            Ok(Message::ToolResponse(ToolResponse::Result { .. })) => {}
            other => panic!("call {i}: {other:?}"),
        }
    }
}

/// `n` turns on loop.sock, each asking for one tool call (the default script reads the clock).
fn turns(home: &Path, round: u64, n: u64) -> Duration {
    let socket = layout::LOOP.path(home);
    let t = Instant::now();
    for i in 0..n {
        // A fresh session every 100 turns keeps each under its context budget.
        let session = SessionId::new(format!("bench-r{round}-{}", i / 100)).unwrap();
        let msg = Message::Turn(Turn {
            session,
            resume: i % 100 != 0,
            text: "what time is it?".into(),
        });
        match client::call(&socket, Duration::from_secs(60), 1, msg, |_| {}) {
            Ok(Message::TurnDone(_)) => {}
            other => panic!("turn {i}: {other:?}"),
        }
    }
    t.elapsed()
}

fn footprint() {
    let calls = env_count("BENCH_CALLS", 100_000);
    let turn_count = env_count("BENCH_TURNS", 2_000);
    let b = DevBox::new();
    b.up(&[]);
    let pids: Vec<(&str, u32)> = DAEMONS.iter().map(|d| (*d, b.pid(d).unwrap())).collect();
    let sample = || pids.iter().map(|(_, p)| rss_kb(*p)).collect::<Vec<_>>();
    let idle = sample();
    let mut rounds = Vec::new();
    for round in 0..2 {
        let tc = broker_calls(b.home(), calls, 8);
        let tt = turns(b.home(), round, turn_count);
        println!(
            "  round {}: {calls} broker calls in {:.1} s ({:.0} calls/s), {turn_count} turns in {:.1} s",
            round + 1,
            tc.as_secs_f64(),
            calls as f64 / tc.as_secs_f64(),
            tt.as_secs_f64()
        );
        rounds.push(sample());
    }
    println!(
        "footprint: VmRSS in kB, idle, after {calls} calls + {turn_count} turns, and after as many more"
    );
    println!(
        "  {:<11} {:>8} {:>10} {:>10}",
        "daemon", "idle", "round 1", "round 2"
    );
    for (i, (d, _)) in pids.iter().enumerate() {
        println!(
            "  {:<11} {:>8} {:>10} {:>10}",
            d, idle[i], rounds[0][i], rounds[1][i]
        );
    }
    let total = |v: &[u64]| v.iter().sum::<u64>();
    println!(
        "  {:<11} {:>8} {:>10} {:>10}   targets: <= 5120 each idle, <= 25600 in all, <= 2 x idle after, no growth between rounds",
        "total",
        total(&idle),
        total(&rounds[0]),
        total(&rounds[1])
    );
    let out = bxctl(&["audit", "verify", "--home", &b.home_arg()]);
    assert!(
        out.status.success(),
        "the chain verifies after the load: {}",
        said(&out)
    );
}

/// The owner's question answered while another principal holds every place of its socket with
/// a frame it never finishes (`hold_with_unfinished_frames`): `ANSWERS` times each, the median
/// and the slowest.
fn owner_under_flood() {
    const ANSWERS: usize = 50;
    let b = DevBox::new();
    b.up(&[]);
    println!("the owner under a flood: {ANSWERS} answers each, median and slowest, in ms");
    for (held, owners) in [
        (None, layout::ADMIN),
        (Some(layout::BROKER), layout::ADMIN),
        (Some(layout::STATE), layout::ADMIN),
        (None, layout::MEMORIES),
        (Some(layout::MEMORY), layout::MEMORIES),
    ] {
        let hold = held.map(|h| hold_with_unfinished_frames(&b, &h));
        let (question, right) = owners_question(&owners);
        let path = owners.path(b.home());
        let mut took: Vec<Duration> = (0..ANSWERS)
            .map(|_| {
                let t = Instant::now();
                let m = b
                    .as_client(&owners, || {
                        client::call(&path, Duration::from_secs(30), 1, question.clone(), |_| {})
                    })
                    .unwrap_or_else(|e| panic!("{}: {e}", owners.file()));
                assert!(right(&m), "{}: {m:?}", owners.file());
                t.elapsed()
            })
            .collect();
        took.sort();
        let by = held.map_or("nobody".to_string(), |h| {
            format!("{} ({} places, {})", h.file(), h.max_connections, h.client)
        });
        println!(
            "  {:<14} with {:<34} held: {:>7.2} {:>7.2}   target: < 1000",
            owners.file(),
            by,
            ms(took[ANSWERS / 2]),
            ms(took[ANSWERS - 1])
        );
        drop(hold);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not used.
    let dir = bin_dir();
    println!("binaries: {}", dir.display());
    // `BENCH_ONLY=workers` (or another section's name) runs that one section.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only == name;
    if run("startup") {
        startup();
    }
    if run("flood") {
        owner_under_flood();
    }
    if run("footprint") {
        footprint();
    }
    if run("workers") {
        workers();
    }
}
