//! memoryd in the dev box, through the real daemons and `bxctl`: a finished turn is filed to the
//! owner's main memory, recalled into a later session, shown, searched and forgotten by the
//! owner; a stopped memoryd never holds up a turn; `dev up --honcho-url` files into a real
//! Honcho (read back through Honcho's own API), and refuses a bad URL, a key file memoryd would
//! not take, and another store than the home has, each before anything changes.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use boxmaker_e2e::{DEADLINE, DevBox, said};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

fn chat(b: &DevBox, session: &str, text: &str) {
    let out = b.bxctl(&["chat", "--new", "--session", session, text]);
    assert!(out.status.success(), "chat: {}", said(&out));
}

fn memories(b: &DevBox, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["memory"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = b.bxctl(&all);
    assert!(
        out.status.success(),
        "bxctl memory {args:?}: {}",
        said(&out)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["memories"].as_array().unwrap().clone()
}

fn wait_filed(b: &DevBox, route: &str, session: &str) {
    bxtest::wait_for(
        &format!("session {session}'s turn filed to {route}"),
        DEADLINE,
        || {
            memories(b, &["recent", "--route", route])
                .iter()
                .any(|m| m["session"] == session)
        },
    );
}

fn session_log(b: &DevBox, session: &str) -> String {
    std::fs::read_to_string(b.home().join(format!("loop/sessions/{session}.jsonl"))).unwrap()
}

#[test]
fn a_turn_filed_to_main_memory_is_recalled_into_a_later_session() {
    let b = DevBox::new();
    b.up(&[]);
    chat(&b, "cat", "My cat is called Biscuit.");
    wait_filed(&b, "main", "cat");
    chat(&b, "later", "What do you remember about Biscuit?");
    let log = session_log(&b, "later");
    let recall = log
        .lines()
        .find(|l| l.contains(r#""type":"recall""#))
        .unwrap_or_else(|| panic!("no recall record in the new session's log:\n{log}"));
    assert!(recall.contains("My cat is called Biscuit."), "{recall}");
    assert!(recall.contains("[session cat, turn 1]"), "{recall}");
    // The recall comes before the user's text, which still starts the turn.
    let user_at = log.find("What do you remember").unwrap();
    assert!(log.find(r#""type":"recall""#).unwrap() < user_at, "{log}");
}

#[test]
fn the_owner_lists_searches_and_forgets_what_memoryd_filed() {
    let b = DevBox::new();
    b.up(&[]);
    chat(&b, "garden", "The tomatoes in the garden need water.");
    wait_filed(&b, "main", "garden");
    let found = memories(&b, &["search", "tomatoes"]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["route"], "main");
    assert!(memories(&b, &["recent", "--route", "quarantine"]).is_empty());
    let out = b.bxctl(&["memory", "recent"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("garden turn 1 [main, private]"), "{text}");
    let out = b.bxctl(&["memory", "forget", "--session", "garden", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["turns"], 1);
    assert_eq!(v["queued"], false);
    assert!(memories(&b, &["search", "tomatoes"]).is_empty());
}

#[test]
fn bxctl_memory_refuses_a_bad_session_id_or_route_with_usage_and_no_words_with_bad_message() {
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["memory", "forget", "--session", "../etc"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let out = b.bxctl(&["memory", "recent", "--route", "elsewhere"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let out = b.bxctl(&["memory", "search", "?!", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "bad_message");
}

#[test]
fn status_shows_memoryd_its_store_and_its_outbox() {
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["status", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let store = v["memory"]["store"].as_str().unwrap();
    assert!(store.contains("memory/local/memory.sqlite3"), "{store}");
    assert_eq!(v["memory"]["outbox"], 0);
    let out = b.bxctl(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("memory: the embedded store"), "{text}");
    assert!(text.contains("memories.sock"), "{text}");
}

#[test]
fn a_stopped_memoryd_never_holds_up_a_turn_and_its_turns_are_filed_when_it_runs_again() {
    let b = DevBox::new();
    b.up(&[]);
    let pid = Pid::from_raw(b.pid("memoryd").unwrap() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // The turn ends although memoryd answers nothing: recall gives up at `recall_ms`.
    chat(&b, "while-stopped", "Remember the blue boat.");
    kill(pid, Signal::SIGCONT).unwrap();
    let log = std::fs::read_to_string(b.home().join("logs/loopd.log")).unwrap();
    assert_eq!(
        log.matches("see docs/runbook.md#memory-recall-unavailable")
            .count(),
        1,
        "{log}"
    );
    wait_filed(&b, "main", "while-stopped");
}

/// The Honcho store the home's marker records.
fn honcho_of(b: &DevBox) -> bxctl::dev::HonchoChoice {
    let home = bxctl::dev::DevHome::new(b.home()).unwrap();
    let marker = home.read_marker().unwrap().expect("a dev box's marker");
    marker.honcho.expect("the home has a Honcho store")
}

/// The texts Honcho holds for `session` in `workspace`, read through its own API (an empty
/// list while the session is not there yet).
fn honcho_texts(reader: &honcho::Client, workspace: &str, session: &str) -> Vec<String> {
    let (w, s) = (
        honcho::Id::new(workspace).unwrap(),
        honcho::Id::new(session).unwrap(),
    );
    reader
        .messages_of(&w, &s, None)
        .map(|m| m.into_iter().map(|m| m.content).collect())
        .unwrap_or_default()
}

/// Chat one private turn in `session` and wait until Honcho's main-memory workspace holds it.
fn files_into_honcho(b: &DevBox, reader: &honcho::Client, session: &str, text: &str) {
    let h = honcho_of(b);
    chat(b, session, text);
    bxtest::wait_for(
        &format!(
            "session {session}'s turn in Honcho's workspace {}",
            h.workspace
        ),
        DEADLINE,
        || {
            honcho_texts(reader, &h.workspace, session)
                .iter()
                .any(|t| t == text)
        },
    );
    // Main memory, never quarantine: the session read nothing untrusted.
    let q = format!("{}-quarantine", h.workspace);
    assert!(honcho_texts(reader, &q, session).is_empty());
    let out = b.bxctl(&["status"]);
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("Honcho"), "{status}");
}

#[test]
fn dev_up_with_a_honcho_url_files_a_private_turn_into_honchos_main_memory() {
    let Some(url) = bxtest::honcho_url() else {
        return;
    };
    let b = DevBox::new();
    let out = b.up(&["--honcho-url", &url]);
    let said_up = String::from_utf8_lossy(&out.stdout);
    assert!(said_up.contains("memory:  Honcho at"), "{said_up}");
    let config = fs::read_to_string(b.home().join("etc/memoryd.toml")).unwrap();
    assert!(config.contains("[honcho]"), "{config}");
    assert!(!config.contains("key_file"), "{config}");
    // Confined as on the device with a remote Honcho: IP sockets in its seccomp list (and
    // Landlock's TCP connect to the URL's port alone, which bxharden's sandbox tests prove for
    // every network profile).
    let log = fs::read_to_string(b.home().join("logs/memoryd.log")).unwrap();
    assert!(log.contains("fully enforced, seccomp memoryd+net"), "{log}");
    let reader = honcho::Client::new(
        honcho::BaseUrl::parse(&url).unwrap(),
        None,
        honcho::Options::default(),
    );
    files_into_honcho(
        &b,
        &reader,
        "heron",
        "A heron fishes in the pond every morning.",
    );
}

#[test]
fn dev_up_with_a_honcho_key_file_gives_memoryd_alone_a_copy_and_files_into_honcho_with_its_auth_on()
{
    let Some((url, token_file)) = bxtest::honcho_auth() else {
        return;
    };
    let b = DevBox::new();
    // The owner's key file, its owner's alone.
    let key = b.beside("honcho.jwt");
    fs::copy(&token_file, &key).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let token = fs::read_to_string(&key).unwrap().trim().to_string();
    let key_arg = key.display().to_string();
    let out = b.up(&["--honcho-url", &url, "--honcho-key-file", &key_arg]);
    let reader = honcho::Client::new(
        honcho::BaseUrl::parse(&url).unwrap(),
        Some(honcho::Token::read(&key).unwrap()),
        honcho::Options::default(),
    );
    files_into_honcho(
        &b,
        &reader,
        "otter",
        "The otter sleeps under the old bridge.",
    );

    // memoryd's copy: 0600, memoryd's user's (or, with no users per daemon, the caller's).
    let copy = b.home().join("memory/honcho.key");
    let meta = fs::metadata(&copy).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600, "{}", copy.display());
    let uid = b
        .user("memoryd")
        .map_or_else(|| nix::unistd::getuid().as_raw(), |u| u.1);
    assert_eq!(meta.uid(), uid);
    assert_eq!(fs::read_to_string(&copy).unwrap().trim(), token);
    // The configuration names the copy, never the token; no log and no line of dev up has it.
    let config = fs::read_to_string(b.home().join("etc/memoryd.toml")).unwrap();
    assert!(config.contains(&copy.display().to_string()), "{config}");
    for (what, text) in [
        ("dev up's output", said(&out)),
        ("memoryd.toml", config),
        (
            "the marker",
            fs::read_to_string(b.home().join("dev/box.toml")).unwrap(),
        ),
    ] {
        assert!(!text.contains(&token), "{what} holds the token");
    }
    for entry in fs::read_dir(b.home().join("logs")).unwrap() {
        let path = entry.unwrap().path();
        let log = fs::read_to_string(&path).unwrap_or_default();
        assert!(!log.contains(&token), "{} holds the token", path.display());
    }
}

/// `dev up` with `flags` on `b`'s fresh home: refused as a flag is (exit 2), saying `says` and
/// pointing at `anchor`, and nothing made, not even the home.
fn refused_on_a_fresh_home(b: &DevBox, flags: &[&str], says: &str, anchor: &str) {
    let out = b.try_up(flags);
    assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", said(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(says), "{flags:?}: {err}");
    assert!(
        err.trim_end()
            .ends_with(&format!("see docs/runbook.md#{anchor}")),
        "{flags:?}: {err}"
    );
    assert!(!b.home().exists(), "{flags:?}: nothing is made");
}

#[test]
fn dev_up_refuses_a_honcho_url_that_is_not_a_servers_base_before_anything_is_made() {
    let b = DevBox::new();
    for (url, says) in [
        (
            "ftp://127.0.0.1:8765",
            "it must start with http:// or https://",
        ),
        ("127.0.0.1:8765", "it must start with http:// or https://"),
        ("http://", "it names no host"),
        ("http://127.0.0.1:0", "the port is not 1 to 65535"),
        ("http://127.0.0.1:70000", "the port is not 1 to 65535"),
        ("http://127.0.0.1:8765/v3", "give the server's base only"),
        (
            "http://user:pw@127.0.0.1:8765",
            "credentials in the URL are refused",
        ),
    ] {
        refused_on_a_fresh_home(&b, &["--honcho-url", url], says, "honcho-config");
    }
    refused_on_a_fresh_home(
        &b,
        &["--honcho-key-file", "/nonexistent/key"],
        "--honcho-key-file goes with --honcho-url",
        "honcho-config",
    );
}

#[test]
fn dev_up_refuses_a_missing_or_open_honcho_key_file_before_anything_is_made() {
    let b = DevBox::new();
    let url = "http://127.0.0.1:8765";
    let missing = b.beside("missing.key").display().to_string();
    refused_on_a_fresh_home(
        &b,
        &["--honcho-url", url, "--honcho-key-file", &missing],
        &format!("cannot read the Honcho key file {missing}"),
        "honcho-key-missing",
    );
    let empty = b.beside("empty.key");
    fs::write(&empty, "\n").unwrap();
    fs::set_permissions(&empty, fs::Permissions::from_mode(0o600)).unwrap();
    let empty = empty.display().to_string();
    refused_on_a_fresh_home(
        &b,
        &["--honcho-url", url, "--honcho-key-file", &empty],
        "is empty",
        "honcho-key-missing",
    );
    // A key others may read is refused, as memoryd refuses it, and never shown.
    let open = b.beside("open.key");
    fs::write(&open, "a-token-others-may-read\n").unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o644)).unwrap();
    let open_arg = open.display().to_string();
    let out = b.try_up(&["--honcho-url", url, "--honcho-key-file", &open_arg]);
    assert!(
        !said(&out).contains("a-token-others-may-read"),
        "{}",
        said(&out)
    );
    refused_on_a_fresh_home(
        &b,
        &["--honcho-url", url, "--honcho-key-file", &open_arg],
        "has mode 0644",
        "honcho-key-open",
    );
}

/// Every file of the home's `etc/` and `dev/box.toml`, by name.
fn settings(home: &Path) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = fs::read_dir(home.join("etc"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.display().to_string(), fs::read_to_string(&p).unwrap()))
        .collect();
    all.push((
        "dev/box.toml".into(),
        fs::read_to_string(home.join("dev/box.toml")).unwrap(),
    ));
    all.sort();
    all
}

#[test]
fn a_reused_home_keeps_its_memory_store_and_refuses_another_saying_which_with_nothing_changed() {
    // A server memoryd may connect to but that never answers: only `dev up` and `down` matter.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let there = format!("http://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let elsewhere = format!("http://127.0.0.1:{}", other.local_addr().unwrap().port());

    // A home with the embedded store refuses a Honcho.
    let embedded = DevBox::new();
    embedded.up(&[]);
    let down = embedded.down();
    assert!(down.status.success(), "{}", said(&down));
    let before = settings(embedded.home());
    let out = embedded.try_up(&["--honcho-url", &there]);
    assert!(!out.status.success(), "{}", said(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("--honcho-url {there}, not the embedded store")),
        "{err}"
    );
    assert_eq!(settings(embedded.home()), before, "nothing changed");
    assert!(embedded.pid("memoryd").is_none(), "nothing started");

    // A home with a Honcho refuses another, and another key; no flag keeps its own.
    let key = embedded.beside("k1");
    fs::write(&key, "token-one\n").unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let key2 = embedded.beside("k2");
    fs::write(&key2, "token-two\n").unwrap();
    fs::set_permissions(&key2, fs::Permissions::from_mode(0o600)).unwrap();
    let (key, key2) = (key.display().to_string(), key2.display().to_string());
    let remote = DevBox::new();
    remote.up(&["--honcho-url", &there, "--honcho-key-file", &key]);
    let down = remote.down();
    assert!(down.status.success(), "{}", said(&down));
    let before = settings(remote.home());
    for (flags, says) in [
        (
            vec!["--honcho-url", elsewhere.as_str()],
            format!("--honcho-url {elsewhere}, not {there}"),
        ),
        (
            vec![
                "--honcho-url",
                there.as_str(),
                "--honcho-key-file",
                key2.as_str(),
            ],
            format!("--honcho-key-file {key2}, not {key}"),
        ),
    ] {
        let out = remote.try_up(&flags);
        assert!(!out.status.success(), "{flags:?}: {}", said(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&says), "{flags:?}: {err}");
        assert!(err.contains("use another --home"), "{err}");
        assert_eq!(
            settings(remote.home()),
            before,
            "{flags:?}: nothing changed"
        );
        assert!(
            remote.pid("memoryd").is_none(),
            "{flags:?}: nothing started"
        );
        assert_eq!(
            fs::read_to_string(remote.home().join("memory/honcho.key")).unwrap(),
            "token-one\n"
        );
    }
    let again = remote.up(&[]);
    assert!(
        String::from_utf8_lossy(&again.stdout).contains(&format!("memory:  Honcho at {there}")),
        "{}",
        said(&again)
    );
    assert_eq!(settings(remote.home()), before, "the same store as before");
}
