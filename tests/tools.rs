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

/// A line of the owner's own in brokerd.toml, which bxctl's edits keep.
const NOTE: &str = "# The owner's note: the time server, for the calendar's sake.";

/// `bxctl tools add`, as the owner chooses for the time server's tool they read, whose digest
/// `bxctl tools ask` printed as `digest`.
fn add_args(digest: &str) -> Vec<String> {
    [
        "tools",
        "add",
        "--server",
        "time",
        "--tool",
        "get_current_time",
        "--digest",
        digest,
        "--name",
        "now",
        "--description",
        "The current time in an IANA timezone.",
        "--reads",
        "public",
        "--effect",
        "none",
        "--approval",
        "never",
    ]
    .map(String::from)
    .to_vec()
}

/// The time server's `get_current_time` as `bxctl tools ask` prints it.
fn asked_time(b: &DevBox) -> toml::Table {
    let out = b.bxctl(&["tools", "ask", "--server", "time"]);
    assert!(out.status.success(), "{}", said(&out));
    let asked: toml::Table = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    asked["declared_tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["tool"].as_str() == Some("get_current_time"))
        .expect("get_current_time offered")
        .as_table()
        .unwrap()
        .clone()
}

/// `[tool_servers.time]` at the end of brokerd.toml `config`, under the owner's [`NOTE`]: the
/// reference server `program`, as an owner configures it.
fn add_time_server(config: &Path, program: &Path) {
    let mut all = fs::read_to_string(config).unwrap();
    all.push_str(&format!(
        "\n{NOTE}\n[tool_servers.time]\ncommand = [{:?}, \"--local-timezone\", \"Etc/UTC\"]\n\
         read_paths = {}\n",
        program.display().to_string(),
        serde_json::json!(bxtest::venv_read_paths(program))
    ));
    fs::write(config, all).unwrap();
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
    add_time_server(&config, &program);

    // What the server offers, as entries that trust nothing (the running brokerd reads its
    // configuration again only when restarted).
    let entry = asked_time(&b);
    assert_eq!(entry["untrusted"].as_bool(), Some(true));
    let digest = entry["digest"].as_str().unwrap().to_string();
    // The owner's choices, declared by bxctl into brokerd.toml, the owner's own lines kept.
    let add = add_args(&digest);
    let out = b.bxctl(&add.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("now is declared in") && said(&out).contains("restart brokerd"),
        "{}",
        said(&out)
    );
    // The server's words about its arguments are not what the model is told.
    assert!(said(&out).contains("were left out"), "{}", said(&out));
    let written = fs::read_to_string(&config).unwrap();
    assert!(written.contains(NOTE), "{written}");
    assert!(!written.contains("IANA timezone name (e.g."), "{written}");

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

    // What bxctl refuses changes nothing, and says why.
    let before = fs::read(&config).unwrap();
    let with = |changes: &[(&str, &str)]| {
        let mut args = add_args(&digest);
        for (flag, v) in changes {
            let at = args.iter().position(|a| a == flag).unwrap();
            args[at + 1] = v.to_string();
        }
        args
    };
    for (args, why, anchor) in [
        (
            with(&[("--tool", "get_weather")]),
            "the server time offers no tool \"get_weather\"; it offers ",
            "tools-edit-refused",
        ),
        (
            with(&[]),
            "a tool \"now\" is declared already",
            "tools-edit-refused",
        ),
        (
            with(&[("--name", "later"), ("--digest", &"0".repeat(64))]),
            "describes \"get_current_time\" otherwise than the tool you read",
            "tools-edit-refused",
        ),
        (
            with(&[("--name", "web_fetch")]),
            "brokerd check refused the change",
            "broker-config-invalid",
        ),
        (
            vec![
                "tools".into(),
                "remove".into(),
                "--name".into(),
                "never-declared".into(),
            ],
            "no tool \"never-declared\" is declared",
            "tools-edit-refused",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = b.bxctl(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", said(&out));
        assert!(said(&out).contains(why), "{why}: {}", said(&out));
        let line = String::from_utf8_lossy(&out.stderr);
        assert!(
            line.trim_end()
                .ends_with(&format!("see docs/runbook.md#{anchor}")),
            "{line}"
        );
        assert_eq!(
            fs::read(&config).unwrap(),
            before,
            "{args:?} changed brokerd.toml"
        );
    }
    // A choice that says two things is refused before anything is asked.
    let args = with(&[("--name", "later"), ("--effect", "egress")]);
    let out = b.bxctl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("--effect egress needs --egress-max CLASS"),
        "{}",
        said(&out)
    );
    assert_eq!(fs::read(&config).unwrap(), before);
    let leftovers: Vec<_> = fs::read_dir(config.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Removed, it is offered no more (once brokerd restarts), the owner's lines kept.
    let out = b.bxctl(&["tools", "remove", "--name", "now"]);
    assert!(out.status.success(), "{}", said(&out));
    let written = fs::read_to_string(&config).unwrap();
    assert!(
        written.contains(NOTE) && !written.contains("[[declared_tools]]"),
        "{written}"
    );
    let out = b.bxctl(&["tools", "list"]);
    assert!(
        !String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with("now ")),
        "{}",
        said(&out)
    );
}

#[test]
fn a_brokerd_toml_the_system_writes_is_not_edited_and_the_nixos_entry_is_printed() {
    let Some(program) = bxtest::mcp_server_time() else {
        return;
    };
    if !bxtest::is_root() {
        bxtest::skip("a read-only brokerd.toml is made with a mount of its own, as root");
        return;
    }
    let b = DevBox::new();
    b.up(&[]);
    let config = b.home().join("etc/brokerd.toml");
    add_time_server(&config, &program);
    let digest = asked_time(&b)["digest"].as_str().unwrap().to_string();
    let before = fs::read(&config).unwrap();
    // As the device has it: a file this user may not write (a read-only mount of its own).
    let bxctl = boxmaker_e2e::bin_dir().join("bxctl");
    let home = b.home().display().to_string();
    let script = format!(
        "mount --bind -o ro {c} {c} && mount -o remount,bind,ro {c} && exec {bxctl} \"$@\"",
        c = config.display(),
        bxctl = bxctl.display()
    );
    let mut args = vec!["-m", "sh", "-c", &script, "sh"];
    let add = add_args(&digest);
    args.extend(add.iter().map(String::as_str));
    args.extend(["--home", &home]);
    let out = bxtest::run(
        std::process::Command::new("unshare").args(&args),
        "bxctl tools add on a read-only brokerd.toml",
        DEADLINE,
    )
    .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("is written by NixOS, not edited here")
            && printed.contains("services.boxmaker.settings.brokerd.declared_tools"),
        "{printed}"
    );
    // The entry, in Nix, for the NixOS configuration.
    for field in [
        "name = \"now\";",
        "tool = \"get_current_time\";",
        "reads = \"public\";",
        "untrusted = true;",
        "parameters = {",
    ] {
        assert!(printed.contains(field), "{field}: {printed}");
    }
    assert_eq!(fs::read(&config).unwrap(), before);
}

#[test]
fn a_restart_with_a_brokerd_toml_that_does_not_load_leaves_the_box_running() {
    let b = DevBox::new();
    b.up(&[]);
    let config = b.home().join("etc/brokerd.toml");
    let mut text = fs::read_to_string(&config).unwrap();
    text.push_str("\n[tool_servers.memory]\ncommand = [\"/bin/true\"]\nmemroy_mb = 4096\n");
    fs::write(&config, text).unwrap();
    let out = b.bxctl(&["dev", "restart"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let line = String::from_utf8_lossy(&out.stderr);
    assert!(
        line.contains(
            "brokerd's configuration does not load, so the running dev box was left as it is"
        ) && line.contains("memroy_mb")
            && line
                .trim_end()
                .ends_with("see docs/runbook.md#broker-config-invalid"),
        "{line}"
    );
    // Still up: every daemon answers.
    let out = b.bxctl(&["status"]);
    assert!(out.status.success(), "{}", said(&out));
}
