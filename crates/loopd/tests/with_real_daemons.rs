//! loopd against the real inferproxy (its `script` provider) and the real brokerd: a turn with a
//! core tool call, a turn whose tool call brokerd decides and runs, `loopd selftest` finding
//! both, and a scripted model that tries to run `curl` (stopped by the sandbox, or denied by the
//! owner's list, with the audit chain saying which).
//!
//! They are other packages: their binaries are beside loopd's when the workspace was built
//! (`cargo test --workspace`, as the gate runs). Built alone (`cargo test -p loopd`), these tests
//! say `skipped` and pass.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bxcore::{CallId, Message, Outcome, TurnEvent};
use support::daemon::{Layout, Loopd, config, run};
use support::{last_msg, turn};

type Guard = bxtest::Daemon;

/// `bin serve --config <home>/<name>.toml` with `cfg` as that file, its stderr in
/// `<home>/<name>.log`: running once `socket` answers `ping`, stopped when the guard is dropped.
fn serve(bin: &Path, home: &Path, name: &str, cfg: &str, socket: &Path) -> Guard {
    let config = home.join(format!("{name}.toml"));
    std::fs::write(&config, cfg).unwrap();
    let log = home.join(format!("{name}.log"));
    let mut guard = Guard::spawn(bin, "serve", &config, &log);
    guard
        .wait_ready("ping", || {
            bxcore::client::ping(socket, Duration::from_secs(5)).is_ok()
        })
        .unwrap_or_else(|e| panic!("{e}"));
    guard
}

fn sibling(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_BIN_EXE_loopd")).with_file_name(name);
    p.is_file().then_some(p)
}

const SCRIPT: &str = r#"
[[step]]
text = "Let me look at the clock."
tool_calls = [{ tool = "time_now", args = {} }]

[[step]]
after = "tool"
text = "The clock says {last_tool}"
"#;

fn start_inferproxy(bin: &Path, home: &Path, layout: &Layout, script: &str) -> Guard {
    std::fs::write(home.join("script.toml"), script).unwrap();
    let cfg = format!(
        "[paths]\nhome = {home:?}\n[provider]\nkind = \"script\"\nscript = {script:?}\n\
         [slots.main]\nmodel = \"scripted\"\nmax_tokens = 100\ncontext_tokens = 10000\n\
         [sandbox]\nrequire = false\n",
        home = home.display().to_string(),
        script = home.join("script.toml").display().to_string(),
    );
    serve(bin, home, "inferproxy", &cfg, &layout.infer)
}

#[test]
fn a_turn_with_the_real_inferproxy_and_its_script_provider() {
    let Some(bin) = sibling("inferproxy") else {
        bxtest::skip("the inferproxy binary is not built (run the workspace's tests)");
        return;
    };
    let home = support::home();
    let layout = Layout::new(home.path());
    let _proxy = start_inferproxy(&bin, home.path(), &layout, SCRIPT);
    let d = Loopd::start(home.path(), &config(home.path(), ""));
    let frames = turn(&d.socket, 1, "e2e", false, "what time is it?");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{:?}\n{}",
        last_msg(&frames),
        std::fs::read_to_string(home.path().join("inferproxy.log")).unwrap_or_default()
    );
    let events: Vec<TurnEvent> = frames
        .iter()
        .filter_map(|f| match &f.msg {
            Message::TurnEvent { event } => Some(event.clone()),
            _ => None,
        })
        .collect();
    assert!(events.iter().any(
        |e| matches!(e, TurnEvent::ToolCall { call: CallId(1), tool, .. } if tool == "time_now")
    ));
    assert!(events.iter().any(|e| matches!(
        e,
        TurnEvent::ToolResult {
            call: CallId(1),
            outcome: Outcome::Result,
            ..
        }
    )));
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::AssistantText { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(text.starts_with("Let me look at the clock."), "{text}");
    assert!(text.contains("The clock says {\"unix_ms\":"), "{text}");

    let (code, out) = run(home.path(), &config(home.path(), ""), "selftest");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("selftest: inferproxy"), "{out}");
}

fn start_brokerd(bin: &Path, home: &Path, layout: &Layout) -> Guard {
    std::fs::create_dir_all(home.join("inbox")).unwrap();
    let cfg = format!(
        "[paths]\nhome = {home:?}\n[sandbox]\nrequire = false\n\n\
         [[workspace.roots]]\npath = {notes:?}\nclass = \"private\"\nwritable = true\n\n\
         [[workspace.roots]]\npath = {inbox:?}\nclass = \"private\"\nuntrusted = true\n",
        home = home.display().to_string(),
        notes = home.join("notes").display().to_string(),
        inbox = home.join("inbox").display().to_string(),
    );
    serve(bin, home, "brokerd", &cfg, &layout.broker)
}

#[test]
fn a_tool_call_decided_and_run_by_the_real_brokerd() {
    let (Some(proxy_bin), Some(broker_bin)) = (sibling("inferproxy"), sibling("brokerd")) else {
        bxtest::skip("the inferproxy or brokerd binary is not built (run the workspace's tests)");
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let home_path = home.path().canonicalize().unwrap();
    std::fs::create_dir_all(home_path.join("notes")).unwrap();
    std::fs::write(home_path.join("notes/a.txt"), "buy milk").unwrap();
    let layout = Layout::new(&home_path);
    let script = format!(
        "[[step]]\ntext = \"Reading.\"\n\
         tool_calls = [{{ tool = \"workspace_read\", args = {{ path = {:?} }} }}]\n\n\
         [[step]]\nafter = \"tool\"\ntext = \"It says: {{last_tool}}\"\n",
        home_path.join("notes/a.txt").display().to_string()
    );
    let _proxy = start_inferproxy(&proxy_bin, &home_path, &layout, &script);
    let _broker = start_brokerd(&broker_bin, &home_path, &layout);
    let extra = format!(
        "[broker]\nsocket = {:?}\n",
        layout.broker.display().to_string()
    );
    let cfg = config(&home_path, &extra);
    let d = Loopd::start(&home_path, &cfg);
    let frames = turn(&d.socket, 1, "e2e", false, "what is in a.txt?");
    let logs = || {
        format!(
            "{}\n{}",
            std::fs::read_to_string(home_path.join("brokerd.log")).unwrap_or_default(),
            d.log_text()
        )
    };
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{:?}\n{}",
        last_msg(&frames),
        logs()
    );
    let events: Vec<TurnEvent> = frames
        .iter()
        .filter_map(|f| match &f.msg {
            Message::TurnEvent { event } => Some(event.clone()),
            _ => None,
        })
        .collect();
    assert!(
        events.iter().any(|e| matches!(
            e,
            TurnEvent::ToolResult { call: CallId(1), outcome: Outcome::Result, text, outage: None } if text.contains("buy milk")
        )),
        "{events:?}\n{}",
        logs()
    );
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::AssistantText { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(text.contains("It says:"), "{text}");
    assert!(text.contains("buy milk"), "{text}");

    let (code, out) = run(&home_path, &cfg, "selftest");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("selftest: brokerd"), "{out}");
    assert!(out.contains("brokerd offers"), "{out}");
}

#[test]
fn an_approval_asked_by_the_real_brokerd_reaches_the_channel_and_the_turn_waits_for_it() {
    use bxcore::deadline::Deadline;
    use bxcore::{ApprovalDecision, Envelope, Turn, read_frame, write_frame};
    let (Some(proxy_bin), Some(broker_bin)) = (sibling("inferproxy"), sibling("brokerd")) else {
        bxtest::skip("the inferproxy or brokerd binary is not built (run the workspace's tests)");
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path().canonicalize().unwrap();
    std::fs::create_dir_all(h.join("notes")).unwrap();
    std::fs::create_dir_all(h.join("inbox")).unwrap();
    std::fs::write(h.join("inbox/mail.txt"), "a stranger's mail").unwrap();
    let layout = Layout::new(&h);
    // Reading the untrusted inbox makes the session untrusted; its write then waits for the owner.
    let script = format!(
        "[[step]]\ntext = \"\"\ntool_calls = [{{ tool = \"workspace_read\", args = {{ path = {read:?} }} }}]\n\n\
         [[step]]\nafter = \"tool\"\ntext = \"\"\n\
         tool_calls = [{{ tool = \"workspace_write\", args = {{ path = {write:?}, content = \"noted\" }} }}]\n\n\
         [[step]]\nafter = \"tool\"\ntext = \"Done: {{last_tool}}\"\n",
        read = h.join("inbox/mail.txt").display().to_string(),
        write = h.join("notes/n.txt").display().to_string(),
    );
    let _proxy = start_inferproxy(&proxy_bin, &h, &layout, &script);
    let _broker = start_brokerd(&broker_bin, &h, &layout);
    let cfg = config(
        &h,
        &format!(
            "[broker]\nsocket = {:?}\n",
            layout.broker.display().to_string()
        ),
    );
    let d = Loopd::start(&h, &cfg);
    let mut c = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    write_frame(
        &mut c,
        &Envelope::new(
            3,
            true,
            Message::Turn(Turn {
                session: support::sid("ask"),
                resume: false,
                text: "file my mail".to_string(),
            }),
        ),
    )
    .unwrap();
    let until = std::time::Instant::now() + support::WAIT;
    let approval = loop {
        let env = read_frame(&mut Deadline::new(&c, until)).unwrap();
        assert!(!env.last, "{:?}", env.msg);
        if let Message::TurnEvent {
            event: TurnEvent::ToolPending { call, approval, .. },
        } = env.msg
        {
            assert_eq!(call, CallId(2));
            break approval;
        }
    };
    assert!(
        !h.join("notes/n.txt").exists(),
        "nothing written before the owner says so"
    );
    let admin = h.join("run/owner-broker/admin.sock");
    let ack = bxcore::client::call(
        &admin,
        support::WAIT,
        1,
        Message::ApprovalDecision(ApprovalDecision {
            approval,
            allow: true,
            lease: false,
            approver: None,
        }),
        |_| {},
    )
    .unwrap();
    assert!(matches!(ack, Message::ApprovalAck(_)), "{ack:?}");
    let rest = support::read_all(&c);
    assert!(
        matches!(last_msg(&rest), Message::TurnDone(_)),
        "{:?}",
        last_msg(&rest)
    );
    assert!(rest.iter().any(|f| matches!(
        &f.msg,
        Message::TurnEvent {
            event: TurnEvent::ToolResult {
                call: CallId(2),
                outcome: Outcome::Result,
                ..
            }
        }
    )));
    assert_eq!(
        std::fs::read_to_string(h.join("notes/n.txt")).unwrap(),
        "noted"
    );
}

/// brokerd with the `run` tool (`[run]` and `run_extra` added to its config).
fn start_brokerd_with_run(bin: &Path, home: &Path, layout: &Layout, run_extra: &str) -> Guard {
    std::fs::create_dir_all(home.join("notes")).unwrap();
    let cfg = format!(
        "[paths]\nhome = {home:?}\n[sandbox]\nrequire = false\n\n\
         [[workspace.roots]]\npath = {notes:?}\nclass = \"private\"\nwritable = true\n\n\
         [run]\n{run_extra}\n",
        home = home.display().to_string(),
        notes = home.join("notes").display().to_string(),
    );
    serve(bin, home, "brokerd", &cfg, &layout.broker)
}

/// A scripted model that asks to run `curl` against a listener on loopback, through the real
/// inferproxy, loopd and brokerd: the tool result the turn shows, and the audit chain's records
/// of that call.
fn a_model_runs_curl(run_extra: &str) -> Option<(TurnEvent, Vec<serde_json::Value>)> {
    let (Some(proxy_bin), Some(broker_bin)) = (sibling("inferproxy"), sibling("brokerd")) else {
        bxtest::skip("the inferproxy or brokerd binary is not built (run the workspace's tests)");
        return None;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path().canonicalize().unwrap();
    let layout = Layout::new(&h);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let script = format!(
        "[[step]]\ntext = \"Fetching it.\"\n\
         tool_calls = [{{ tool = \"run\", args = {{ argv = [\"curl\", \"-s\", {url:?}], cwd = {cwd:?} }} }}]\n\n\
         [[step]]\nafter = \"tool\"\ntext = \"It said: {{last_tool}}\"\n",
        cwd = h.join("notes").display().to_string(),
    );
    let _proxy = start_inferproxy(&proxy_bin, &h, &layout, &script);
    let _broker = start_brokerd_with_run(&broker_bin, &h, &layout, run_extra);
    let cfg = config(
        &h,
        &format!(
            "[broker]\nsocket = {:?}\n",
            layout.broker.display().to_string()
        ),
    );
    let d = Loopd::start(&h, &cfg);
    let frames = turn(&d.socket, 1, "curl", false, "fetch my page");
    assert!(
        matches!(last_msg(&frames), Message::TurnDone(_)),
        "{:?}\n{}",
        last_msg(&frames),
        std::fs::read_to_string(h.join("brokerd.log")).unwrap_or_default()
    );
    assert!(
        // bounded: the listener is non-blocking, so accept answers at once
        listener.accept().is_err(),
        "a connection reached the loopback listener"
    );
    let result = frames
        .iter()
        .find_map(|f| match &f.msg {
            Message::TurnEvent {
                event: e @ TurnEvent::ToolResult { .. },
            } => Some(e.clone()),
            _ => None,
        })
        .expect("a tool result");
    let chain: Vec<serde_json::Value> = std::fs::read_to_string(h.join("broker/audit/chain.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r["tool"] == "run")
        .collect();
    Some((result, chain))
}

#[test]
fn a_model_that_runs_curl_is_stopped_by_the_sandbox_and_the_chain_says_how() {
    let Some((result, chain)) = a_model_runs_curl("") else {
        return;
    };
    match result {
        TurnEvent::ToolResult { outcome, text, .. } => {
            assert_eq!(outcome, Outcome::Result);
            assert!(text.starts_with("ended by SIGSYS"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    let events: Vec<&str> = chain.iter().map(|r| r["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["requested", "allowed", "result"]);
    assert_eq!(
        chain[2]["detail"]["ended"],
        "ended by SIGSYS: it made a system call its sandbox refuses"
    );
}

#[test]
fn a_model_that_runs_curl_off_the_owners_list_is_denied_and_the_chain_says_why() {
    let Some((result, chain)) = a_model_runs_curl("programs = [\"cat\", \"git\"]\n") else {
        return;
    };
    match result {
        TurnEvent::ToolResult { outcome, text, .. } => {
            assert_eq!(outcome, Outcome::Denied);
            assert!(text.contains("curl is not on the owner's list"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    let events: Vec<&str> = chain.iter().map(|r| r["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["requested", "denied"]);
    assert!(
        chain[1]["detail"]["reason"]
            .as_str()
            .unwrap()
            .contains("curl is not on the owner's list of programs the run tool may start"),
        "{}",
        chain[1]
    );
}
