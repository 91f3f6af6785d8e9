//! kill -9 while eight clients make calls: after the restart the chain verifies (a torn tail,
//! if the kill made one, recovered) and every call that got a `result` has its raise on disk.

mod support;

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use bxcore::{CallId, Message, SessionId, ToolRequest, ToolResponse};
use serde_json::json;
use support::*;

#[test]
fn kill_9_under_load_loses_no_raise_and_leaves_a_chain_that_verifies() {
    let h = Home::new("");
    fs::write(h.dir("vault").join("k.txt"), "secret").unwrap();
    h.write_config(&format!(
        "[[workspace.roots]]\npath = {:?}\nclass = \"secret\"\nuntrusted = true\n",
        h.home.join("vault").display().to_string()
    ));
    // A few rounds, each killed at a different point.
    for round in 0..3u64 {
        let mut b = Brokerd::start(&h);
        let answered: Arc<Mutex<Vec<String>>> = Arc::default();
        let results = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let path = h.home.join("vault/k.txt").display().to_string();
        let mut clients = Vec::new();
        for c in 0..8u64 {
            let (answered, results, stop) = (answered.clone(), results.clone(), stop.clone());
            let sock = h.broker_sock();
            let path = path.clone();
            clients.push(thread::spawn(move || {
                for n in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    // A fresh session per call: each result is one raise to find on disk.
                    let session = format!("r{round}-c{c}-n{n}");
                    let Ok(mut s) = std::os::unix::net::UnixStream::connect(&sock) else {
                        return;
                    };
                    let req = bxcore::Envelope::new(
                        n,
                        true,
                        Message::ToolRequest(ToolRequest {
                            session: SessionId::new(session.clone()).unwrap(),
                            call: CallId(n),
                            tool: "workspace_read".into(),
                            args: json!({ "path": path }),
                        }),
                    );
                    if bxcore::write_frame(&mut s, &req).is_err() {
                        return;
                    }
                    let r = read_all(&s);
                    match r.last().map(|e| &e.msg) {
                        Some(Message::ToolResponse(ToolResponse::Result { .. })) => {
                            answered.lock().unwrap().push(session);
                            results.fetch_add(1, Ordering::SeqCst);
                        }
                        _ => return,
                    }
                }
            }));
        }
        // Kill at a point that differs per round and per run.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as usize;
        let kill_after = 20 + (nanos % 60) + round as usize * 15;
        wait_until("enough results before the kill", || {
            results.load(Ordering::SeqCst) >= kill_after
        });
        b.kill();
        stop.store(true, Ordering::SeqCst);
        for c in clients {
            bxtest::join(c, "a client of the killed brokerd");
        }
        let answered = answered.lock().unwrap().clone();
        assert!(answered.len() >= kill_after);
        for session in &answered {
            let text = fs::read_to_string(h.state_file(session))
                .unwrap_or_else(|e| panic!("{session} got a result but has no state: {e}"));
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                v,
                json!({"taint": "secret", "untrusted": true}),
                "{session}"
            );
        }
        // Restart: the chain is verified (a torn tail recovered), and it serves.
        let mut again = Brokerd::start(&h);
        let (code, out, err) = run(&[
            "audit",
            "verify",
            "--config",
            &h.config.display().to_string(),
        ]);
        assert_eq!(code, 0, "{out}{err}");
        // Every answered result has its `result` record.
        let with_result: std::collections::BTreeSet<String> = records(&h)
            .into_iter()
            .filter(|r| r["event"] == "result")
            .map(|r| r["session"].as_str().unwrap().to_string())
            .collect();
        for session in &answered {
            assert!(
                with_result.contains(session),
                "{session} has no result record"
            );
        }
        again.kill();
    }
}
