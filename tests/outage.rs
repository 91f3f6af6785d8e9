//! Issue 17, finding 5: a tool call the box could not run shows its cause to the owner. With the
//! session's broker state damaged, the model is told only that the tool broker is unavailable
//! (and goes on), while `bxctl chat` shows the owner the damaged file and its runbook entry, and
//! exits non-zero: the turn failed the owner even though the model answered.

use std::fs;

use boxmaker_e2e::{DevBox, said};

const SCRIPT: &str = r#"
[[step]]
text = "Let me read your todo list."
tool_calls = [{ tool = "workspace_read", args = { path = "@WORKSPACE@/notes/todo.txt" } }]

[[step]]
after = "tool"
text = "The tool said: {last_tool}"

[[rule]]
text = "Fine."
"#;

#[test]
fn a_damaged_broker_state_is_shown_to_the_owner_with_its_cause_and_chat_exits_non_zero() {
    let b = DevBox::new();
    let script = b.beside("script.toml");
    fs::write(&script, SCRIPT).unwrap();
    b.up(&["--script", script.to_str().unwrap()]);
    let state = b.home().join("broker/sessions/o1.json");
    fs::write(&state, "{ this is not a session state").unwrap();

    let out = b.bxctl(&["chat", "--session", "o1", "what is on my list?"]);
    let text = said(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // The model was told the plain failure, and went on.
    assert!(
        text.contains("The tool said: the tool broker is unavailable"),
        "{text}"
    );
    // The owner is told why, with the file and brokerd's own runbook entry, once.
    let because = text
        .lines()
        .find(|l| l.trim_start().starts_with("because "))
        .unwrap_or_else(|| panic!("no cause shown: {text}"));
    assert!(because.contains(&state.display().to_string()), "{because}");
    assert!(
        because.ends_with("see docs/runbook.md#broker-state-damaged"),
        "{because}"
    );
    assert_eq!(
        because.matches("see docs/runbook.md#").count(),
        1,
        "{because}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the box could not run 1 of its tool calls")
            && stderr.contains("broker-state-damaged"),
        "{stderr}"
    );
    // The file is left as it was: damage makes the broker refuse, never forget.
    assert_eq!(
        fs::read_to_string(&state).unwrap(),
        "{ this is not a session state"
    );
}
