//! inferproxy under its real sandbox, `require = true`: as root it drops to `nobody` (the test
//! home given to that user); as another user it keeps its uid. Either way it must serve a real
//! streamed inference over TCP to the provider's port, and every thread must show seccomp,
//! no-new-privileges and no capabilities.

mod common;

use bxcore::Message;
use common::*;
use serde_json::json;

fn stream() -> Answer {
    let chunks = [
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "sand"}, "finish_reason": null}]}).to_string(),
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "boxed"}, "finish_reason": "stop"}]}).to_string(),
    ];
    let events = openai_events(&chunks.iter().map(String::as_str).collect::<Vec<_>>());
    Answer::sse(&events.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn inferproxy_serves_inside_its_real_sandbox() {
    let root = nix::unistd::Uid::effective().is_root();
    let p = Provider::start(vec![stream()]);
    let home = tempfile::tempdir().unwrap();
    write_private(&home.path().join("key"), KEY);
    let sandbox = if root {
        // The home belongs to the user the daemon drops to; root (this test) is its one peer.
        for entry in [home.path().to_path_buf(), home.path().join("key")] {
            std::os::unix::fs::chown(&entry, Some(65534), Some(65534)).unwrap();
        }
        "[sandbox]\nuser = \"nobody\"\nrequire = true\n\n[peers]\n\"infer.sock\" = [0]\n"
    } else {
        "[sandbox]\nrequire = true\n"
    };
    let config = format!(
        r#"
[paths]
home = "{{home}}"

[provider]
kind = "openai"
base_url = "{}"
api_key_file = "{{home}}/key"

[slots.main]
model = "gpt-test"
max_tokens = 100
context_tokens = 100000

{sandbox}"#,
        p.base_url("/v1")
    );
    let d = Daemon::start_in(home, &config, &[], true).unwrap_or_else(|e| panic!("{e}"));
    let frames = d.ask(
        1,
        Message::InferRequest(bxcore::InferRequest {
            slot: "main".into(),
            messages: vec![bxcore::ChatMessage::User { text: "hi".into() }],
            tools: vec![],
            first_call: bxcore::CallId(1),
        }),
    );
    let Message::InferReply(r) = &frames.last().unwrap().msg else {
        panic!("{frames:?}\n{}", d.log_text())
    };
    assert_eq!(
        r.message,
        bxcore::ChatMessage::Assistant {
            text: "sandboxed".into(),
            tool_calls: vec![]
        }
    );
    assert_eq!(
        p.seen()[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );

    let log = d.log_text();
    assert!(log.contains("Landlock ABI"), "{log}");
    assert!(!log.contains("NOT APPLIED"), "{log}");
    let (uid, gid) = if root {
        (65534, 65534)
    } else {
        (
            nix::unistd::Uid::effective().as_raw(),
            nix::unistd::Gid::effective().as_raw(),
        )
    };
    let threads = bxharden::proc_status::threads(d.pid()).unwrap();
    for t in &threads {
        let problems: Vec<String> = t
            .problems(uid, gid)
            .into_iter()
            // A user's own bounding set and groups are left as they are; only a drop from root
            // clears them.
            .filter(|p| root || !(p.starts_with("CapBnd") || p.starts_with("Groups")))
            .collect();
        assert!(problems.is_empty(), "{t}: {problems:?}");
    }
    let threads = threads.len();
    // The main thread and the accept thread at least.
    assert!(threads >= 2, "{threads}");
    assert!(
        bxcore::client::ping(&d.socket, bxtest::DEADLINE).is_ok(),
        "still serving"
    );
}
