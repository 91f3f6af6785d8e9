//! memoryd's benchmark (`cargo bench -p memoryd`): the real `memoryd serve` and `brokerd serve`
//! (release builds, beside this benchmark) on a temporary home under `target/` (a real disk:
//! fsync on tmpfs would be free), measuring, with the floor each is compared with:
//!
//! - **filing**: turns handed over (`turn_record`, each on its own connection, answered once
//!   durable in the outbox) and filed into the embedded store (the outbox drained), turns/s;
//!   floor: one write + fsync + rename + directory fsync, as the outbox does per turn;
//! - **recall**: `memory_recall` of a one-sentence query over a store of those turns, p50 and
//!   p99 (each asks brokerd's state.sock first);
//! - **resident memory** of memoryd (`VmRSS`): idle after start, and after the filing and
//!   recall load. The target is 5 MB idle with the embedded store.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bxcore::client;
use bxcore::{ChatMessage, MemoryRecall, Message, SessionId, TurnRecord};

const WAIT: Duration = Duration::from_secs(60);

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait(); // bounded: killed just before
    }
}

fn release(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is missing: `cargo build --release --workspace --bins` first (make bench does)",
        p.display()
    );
    p
}

fn start(bin: &Path, config: &Path, log: &Path, sockets: &[PathBuf]) -> Guard {
    let child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let until = Instant::now() + WAIT;
    for s in sockets {
        while client::ping(s, Duration::from_secs(5)).is_err() {
            assert!(Instant::now() < until, "{} did not come up", bin.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Guard(child)
}

fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn record(session: &str, turn: u64) -> TurnRecord {
    let topics = [
        "garden", "boat", "invoice", "holiday", "cat", "piano", "train", "recipe",
    ];
    let topic = topics[(turn as usize) % topics.len()];
    TurnRecord {
        session: SessionId::new(session).unwrap(),
        turn,
        messages: vec![
            ChatMessage::User {
                text: format!(
                    "Turn {turn}: a note about the {topic}, and what to do with it next week."
                ),
            },
            ChatMessage::Assistant {
                text: format!("Noted about the {topic}; I will remind you on Monday."),
                tool_calls: vec![],
            },
        ],
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let turns: u64 = if quick { 200 } else { 2_000 };
    let recalls = if quick { 200 } else { 2_000 };
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-memoryd");
    fs::create_dir_all(&base).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("run-")
        .tempdir_in(&base)
        .unwrap();
    let home = dir.path().canonicalize().unwrap();
    let common = format!(
        "[paths]\nhome = {:?}\n\n[sandbox]\nrequire = false\n",
        home.display().to_string()
    );
    fs::write(home.join("brokerd.toml"), &common).unwrap();
    fs::write(home.join("memoryd.toml"), &common).unwrap();
    let state = home.join("run/memory-broker/state.sock");
    let memory = home.join("run/loop-memory/memory.sock");
    let memories = home.join("run/owner-memory/memories.sock");
    let _b = start(
        &release("brokerd"),
        &home.join("brokerd.toml"),
        &home.join("brokerd.log"),
        &[state],
    );
    let m = start(
        &release("memoryd"),
        &home.join("memoryd.toml"),
        &home.join("memoryd.log"),
        &[memory.clone(), memories],
    );
    let pid = m.0.id();
    std::thread::sleep(Duration::from_millis(500));
    let idle = rss_kib(pid);

    // The floor: what the outbox does per turn.
    let floor_dir = home.join("floor");
    fs::create_dir_all(&floor_dir).unwrap();
    let body = serde_json::to_vec(&record("s", 1)).unwrap();
    let t = Instant::now();
    for i in 0..200 {
        let tmp = floor_dir.join(format!(".{i}.tmp"));
        let mut f = fs::File::create(&tmp).unwrap();
        f.write_all(&body).unwrap();
        f.sync_all().unwrap();
        fs::rename(&tmp, floor_dir.join(format!("{i}.json"))).unwrap();
        fs::File::open(&floor_dir).unwrap().sync_all().unwrap();
    }
    let floor = t.elapsed() / 200;

    // Filing: hand every turn over, then wait for the outbox to drain.
    let outbox = home.join("memory/outbox");
    let t = Instant::now();
    for n in 1..=turns {
        let r = record(&format!("s{}", n % 20), n);
        match client::call(&memory, WAIT, n, Message::TurnRecord(r), |_| {}) {
            Ok(Message::TurnFiled(_)) => {}
            other => panic!("turn_record: {other:?}"),
        }
    }
    let handed = t.elapsed();
    let until = Instant::now() + Duration::from_secs(600);
    while fs::read_dir(&outbox).unwrap().count() > 0 {
        assert!(Instant::now() < until, "the outbox did not drain");
        std::thread::sleep(Duration::from_millis(5));
    }
    let filed = t.elapsed();

    // Recall.
    let mut took = Vec::with_capacity(recalls);
    for i in 0..recalls {
        let q = MemoryRecall {
            session: SessionId::new("asker").unwrap(),
            query: format!(
                "what did I say about the {}?",
                ["boat", "cat", "recipe"][i % 3]
            ),
            max_tokens: 512,
        };
        let t = Instant::now();
        match client::call(&memory.clone(), WAIT, 1, Message::MemoryRecall(q), |_| {}) {
            Ok(Message::Memories(m)) => assert!(!m.memories.is_empty()),
            other => panic!("memory_recall: {other:?}"),
        }
        took.push(t.elapsed());
    }
    took.sort();
    let loaded = rss_kib(pid);

    let per_s = |n: u64, d: Duration| n as f64 / d.as_secs_f64();
    println!("memoryd, embedded store, {turns} turns, {recalls} recalls");
    println!("| measure | value |");
    println!("| --- | --- |");
    println!(
        "| floor: write + fsync + rename + dir fsync | {:.1} µs |",
        floor.as_secs_f64() * 1e6
    );
    println!(
        "| handed over (turn_filed), one connection each | {:.0} turns/s |",
        per_s(turns, handed)
    );
    println!(
        "| handed over and filed (outbox drained) | {:.0} turns/s |",
        per_s(turns, filed)
    );
    println!(
        "| recall p50 | {:.0} µs |",
        pct(&took, 0.5).as_secs_f64() * 1e6
    );
    println!(
        "| recall p99 | {:.0} µs |",
        pct(&took, 0.99).as_secs_f64() * 1e6
    );
    println!("| memoryd RSS idle | {:.1} MB |", idle as f64 / 1024.0);
    println!(
        "| memoryd RSS after the load | {:.1} MB |",
        loaded as f64 / 1024.0
    );
    println!(
        "| store file | {:.1} MB |",
        fs::metadata(home.join("memory/local/memory.sqlite3"))
            .unwrap()
            .len() as f64
            / 1e6
    );
    println!(
        "idle target (5 MB): {}",
        if idle <= 5 * 1024 { "met" } else { "NOT MET" }
    );
}
