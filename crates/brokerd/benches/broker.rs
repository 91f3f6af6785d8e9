//! The broker's benchmarks (quality.md), each with the floor it is compared with, measured in
//! the same run:
//!
//! - broker round trip: one allowed call of a trivial tool (`workspace_read` of a small file)
//!   through broker.sock, audited and fsync'd, with 1 and 16 concurrent callers, against a raw
//!   Unix-socket round trip (connect, one frame each way) and one append + fdatasync;
//! - audit verify over 1 000 000 records, over the cores (`audit verify`) and on one thread (the
//!   scan at start), against SHA-256 alone over the same bytes: each record's `prev` and its
//!   canonical JSON without `hash`, what the chain hashes, with nothing else done;
//! - the leak check (`fingerprints.rs`): one egress argument and one write-down content looked
//!   up in a full store, the cost every egress or write-down call adds to its round trip.
//!
//! `--leak` runs the leak check alone, `--verify` audit verify alone (`--verify --once`: one scan
//! on one thread, nothing timed, for a profiler).
//!
//! Run: `cargo bench -p brokerd` (or `cargo bench -p brokerd -- --quick`).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

mod false_positives;

use brokerd::ledger::chain;
use brokerd::ledger::record::{Draft, Event, GENESIS, Record};
use bxcore::deadline::Deadline;
use bxcore::{
    CallId, Envelope, Message, SessionId, Timestamp, ToolRequest, ToolResponse, read_frame,
    write_frame,
};
use serde_json::json;

struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Connect, send one frame, read one frame.
fn round_trip(sock: &Path, msg: Message) -> Message {
    let mut s = UnixStream::connect(sock).unwrap();
    write_frame(&mut s, &Envelope::new(1, true, msg)).unwrap();
    let mut d = Deadline::within(&s, Duration::from_secs(30)).unwrap();
    loop {
        let e = read_frame(&mut d).unwrap();
        if e.last {
            return e.msg;
        }
    }
}

/// The floor: a server that answers one frame per connection, a thread per connection.
fn raw_server(dir: &Path) -> PathBuf {
    let sock = dir.join("raw.sock");
    let l = UnixListener::bind(&sock).unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            thread::spawn(move || {
                let e = read_frame(&mut s).unwrap();
                write_frame(&mut s, &Envelope::new(e.id, true, Message::ToolsList {})).unwrap();
            });
        }
    });
    sock
}

fn fsync_p50(dir: &Path, n: usize) -> Duration {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("fsync.bin"))
        .unwrap();
    let line = [b'x'; 300];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&line).unwrap();
        f.sync_data().unwrap();
        v.push(t.elapsed());
    }
    p50(v)
}

fn call(n: u64, path: &str) -> Message {
    Message::ToolRequest(ToolRequest {
        session: SessionId::new("bench").unwrap(),
        call: CallId(n),
        tool: "workspace_read".into(),
        args: json!({ "path": path }),
    })
}

/// `callers` threads each making `per` calls: (per-call latencies, calls per second overall).
fn broker_load(sock: &Path, path: &str, callers: usize, per: usize) -> (Vec<Duration>, f64) {
    let start = Arc::new(Barrier::new(callers + 1));
    let mut hs = Vec::new();
    for c in 0..callers {
        let (sock, path, start) = (sock.to_path_buf(), path.to_string(), start.clone());
        hs.push(thread::spawn(move || {
            start.wait();
            let mut v = Vec::with_capacity(per);
            for i in 0..per {
                let t = Instant::now();
                let m = round_trip(&sock, call((c * per + i) as u64, &path));
                assert!(
                    matches!(m, Message::ToolResponse(ToolResponse::Result { .. })),
                    "{m:?}"
                );
                v.push(t.elapsed());
            }
            v
        }));
    }
    start.wait();
    let t = Instant::now();
    let mut all = Vec::new();
    for h in hs {
        all.extend(h.join().unwrap());
    }
    let secs = t.elapsed().as_secs_f64();
    let n = all.len() as f64;
    (all, n / secs)
}

/// The CPU time a process has used (user + system), from `/proc/<pid>/stat`.
fn cpu(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf with a constant name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// Write a chain of `n` records to `path`; the bytes each record's hash covers, one after
/// another, and where each starts (and the last ends).
fn write_chain(path: &Path, n: u64) -> (Vec<u8>, Vec<usize>) {
    let mut out = std::io::BufWriter::new(File::create(path).unwrap());
    let mut prev = GENESIS.to_string();
    let session = SessionId::new("bench").unwrap();
    let mut hashed = Vec::new();
    let mut starts = vec![0];
    for seq in 1..=n {
        let d = Draft::call(
            &session,
            CallId(seq),
            "workspace_read",
            if seq % 2 == 1 {
                Event::Requested
            } else {
                Event::Allowed
            },
            json!({"args_digest": "5f".repeat(32), "args_summary": "{path: string(23)}"}),
        );
        let r = Record::seal(d, seq, &prev, Timestamp(1_764_489_600_000 + seq));
        out.write_all(r.line().as_bytes()).unwrap();
        hashed.extend_from_slice(r.prev.as_bytes());
        hashed.extend_from_slice(r.canonical_without_hash().as_bytes());
        starts.push(hashed.len());
        prev = r.hash;
    }
    out.flush().unwrap();
    (hashed, starts)
}

/// The floor of audit verify: SHA-256 of each record's hashed bytes and nothing else, split over
/// `threads` threads as the scan splits its lines.
fn sha256_floor(hashed: &[u8], starts: &[usize], threads: usize) -> Duration {
    use sha2::{Digest, Sha256};
    let records: Vec<&[u8]> = starts.windows(2).map(|w| &hashed[w[0]..w[1]]).collect();
    let per = records.len().div_ceil(threads.max(1));
    let t = Instant::now();
    let zeros: usize = thread::scope(|scope| {
        let hs: Vec<_> = records
            .chunks(per)
            .map(|part| {
                scope.spawn(move || part.iter().filter(|r| Sha256::digest(r)[0] == 0).count())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let took = t.elapsed();
    // Used, so that the hashing is not optimized away: about 1 digest in 256 starts with 0.
    assert!(zeros < records.len());
    took
}

/// The least of `runs` timings of `f`: on a shared machine, the least disturbed run.
fn best(runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..runs).map(|_| f()).min().unwrap()
}

/// Audit verify of a generated chain of `records` records against its floor: table rows, and
/// the ratio and target lines.
fn verify_rows(dir: &Path, records: u64) -> (Vec<String>, Vec<String>) {
    let chain_path = dir.join("big-chain.jsonl");
    let (hashed, starts) = write_chain(&chain_path, records);
    let bytes = fs::read(&chain_path).unwrap();
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let rate = |d: Duration| records as f64 / d.as_secs_f64();
    let cores_t = best(3, || {
        let t = Instant::now();
        let r = chain::report(&bytes);
        let took = t.elapsed();
        assert!(r.ok && r.records == records, "{}", r.detail);
        took
    });
    let one_t = best(3, || {
        let t = Instant::now();
        let s = chain::scan(&bytes, chain::Threads::One);
        let took = t.elapsed();
        assert!(s.records == records && s.breaks.is_empty() && s.torn.is_none());
        took
    });
    let floor_cores = best(3, || sha256_floor(&hashed, &starts, cores));
    let floor_one = best(3, || sha256_floor(&hashed, &starts, 1));
    let per = hashed.len() / records as usize;
    let row = |what: String, d: Duration| {
        format!(
            "| {what} | {:.3} s, {:.0} records/s |",
            d.as_secs_f64(),
            rate(d)
        )
    };
    let rows = vec![
        row(
            format!("audit verify, {records} records, {cores} threads, best of 3"),
            cores_t,
        ),
        row(
            format!("floor: SHA-256 alone of the same bytes ({per} a record), {cores} threads"),
            floor_cores,
        ),
        row(
            "audit verify on one thread (the scan at start)".to_string(),
            one_t,
        ),
        row("floor: SHA-256 alone, one thread".to_string(), floor_one),
    ];
    let ratios = vec![
        format!(
            "ratio audit verify / its floor = {:.2} ({cores} threads), {:.2} (one thread)",
            floor_cores.as_secs_f64() / cores_t.as_secs_f64(),
            floor_one.as_secs_f64() / one_t.as_secs_f64()
        ),
        format!(
            "audit verify = {:.0} records/s (target >= 1000000)",
            rate(cores_t)
        ),
    ];
    (rows, ratios)
}

/// What one leak-check measure gives: the store's size, then p50 of a 200-byte URL, a 64 KiB
/// write of random letters and one of code; the two writes again once a short content (a PIN)
/// is in the store, which makes every decoder look at shorter runs.
type LeakCost = (usize, Duration, Duration, Duration, Duration, Duration);

/// p50 of `leak` over a full store: a 200-byte URL and a 64 KiB write content, neither a hit.
fn leak_cost(n: usize) -> LeakCost {
    use brokerd::fingerprints::{Fingerprints, MAX_ENTRIES, PER_RELEASE};
    let dir = tempfile::TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = Fingerprints::open(dir.path()).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = |len: usize| -> Vec<u8> {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b'a' + (x % 26) as u8
            })
            .collect()
    };
    // As full as it gets without being full (a full store denies without looking).
    while store.len() + PER_RELEASE <= MAX_ENTRIES {
        let n = noise(16_400);
        store
            .release(&[std::str::from_utf8(&n).unwrap()], &[])
            .unwrap();
    }
    let url = format!(
        "https://example.org/search?q={}",
        String::from_utf8(noise(170)).unwrap()
    );
    let url = json!({ "url": url });
    let write = json!({
        "path": "/srv/notes/x.txt",
        "content": String::from_utf8(noise(64 * 1024)).unwrap(),
    });
    let time = |args: &serde_json::Value| {
        p50((0..n)
            .map(|_| {
                let t = Instant::now();
                assert!(store.leak(args).is_none());
                t.elapsed()
            })
            .collect())
    };
    let code = json!({
        "path": "/srv/notes/x.rs",
        "content": false_positives::code(64 * 1024),
    });
    let (entries, url_t, write_t, code_t) = (store.len(), time(&url), time(&write), time(&code));
    store.release(&["4711"], &[]).unwrap();
    (entries, url_t, write_t, code_t, time(&write), time(&code))
}

/// The false-positive benchmark: after each kind of secret release, the share of the ordinary
/// corpus the leak check would deny.
fn print_false_positives() {
    use brokerd::fingerprints::Fingerprints;
    let calls = false_positives::corpus(toolkit::web_fetch::without_fixed_host);
    let mut denied_all = 0;
    let releases = false_positives::releases();
    for r in &releases {
        let dir = tempfile::TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let store = Fingerprints::open(dir.path()).unwrap();
        let parts: Vec<&str> = r.parts.iter().map(String::as_str).collect();
        let cut: Vec<&str> = r.cut.iter().map(String::as_str).collect();
        store.release(&parts, &cut).unwrap();
        let denied = calls
            .iter()
            .filter(|(_, a)| store.leak(a).is_some())
            .count();
        denied_all += denied;
        println!(
            "| false positives after {}, {} ordinary calls | {denied} ({:.1} %) |",
            r.kind,
            calls.len(),
            100.0 * denied as f64 / calls.len() as f64
        );
    }
    let total = calls.len() * releases.len();
    println!(
        "| false positives, all kinds, {total} calls | {denied_all} ({:.1} %) |",
        100.0 * denied_all as f64 / total as f64
    );
}

fn print_leak(n: usize) {
    let (entries, url, write, code, write_short, code_short) = leak_cost(n);
    println!(
        "| leak check, {entries} fingerprints, a 200-byte URL, p50 | {:.1} µs |",
        us(url)
    );
    for (what, t) in [
        (
            format!("leak check, {entries} fingerprints, a 64 KiB write"),
            write,
        ),
        (
            format!("leak check, {entries} fingerprints, a 64 KiB write of code"),
            code,
        ),
        (
            "the same write, a PIN in the store too".to_string(),
            write_short,
        ),
        (
            "the same write of code, a PIN in the store too".to_string(),
            code_short,
        ),
    ] {
        println!(
            "| {what}, p50 | {:.1} µs ({:.0} MB/s) |",
            us(t),
            65_536.0 / t.as_secs_f64() / 1e6
        );
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--leak") {
        println!("| measure | value |");
        println!("| --- | --- |");
        print_leak(if quick { 50 } else { 500 });
        print_false_positives();
        return;
    }
    if std::env::args().any(|a| a == "--verify") {
        let tmp = tempfile::TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        if std::env::args().any(|a| a == "--once") {
            // One scan on one thread and nothing else timed: for a profiler
            // (docs/performance.md).
            let n = if quick { 100_000 } else { 1_000_000 };
            let path = tmp.path().join("chain.jsonl");
            write_chain(&path, n);
            let bytes = fs::read(&path).unwrap();
            let s = chain::scan(&bytes, chain::Threads::One);
            assert!(s.records == n && s.breaks.is_empty());
            println!("scanned {n} records");
            return;
        }
        let (rows, ratios) = verify_rows(tmp.path(), if quick { 100_000 } else { 1_000_000 });
        println!("| measure | value |");
        println!("| --- | --- |");
        for r in rows {
            println!("{r}");
        }
        println!();
        for r in ratios {
            println!("{r}");
        }
        return;
    }
    let (rt_n, sync_n, per1, per16, records) = if quick {
        (300, 100, 200, 30, 100_000u64)
    } else {
        (2000, 500, 1000, 150, 1_000_000u64)
    };
    let tmp = tempfile::TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let home = tmp.path().canonicalize().unwrap();

    // Floors.
    let raw = raw_server(&home);
    for _ in 0..50 {
        round_trip(&raw, Message::ToolsList {});
    }
    let raw_rt = p50((0..rt_n)
        .map(|_| {
            let t = Instant::now();
            round_trip(&raw, Message::ToolsList {});
            t.elapsed()
        })
        .collect());
    let fsync = fsync_p50(&home, sync_n);

    // brokerd on this home, with one private root holding a small file.
    fs::create_dir(home.join("notes")).unwrap();
    fs::write(home.join("notes/a.txt"), "hello").unwrap();
    let cfg = home.join("brokerd.toml");
    fs::write(
        &cfg,
        format!(
            "[paths]\nhome = {:?}\n[sandbox]\nrequire = false\n[[workspace.roots]]\npath = {:?}\nclass = \"private\"\n",
            home.display().to_string(),
            home.join("notes").display().to_string()
        ),
    )
    .unwrap();
    let b = Guard(
        Command::new(env!("CARGO_BIN_EXE_brokerd"))
            .args(["serve", "--config"])
            .arg(&cfg)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let sock = home.join("run/loop-broker/broker.sock");
    let until = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < until, "brokerd did not start");
        thread::sleep(Duration::from_millis(10));
    }
    let path = home.join("notes/a.txt").display().to_string();
    broker_load(&sock, &path, 1, 20);
    let pid = b.0.id();
    let c0 = cpu(pid);
    let (lat1, rate1) = broker_load(&sock, &path, 1, per1);
    let c1 = cpu(pid);
    let (lat16, rate16) = broker_load(&sock, &path, 16, per16);
    let c16 = cpu(pid);
    let cpu1 = (c1 - c0) / per1 as u32;
    let cpu16 = (c16 - c1) / (16 * per16) as u32;
    let p50_1 = p50(lat1);
    let p50_16 = p50(lat16);

    // Audit verify.
    let (verify_rows, verify_ratios) = verify_rows(&home, records);

    let floor = raw_rt + fsync;
    println!("| measure | value |");
    println!("| --- | --- |");
    println!("| raw Unix-socket round trip, p50 | {:.1} µs |", us(raw_rt));
    println!("| one append + fdatasync, p50 | {:.1} µs |", us(fsync));
    println!(
        "| floor: raw round trip + one fsync | {:.1} µs |",
        us(floor)
    );
    println!("| broker round trip, 1 caller, p50 | {:.1} µs |", us(p50_1));
    println!("| broker, 1 caller | {rate1:.0} calls/s |");
    println!(
        "| broker round trip, 16 callers, p50 | {:.1} µs |",
        us(p50_16)
    );
    println!("| broker, 16 callers | {rate16:.0} calls/s |");
    println!(
        "| brokerd CPU per call, 1 / 16 callers | {:.0} µs / {:.0} µs |",
        us(cpu1),
        us(cpu16)
    );
    for r in verify_rows {
        println!("{r}");
    }
    print_leak(if quick { 50 } else { 500 });
    println!();
    println!(
        "ratio p50(1 caller) / floor = {:.2} (target <= 2)",
        p50_1.as_secs_f64() / floor.as_secs_f64()
    );
    println!(
        "ratio calls/s 16 callers / 1 caller = {:.2} (target >= 5)",
        rate16 / rate1
    );
    for r in verify_ratios {
        println!("{r}");
    }
}
