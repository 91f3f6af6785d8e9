//! The Honcho store's benchmark (`HONCHO_URL=http://127.0.0.1:8765 cargo bench -p memoryd
//! --bench honcho`), against the real server, each number beside the floor it is compared with,
//! measured in the same run:
//!
//! - filing: turns filed per second through `Store::file` (a turn of two messages), against the
//!   floor of the client alone filing the same two messages per turn (`add_messages`: the check
//!   of what the session holds, then the batch; two requests a turn either way).
//! - recall: `Store::recall` latency, p50 and p99, over main memory holding the filed turns,
//!   against one bare Honcho search request.
//!
//! Without `HONCHO_URL` it says so and measures nothing.

use std::time::{Duration, Instant};

use bxcore::{ChatMessage, DataClass, Label, SessionId, Timestamp, TurnRecord};
use honcho::{BaseUrl, Client, Id, MessageKey, NewMessage, Options};
use memoryd::store::{Filing, HonchoStore, Store};
use serde_json::Map;

const TURNS: u64 = 300;
const RECALLS: usize = 200;

fn client(url: &str) -> Client {
    Client::new(BaseUrl::parse(url).unwrap(), None, Options::default())
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn record(session: &SessionId, turn: u64) -> TurnRecord {
    let topics = [
        "garden", "dentist", "invoice", "holiday", "bicycle", "recipe",
    ];
    let t = topics[(turn as usize) % topics.len()];
    TurnRecord {
        session: session.clone(),
        turn,
        messages: vec![
            ChatMessage::User {
                text: format!("note {turn}: something about the {t} worth remembering"),
            },
            ChatMessage::Assistant {
                text: format!("Noted, the {t} item number {turn}."),
                tool_calls: vec![],
            },
        ],
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let Ok(url) = std::env::var("HONCHO_URL") else {
        println!("honcho bench: HONCHO_URL is not set (make honcho); nothing measured");
        return;
    };
    let state = Label {
        class: DataClass::Private,
        untrusted: false,
    };

    // The floor: the client alone, the same two messages per turn.
    let c = client(&url);
    let w = Id::new(unique("bench-floor")).unwrap();
    c.workspace(&w, Map::new()).unwrap();
    let s = c
        .create_session(&w, &Id::new("s").unwrap(), Map::new(), &[])
        .unwrap();
    let floor_start = Instant::now();
    for turn in 1..=TURNS {
        let r = record(&SessionId::new("s").unwrap(), turn);
        let batch: Vec<NewMessage> = r
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| NewMessage {
                peer: Id::new(if i == 0 { "owner" } else { "box" }).unwrap(),
                content: match m {
                    ChatMessage::User { text } | ChatMessage::Assistant { text, .. } => {
                        text.clone()
                    }
                    _ => String::new(),
                },
                key: MessageKey {
                    turn,
                    part: i as u32,
                },
                metadata: Map::new(),
            })
            .collect();
        c.add_messages(&s, &batch).unwrap();
    }
    let floor = floor_start.elapsed();

    // The store: file TURNS turns of one session into main memory.
    let main = unique("bench-main");
    let store = HonchoStore::new(
        client(&url),
        Id::new(main.clone()).unwrap(),
        Id::new(format!("{main}-quarantine")).unwrap(),
    );
    let session = SessionId::new("bench").unwrap();
    let start = Instant::now();
    for turn in 1..=TURNS {
        let r = record(&session, turn);
        store
            .file(&Filing {
                record: &r,
                route: bxcore::MemoryRoute::Main,
                state,
                received: Timestamp::now(),
            })
            .unwrap();
    }
    let filing = start.elapsed();

    // Recall over what was filed, against one bare search.
    let queries = [
        "what did I say about the dentist?",
        "anything on the garden",
        "the invoice and the holiday",
    ];
    let mut lat = Vec::with_capacity(RECALLS);
    let mut bare = Vec::with_capacity(RECALLS);
    let mw = Id::new(main).unwrap();
    for i in 0..RECALLS {
        let q = queries[i % queries.len()];
        let t = Instant::now();
        let got = store.recall(q, 1000).unwrap();
        lat.push(t.elapsed());
        assert!(!got.is_empty(), "recall found nothing for {q:?}");
        let t = Instant::now();
        c.search(&mw, "dentist", 20, None).unwrap();
        bare.push(t.elapsed());
    }
    lat.sort();
    bare.sort();

    println!("## memoryd's Honcho store against {url}\n");
    println!("| measure | value | floor | ratio |");
    println!("| --- | --- | --- | --- |");
    let per_s = |d: Duration| TURNS as f64 / d.as_secs_f64();
    println!(
        "| turns filed per second (2 messages a turn, {TURNS} turns) | {:.0} | {:.0} (a check and a batch per turn, client alone) | {:.2} |",
        per_s(filing),
        per_s(floor),
        per_s(floor) / per_s(filing)
    );
    println!(
        "| recall, p50 | {} | {} (one search) | {:.1} |",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&bare, 0.5)),
        percentile(&lat, 0.5).as_secs_f64() / percentile(&bare, 0.5).as_secs_f64()
    );
    println!(
        "| recall, p99 | {} | {} (one search) | {:.1} |",
        ms(percentile(&lat, 0.99)),
        ms(percentile(&bare, 0.99)),
        percentile(&lat, 0.99).as_secs_f64() / percentile(&bare, 0.99).as_secs_f64()
    );
}
