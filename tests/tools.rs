//! Declared tools on the dev box, as an owner adds one (`docs/tools.md`): the MCP reference
//! server `mcp-server-time` (`MCP_SERVER_TIME`, installed by `.ci/peers`) configured in
//! brokerd.toml, `bxctl tools ask` printing its tools as entries that trust nothing, one chosen
//! and labelled by the owner, `bxctl tools list` showing it, and a chat turn whose model calls it
//! through loopd and the broker, its result in the session with the declared label.

use std::fs;
use std::path::Path;

use boxmaker_e2e::{DEADLINE, DevBox, said};

const SCRIPT: &str = r#"
[[step]]
after = "user"
tool_calls = [{ tool = "now", args = { timezone = "Etc/UTC" } }]

[[step]]
after = "tool"
text = "That is the time."
"#;

fn append(path: &Path, text: &str) {
    let mut all = fs::read_to_string(path).unwrap();
    all.push_str(text);
    fs::write(path, all).unwrap();
}

#[test]
fn an_owner_adds_a_declared_tool_and_a_turn_calls_it_through_the_broker() {
    let Some(program) = bxtest::mcp_server_time() else {
        return;
    };
    let b = DevBox::new();
    let script = b.beside("script.toml");
    fs::write(&script, SCRIPT).unwrap();
    // The box is up: the server is asked as brokerd's user, which exists while it is.
    b.up(&["--script", script.to_str().unwrap()]);
    let config = b.home().join("etc/brokerd.toml");
    append(
        &config,
        &format!(
            "\n[tool_servers.time]\ncommand = [{:?}, \"--local-timezone\", \"Etc/UTC\"]\nread_paths = {}\n",
            program.display().to_string(),
            serde_json::json!(bxtest::venv_read_paths(&program))
        ),
    );

    // What the server offers, as entries that trust nothing (the running brokerd reads its
    // configuration again only when restarted).
    let out = b.bxctl(&["tools", "ask", "--server", "time"]);
    assert!(out.status.success(), "{}", said(&out));
    let asked: toml::Table = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let mut entry = asked["declared_tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some("get_current_time"))
        .expect("get_current_time offered")
        .as_table()
        .unwrap()
        .clone();
    assert_eq!(entry["untrusted"].as_bool(), Some(true));
    // The owner's choices.
    for (k, v) in [
        ("name", "now"),
        ("tool", "get_current_time"),
        ("description", "The current time in an IANA timezone."),
        ("reads", "public"),
        ("effect", "none"),
        ("approval", "never"),
    ] {
        entry.insert(k.into(), toml::Value::String(v.into()));
    }
    let declared = toml::to_string(&toml::Table::from_iter([(
        "declared_tools".to_string(),
        toml::Value::Array(vec![toml::Value::Table(entry)]),
    )]))
    .unwrap();
    append(&config, &format!("\n{declared}"));

    let out = b.bxctl(&["tools", "list"]);
    assert!(out.status.success(), "{}", said(&out));
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        listed.lines().any(|l| l.starts_with("now ")
            && l.ends_with(
                "declared, on server time: reads public, untrusted, effect none, approval never"
            )),
        "{listed}"
    );
    assert!(listed.contains("workspace_read"), "{listed}");

    // A running brokerd offers what it started with: restarted, it offers `now`.
    let out = b.bxctl(&["dev", "restart"]);
    assert!(out.status.success(), "{}", said(&out));
    let out = b
        .bxctl_in_background(&["chat", "--session", "t1", "what time is it?"])
        .finish(DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("That is the time."), "{}", said(&out));
    // The chain's result record carries the declared label: what the tool returned may be
    // third-party text, so the session is untrusted now.
    let chain = fs::read_to_string(b.home().join("broker/audit/chain.jsonl")).unwrap();
    let result = chain
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["session"] == "t1" && r["event"] == "result" && r["tool"] == "now")
        .unwrap_or_else(|| panic!("no result of now in the chain:\n{chain}"));
    assert_eq!(result["detail"]["class"], "public", "{result}");
    assert_eq!(result["detail"]["untrusted_output"], true, "{result}");
}
