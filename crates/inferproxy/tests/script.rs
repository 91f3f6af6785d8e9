//! The `script` provider: ordered steps, pattern rules, substitutions, and running out.

use bxcore::runbook::Anchored;
use std::path::Path;

use bxcore::{CallId, ChatMessage, InferRequest};
use inferproxy::script::Script;
use inferproxy::{Inference, Provider};
use serde_json::json;

fn inference(script: &str) -> Inference {
    let s = Script::parse(Path::new("test-script.toml"), script).unwrap();
    let slots = [(
        "main".to_string(),
        inferproxy::config::Slot {
            model: "scripted".into(),
            max_tokens: 100,
            context_tokens: 100_000,
            temperature: None,
        },
    )]
    .into_iter()
    .collect();
    Inference::new(Provider::Script(s), slots, Default::default())
}

fn req(messages: serde_json::Value, first_call: u64) -> InferRequest {
    serde_json::from_value(
        json!({"slot": "main", "first_call": first_call, "tools": [], "messages": messages}),
    )
    .unwrap()
}

fn ask(inf: &Inference, r: &InferRequest) -> (Result<serde_json::Value, String>, Vec<String>) {
    let mut pieces = Vec::new();
    let out = inf
        .infer(r, &mut |t| pieces.push(t.to_string()))
        .map(|r| serde_json::to_value(r).unwrap())
        .map_err(|e| e.pointed().to_string());
    (out, pieces)
}

const DEMO: &str = r#"
[[step]]
text = "Let me read your notes."
tool_calls = [{ tool = "workspace_read", args = { path = "notes.txt" } }]

[[step]]
after = "tool"
text = "Your notes say: {last_tool}"

[[rule]]
user = "(?i)\\bhello\\b"
text = "Hello! You said: {last_user}"

[[rule]]
user = "time"
tool_calls = [{ tool = "time_now" }]

[[rule]]
after = "tool"
text = "Done."
"#;

#[test]
fn steps_answer_in_order_then_rules_by_pattern() {
    let inf = inference(DEMO);
    let user = json!([{"role": "user", "text": "read my notes"}]);
    let (r, pieces) = ask(&inf, &req(user.clone(), 4));
    assert_eq!(
        r.unwrap(),
        json!({"message": {"role": "assistant", "text": "Let me read your notes.", "tool_calls": [
            {"call": 4, "tool": "workspace_read", "args": {"path": "notes.txt"}}]},
            "usage": {"input_tokens": 0, "output_tokens": 0}})
    );
    assert_eq!(pieces, ["Let ", "me ", "read ", "your ", "notes."]);

    let after_tool = json!([
        {"role": "user", "text": "read my notes"},
        {"role": "assistant", "text": "Let me read your notes.", "tool_calls": [{"call": 4, "tool": "workspace_read", "args": {"path": "notes.txt"}}]},
        {"role": "tool", "call": 4, "text": "buy milk"}
    ]);
    let (r, _) = ask(&inf, &req(after_tool, 5));
    assert_eq!(r.unwrap()["message"]["text"], "Your notes say: buy milk");

    // The steps are used up: rules answer, the first that matches.
    let (r, _) = ask(
        &inf,
        &req(json!([{"role": "user", "text": "Well, HELLO there"}]), 6),
    );
    assert_eq!(
        r.unwrap()["message"]["text"],
        "Hello! You said: Well, HELLO there"
    );
    let (r, _) = ask(
        &inf,
        &req(json!([{"role": "user", "text": "what time is it"}]), 6),
    );
    assert_eq!(
        r.unwrap()["message"]["tool_calls"],
        json!([{"call": 6, "tool": "time_now", "args": {}}])
    );
    // A rule is not used up: it answers again.
    let (r, _) = ask(&inf, &req(json!([{"role": "user", "text": "hello"}]), 7));
    assert_eq!(r.unwrap()["message"]["text"], "Hello! You said: hello");
}

#[test]
fn running_out_of_script_is_an_inference_error() {
    let inf = inference(DEMO);
    ask(&inf, &req(json!([{"role": "user", "text": "a"}]), 1))
        .0
        .unwrap();
    let after_tool =
        json!([{"role": "user", "text": "a"}, {"role": "tool", "call": 1, "text": "x"}]);
    ask(&inf, &req(after_tool, 2)).0.unwrap();
    let (r, pieces) = ask(
        &inf,
        &req(json!([{"role": "user", "text": "nothing matches this"}]), 3),
    );
    assert_eq!(
        r.unwrap_err(),
        "the script has no reply: all 2 steps of test-script.toml are used and no rule matches; \
         see docs/runbook.md#inference-script-exhausted"
    );
    assert!(pieces.is_empty());
}

#[test]
fn a_step_that_does_not_fit_the_conversation_is_refused() {
    let inf = inference(DEMO);
    ask(&inf, &req(json!([{"role": "user", "text": "a"}]), 1))
        .0
        .unwrap();
    // Step 2 expects a tool result; the user spoke instead.
    let (r, _) = ask(&inf, &req(json!([{"role": "user", "text": "b"}]), 2));
    let e = r.unwrap_err();
    assert!(
        e.starts_with("the script has no reply: step 2 of test-script.toml does not match"),
        "{e}"
    );
    // Nothing was used up: the right request still gets step 2.
    let after_tool =
        json!([{"role": "user", "text": "a"}, {"role": "tool", "call": 1, "text": "x"}]);
    assert_eq!(
        ask(&inf, &req(after_tool, 2)).0.unwrap()["message"]["text"],
        "Your notes say: x"
    );
}

#[test]
fn a_catch_all_rule_answers_anything() {
    let inf = inference("[[rule]]\ntext = \"I only know my script.\"\n");
    for i in 0..3 {
        let (r, _) = ask(
            &inf,
            &req(json!([{"role": "user", "text": format!("q{i}")}]), 1),
        );
        assert_eq!(r.unwrap()["message"]["text"], "I only know my script.");
    }
}

#[test]
fn bad_scripts_are_refused_with_the_reason() {
    for (text, want) in [
        ("", "no [[step]] and no [[rule]]"),
        ("[[step]]\n", "step 1 has neither text nor tool_calls"),
        (
            "[[rule]]\ntext = \"x\"\nuser = \"(\"\n",
            "rule 1: user pattern",
        ),
        (
            "[[step]]\ntool_calls = [{ tool = \"\" }]\n",
            "a tool call with no tool",
        ),
        (
            "[[step]]\ntext = \"x\"\nafter = \"model\"\n",
            "unknown variant",
        ),
        ("[[step]]\ntext = \"x\"\nwhen = \"y\"\n", "unknown field"),
        (
            "[[step]]\ntool_calls = [{ tool = \"t\", args = 5 }]\n",
            "invalid type",
        ),
    ] {
        let e = Script::parse(Path::new("s.toml"), text)
            .unwrap_err()
            .pointed()
            .to_string();
        assert!(e.contains(want), "{text:?}: {e}");
        assert!(
            e.ends_with("see docs/runbook.md#inferproxy-config-invalid"),
            "{e}"
        );
    }
}

#[test]
fn the_script_numbers_calls_from_first_call() {
    let inf = inference(
        "[[rule]]\ntool_calls = [{ tool = \"a\" }, { tool = \"b\", args = { n = 1, deep = { list = [1, \"x\"] } } }]\n",
    );
    let r = inf
        .infer(
            &req(json!([{"role": "user", "text": "go"}]), 100),
            &mut |_| {},
        )
        .unwrap();
    let ChatMessage::Assistant { tool_calls, text } = r.message else {
        panic!("not assistant");
    };
    assert_eq!(text, "");
    assert_eq!(tool_calls[0].call, CallId(100));
    assert_eq!(tool_calls[1].call, CallId(101));
    assert_eq!(
        tool_calls[1].args,
        json!({"n": 1, "deep": {"list": [1, "x"]}})
    );
}

#[test]
fn the_default_script_answers_anything() {
    let inf = inference(inferproxy::script::DEFAULT);
    let (r, _) = ask(
        &inf,
        &req(json!([{"role": "user", "text": "Hello there"}]), 1),
    );
    assert!(
        r.unwrap()["message"]["text"]
            .as_str()
            .unwrap()
            .starts_with("Hello!")
    );
    let (r, _) = ask(
        &inf,
        &req(json!([{"role": "user", "text": "What time is it?"}]), 5),
    );
    assert_eq!(
        r.unwrap()["message"]["tool_calls"],
        json!([{"call": 5, "tool": "time_now", "args": {}}])
    );
    let after = json!([
        {"role": "user", "text": "What time is it?"},
        {"role": "assistant", "text": "", "tool_calls": [{"call": 5, "tool": "time_now", "args": {}}]},
        {"role": "tool", "call": 5, "text": "2026-11-30T08:00:00Z"}
    ]);
    let (r, _) = ask(&inf, &req(after, 6));
    assert_eq!(
        r.unwrap()["message"]["text"],
        "The tool answered: 2026-11-30T08:00:00Z"
    );
    for text in ["", "anything at all", "ünïcødé", "timetable"] {
        let (r, _) = ask(&inf, &req(json!([{"role": "user", "text": text}]), 1));
        assert!(
            r.unwrap()["message"]["text"]
                .as_str()
                .unwrap()
                .starts_with("I am the box's scripted model"),
            "{text:?}"
        );
    }
}

#[test]
fn last_system_is_the_last_system_text_such_as_what_memory_recalled() {
    let inf = inference("[[rule]]\ntext = \"Given: {last_system}\"\n");
    let recalled = json!([
        {"role": "system", "text": "You are the box."},
        {"role": "system", "text": "From the owner's memory: the cat is Biscuit."},
        {"role": "user", "text": "What is my cat called?"}
    ]);
    let (r, _) = ask(&inf, &req(recalled, 1));
    assert_eq!(
        r.unwrap()["message"]["text"],
        "Given: From the owner's memory: the cat is Biscuit."
    );
    // No system text at all: the placeholder is empty.
    let (r, _) = ask(&inf, &req(json!([{"role": "user", "text": "hi"}]), 2));
    assert_eq!(r.unwrap()["message"]["text"], "Given: ");
}
