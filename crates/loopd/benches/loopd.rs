//! loopd's benchmarks (`cargo bench -p loopd`), each with the floor it is compared with measured
//! in the same run:
//!
//! - turn overhead: a resumed turn with three broker tool calls and a final answer, against
//!   the socket round trips and fsyncs such a turn waits on; the difference is loopd's own time.
//! - session resume: `Session::open` of logs of 50 000 and 100 000 records (records/s, and how
//!   close to linear).

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bxcore::deadline::Deadline;
use bxcore::{
    CallId, ChatMessage, DataClass, Envelope, InferReply, Message, ToolCall, ToolDef, ToolResponse,
    Tools, Turn, Usage, read_frame, write_frame,
};
use bxharden::daemon::DaemonConfig;
use loopd::broker_port::BrokerPort;
use loopd::channel::Context;
use loopd::config::Config;
use loopd::infer::Client;
use loopd::session::{Record, Session};
use loopd::tools::Registry;

const WAIT: Duration = Duration::from_secs(30);

fn reply(s: &mut UnixStream, id: u64, msg: Message) {
    write_frame(s, &Envelope::new(id, true, msg)).unwrap();
}

/// A server on `path` that answers each connection's one frame with `answer`.
fn fake<F>(path: &Path, answer: F)
where
    F: Fn(&Envelope) -> Message + Send + Sync + 'static,
{
    let listener = UnixListener::bind(path).unwrap();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let mut s = s.unwrap();
            let answer = Arc::clone(&answer);
            std::thread::spawn(move || {
                let read = read_frame(&mut Deadline::new(&s, Instant::now() + WAIT));
                if let Ok(env) = read {
                    let msg = answer(&env);
                    reply(&mut s, env.id, msg);
                }
            });
        }
    });
}

/// The model: three calls of `echo` when the last message is the user's, else a short answer.
fn model(env: &Envelope) -> Message {
    let Message::InferRequest(req) = &env.msg else {
        return Message::pong("inferproxy", "bench");
    };
    let tool_calls = match req.messages.last() {
        Some(ChatMessage::User { .. }) => (0..3)
            .map(|i| ToolCall {
                call: CallId(req.first_call.0 + i),
                tool: "echo".to_string(),
                args: serde_json::json!({"n": i}),
            })
            .collect(),
        _ => Vec::new(),
    };
    let text = if tool_calls.is_empty() { "done" } else { "" };
    Message::InferReply(InferReply {
        message: ChatMessage::Assistant {
            text: text.to_string(),
            tool_calls,
        },
        usage: Usage::default(),
    })
}

fn broker(env: &Envelope) -> Message {
    match &env.msg {
        Message::ToolsList {} => Message::Tools(Tools {
            tools: vec![ToolDef {
                name: "echo".to_string(),
                description: "echo".to_string(),
                parameters: serde_json::json!({"type": "object"}),
            }],
            workspace: Vec::new(),
        }),
        _ => Message::ToolResponse(ToolResponse::Result {
            content: "echoed".to_string(),
            class: DataClass::Public,
            untrusted: false,
        }),
    }
}

fn run_turn(socket: &Path, session: &str) {
    let mut s = UnixStream::connect(socket).unwrap();
    let msg = Message::Turn(Turn {
        session: bxcore::SessionId::new(session).unwrap(),
        resume: false,
        text: "go".to_string(),
    });
    write_frame(&mut s, &Envelope::new(1, true, msg)).unwrap();
    loop {
        let env = read_frame(&mut Deadline::new(&s, Instant::now() + WAIT)).unwrap();
        if env.last {
            assert!(matches!(env.msg, Message::TurnDone(_)), "{:?}", env.msg);
            return;
        }
    }
}

/// One request and its answer on a fresh connection: what each socket exchange costs.
fn round_trip(socket: &Path, msg: &Message) {
    let mut s = UnixStream::connect(socket).unwrap();
    write_frame(&mut s, &Envelope::new(1, true, msg.clone())).unwrap();
    read_frame(&mut Deadline::new(&s, Instant::now() + WAIT)).unwrap();
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn turn_overhead(place: &str, home: tempfile::TempDir) {
    std::fs::create_dir_all(home.path().join("loop/sessions")).unwrap();
    let infer = home.path().join("infer.sock");
    let broker_sock = home.path().join("broker.sock");
    fake(&infer, model);
    fake(&broker_sock, broker);
    let cfg = Config::parse(&format!(
        "[paths]\nhome = {:?}\n[loop]\ncontext_tokens = 100000000\n",
        home.path().display().to_string()
    ))
    .unwrap();
    let client = Client::new(infer.clone(), WAIT);
    let port = BrokerPort::new(broker_sock.clone(), WAIT);
    let ctx = Arc::new(Context::new(cfg, client, Box::new(port), Registry::new()));
    let socket = home.path().join("loop.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let served = bxharden::serve::Socket::<bxcore::layout::LoopRequest>::new(
        listener,
        bxharden::PeerPolicy::own(&bxcore::layout::LOOP.file()),
        bxharden::serve::Limits::of(&bxcore::layout::LOOP),
    );
    std::thread::spawn(move || {
        // The turn as a worker serves it, in this process (the worker's start is `make
        // bench`'s devbox `workers` row).
        bxharden::serve::accept_here(served, move |s, id, r| match r {
            bxcore::layout::LoopRequest::Turn(turn) => {
                loopd::channel::serve_turn(s, id, turn, None, &ctx, None)
            }
            bxcore::layout::LoopRequest::Health => {}
        })
    });
    // Each turn starts its own session, so every turn does the same work (a resumed session
    // grows, and its whole history travels in each inference request).
    let n = 300;
    for i in 0..20 {
        run_turn(&socket, &format!("warm{i}"));
    }
    // The floor: what such a turn waits on. 1 channel exchange, 1 tools_list, 2 inferences,
    // 3 tool calls: 7 socket exchanges; and the same file work as a new session's turn, alone:
    // create the log, write and sync its first line, sync the directory, then two more appended
    // and synced lines (the assistant message that names calls, the turn's end). Measured
    // interleaved with the turns, so both see the same load on a shared machine.
    let ping = Message::Ping {};
    let floor_dir = home.path().join("floor");
    std::fs::create_dir_all(&floor_dir).unwrap();
    let dir = std::fs::File::open(&floor_dir).unwrap();
    let line = vec![b'x'; 200];
    let (mut turns, mut trips, mut files, mut own) = (vec![], vec![], vec![], vec![]);
    for i in 0..n {
        let t = Instant::now();
        run_turn(&socket, &format!("s{i}"));
        let turn = t.elapsed();
        let t = Instant::now();
        for _ in 0..7 {
            round_trip(&infer, &ping);
        }
        let trip = t.elapsed();
        let t = Instant::now();
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(floor_dir.join(format!("f{i}.jsonl")))
            .unwrap();
        f.write_all(&line).unwrap();
        f.sync_data().unwrap();
        dir.sync_all().unwrap();
        for _ in 0..2 {
            f.write_all(&line).unwrap();
            f.sync_data().unwrap();
        }
        let file = t.elapsed();
        turns.push(turn);
        trips.push(trip);
        files.push(file);
        own.push(turn.as_secs_f64() - (trip + file).as_secs_f64());
    }
    let turn = median(turns);
    let trip = median(trips);
    let fs_work = median(files);
    let floor = trip + fs_work;
    own.sort_by(f64::total_cmp);
    let own = own[own.len() / 2];
    println!("| turn overhead (3 tool calls), home on {place} | value |");
    println!("| --- | --- |");
    println!("| turn, median of {n} | {turn:?} |");
    println!("| 7 socket exchanges (floor) | {trip:?} |");
    println!(
        "| a new log's file work: create, 3 synced lines, 1 directory fsync (floor) | {fs_work:?} |"
    );
    println!("| floor: the two together | {floor:?} |");
    println!(
        "| loopd's own time per turn (median of turn - floor, paired) | {:.3} ms (target < 1 ms: {}) |",
        own * 1000.0,
        if own < 0.001 { "met" } else { "NOT met" }
    );
    println!(
        "| ratio turn / floor | {:.2} |",
        turn.as_secs_f64() / floor.as_secs_f64()
    );
    println!();
}

fn write_session(dir: &Path, name: &str, records: u64) {
    let id = bxcore::SessionId::new(name).unwrap();
    let mut s = Session::create(dir, &id, "main", "you are the box").unwrap();
    let mut turn = 0;
    while s.records() < records {
        turn += 1;
        let call = s.next_call();
        s.append(&Record::User {
            turn,
            text: "what time is it?".to_string(),
            key: None,
        })
        .unwrap();
        s.append(&Record::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall {
                call,
                tool: "time_now".to_string(),
                args: serde_json::json!({}),
            }],
        })
        .unwrap();
        s.append(&Record::Tool {
            call,
            tool: "time_now".to_string(),
            outcome: bxcore::Outcome::Result,
            text: "{\"utc\":\"2026-11-30T08:00:00.000Z\"}".to_string(),
        })
        .unwrap();
        s.append(&Record::TurnEnd {
            turn,
            usage: Usage::default(),
            at: bxcore::Timestamp::now(),
            error: None,
        })
        .unwrap();
    }
    s.sync().unwrap();
}

fn session_resume() {
    let dir = tempfile::tempdir().unwrap();
    println!("| session resume | records | median open | records/s |");
    println!("| --- | --- | --- | --- |");
    let mut rates = Vec::new();
    for (name, records) in [("half", 50_000u64), ("full", 100_000u64)] {
        write_session(dir.path(), name, records);
        let id = bxcore::SessionId::new(name).unwrap();
        let times: Vec<Duration> = (0..7)
            .map(|_| {
                let t = Instant::now();
                let s = Session::open(dir.path(), &id, &|l| panic!("{l}")).unwrap();
                assert!(s.records() >= records);
                t.elapsed()
            })
            .collect();
        let t = median(times);
        let rate = records as f64 / t.as_secs_f64();
        rates.push(rate);
        println!("| {name} | {records} | {t:?} | {rate:.0} |");
    }
    println!(
        "| linearity (rate at 100k / rate at 50k) | | | {:.2} (target >= 500000 records/s: {}) |",
        rates[1] / rates[0],
        if rates[1] >= 500_000.0 {
            "met"
        } else {
            "NOT met"
        }
    );
}

fn main() {
    // `cargo test --benches` runs this binary with `--bench`-less arguments; only measure when
    // asked to.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    turn_overhead("the disk", tempfile::tempdir().unwrap());
    // On tmpfs an fsync costs next to nothing, so what is left beside the socket exchanges is
    // loopd's own time, without the disk's noise.
    if Path::new("/dev/shm").is_dir() {
        turn_overhead("tmpfs", tempfile::tempdir_in("/dev/shm").unwrap());
    }
    session_resume();
}
