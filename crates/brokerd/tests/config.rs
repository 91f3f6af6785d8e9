//! brokerd.toml: defaults, every key, and what is refused (with `brokerd check` saying so).

mod support;

use std::path::Path;

use brokerd::config::Config;
use support::*;

fn parse(text: &str) -> Result<Config, String> {
    bxharden::daemon::parse::<Config>(Path::new("brokerd.toml"), text).map_err(|e| e.to_string())
}

#[test]
fn the_sockets_and_files_default_under_home() {
    let c = parse("[paths]\nhome = \"/h\"\n").unwrap();
    assert_eq!(
        c.broker_socket(),
        Path::new("/h/run/loop-broker/broker.sock")
    );
    assert_eq!(
        c.admin_socket(),
        Path::new("/h/run/owner-broker/admin.sock")
    );
    assert_eq!(
        c.state_socket(),
        Path::new("/h/run/memory-broker/state.sock")
    );
    assert_eq!(c.state_dir(), Path::new("/h/broker/sessions"));
    assert_eq!(c.chain_path(), Path::new("/h/broker/audit/chain.jsonl"));
    assert_eq!(c.lock_path(), Path::new("/h/broker/audit/lock"));
    assert_eq!(c.approvals.ttl_ms, 600_000);
    assert!(c.sandbox.require);
    assert!(c.gateway.socket.is_none());
}

#[test]
fn every_key_is_read() {
    let c = parse(
        r#"
[paths]
home = "/h"
[sockets]
broker = "/s/b.sock"
admin = "/s/a.sock"
state = "/s/st.sock"
[peers]
"broker.sock" = ["bx-loop", 1000]
[approvals]
ttl_ms = 5000
[[workspace.roots]]
path = "/srv/notes"
class = "private"
writable = true
[[workspace.roots]]
path = "/srv/mail"
class = "secret"
untrusted = true
[tools.web_fetch]
approval = "always"
reads = "private"
[tools.workspace_write]
enabled = false
[gateway]
socket = "/s/g.sock"
[sandbox]
user = "bx-broker"
require = false
"#,
    )
    .unwrap();
    assert_eq!(c.broker_socket(), Path::new("/s/b.sock"));
    assert_eq!(c.admin_socket(), Path::new("/s/a.sock"));
    assert_eq!(c.state_socket(), Path::new("/s/st.sock"));
    assert_eq!(c.approvals.ttl_ms, 5000);
    assert_eq!(c.workspace.roots.len(), 2);
    assert!(c.workspace.roots[1].untrusted && !c.workspace.roots[1].writable);
    assert_eq!(c.gateway.socket.as_deref(), Some(Path::new("/s/g.sock")));
    assert!(c.registry().unwrap().get("workspace_write").is_none());
}

#[test]
fn what_is_refused() {
    for (text, want) in [
        ("[paths]\nhome = \"rel\"\n", "is not an absolute path"),
        ("[paths]\nhome = \"/h\"\nsurprise = 1\n", "unknown field"),
        (
            "[paths]\nhome = \"/h\"\n[sockets]\nstat = \"/x\"\n",
            "unknown field",
        ),
        (
            "[paths]\nhome = \"/h\"\n[approvals]\nttl_ms = 0\n",
            "ttl_ms = 0",
        ),
        (
            "[paths]\nhome = \"/h\"\n[approvals]\nttl_ms = 86400001\n",
            "a day",
        ),
        (
            "[paths]\nhome = \"/h\"\n[tools.shell]\n",
            "there is no tool named \"shell\"",
        ),
        (
            "[paths]\nhome = \"/h\"\n[tools.web_fetch]\nuntrusted_output = false\n",
            "can only tighten",
        ),
        (
            "[paths]\nhome = \"/h\"\n[[workspace.roots]]\npath = \"notes\"\nclass = \"private\"\n",
            "not an absolute",
        ),
        (
            "[paths]\nhome = \"/h\"\n[[workspace.roots]]\npath = \"/a\"\nclass = \"private\"\nwritabel = true\n",
            "unknown field",
        ),
        (
            "[paths]\nhome = \"/h\"\n[peers]\n\"loop.sock\" = [1]\n",
            "loop.sock",
        ),
        (
            "[paths]\nhome = \"/h\"\n[gateway]\nsocket = \"gw.sock\"\n",
            "[gateway] socket",
        ),
        (
            "[paths]\nhome = \"/h\"\n[[workspace.roots]]\npath = \"/a\"\nclass = \"topsecret\"\n",
            "unknown variant",
        ),
    ] {
        let e = parse(text).unwrap_err();
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn a_workspace_root_that_holds_the_box_is_refused() {
    let root = |path: &str| {
        format!(
            "[paths]\nhome = \"/h\"\n[sockets]\nadmin = \"/s/admin/a.sock\"\n\
             [[workspace.roots]]\npath = {path:?}\nclass = \"private\"\nwritable = true\n"
        )
    };
    for (path, why) in [
        ("/", "holds the box's home /h"),
        ("/h", "holds the box's home /h"),
        ("/h/broker", "lies in /h/broker, the box's own state"),
        ("/h/broker/audit", "lies in /h/broker, the box's own state"),
        ("/h/memory/local", "lies in /h/memory, the box's own state"),
        ("/h/run", "lies in /h/run, the box's own state"),
        ("/s/admin", "lies in /s/admin, the box's own state"),
    ] {
        let e = parse(&root(path)).unwrap_err();
        assert!(e.contains(why), "{path}: {e}");
        assert!(
            e.contains("name a directory of the owner's files"),
            "{path}: {e}"
        );
    }
    // The owner's own directories, inside the home or not, are roots.
    for path in ["/h/workspace/notes", "/home/me/notes", "/h/brokerage"] {
        parse(&root(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

#[test]
fn a_workspace_root_that_links_into_the_box_is_refused() {
    let h = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(h.path().join("broker/audit")).unwrap();
    let link = h.path().join("notes");
    std::os::unix::fs::symlink(h.path().join("broker"), &link).unwrap();
    let text = format!(
        "[paths]\nhome = {:?}\n[[workspace.roots]]\npath = {:?}\nclass = \"private\"\n",
        h.path().display().to_string(),
        link.display().to_string()
    );
    let e = parse(&text).unwrap_err();
    assert!(e.contains("/broker, the box's own state"), "{e}");
}

#[test]
fn check_prints_what_it_would_serve_and_exits_0() {
    let h = Home::new("");
    let (code, out, err) = run(&["check", "--config", &h.config.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&h.broker_sock().display().to_string()),
        "{out}"
    );
    assert!(out.contains(&h.state_sock().display().to_string()), "{out}");
    assert!(
        out.contains("tools offered: workspace_list, workspace_read, workspace_write\n"),
        "{out}"
    );
    assert!(
        out.contains("web_fetch: no gateway is configured, so it is not offered"),
        "{out}"
    );
}

#[test]
fn check_and_serve_refuse_a_bad_config_with_the_runbook_line() {
    let h = Home::new("[tools.shell]\n");
    let (code, _, err) = run(&["check", "--config", &h.config.display().to_string()]);
    assert_eq!(code, 1);
    assert!(err.contains("there is no tool named"), "{err}");
    assert!(
        err.trim_end()
            .ends_with("see docs/runbook.md#broker-config-invalid"),
        "{err}"
    );
    let mut b = Brokerd::spawn(&h);
    assert_eq!(b.wait_exit(), 1);
    assert!(b.stderr().contains("broker-config-invalid"));
    assert!(
        !h.home.join("broker").exists(),
        "a refused config changes nothing"
    );
}

#[test]
fn check_fails_on_a_missing_root() {
    let h = Home::new(
        "[[workspace.roots]]\npath = \"/nonexistent/boxmaker-test\"\nclass = \"private\"\n",
    );
    let (code, out, _) = run(&["check", "--config", &h.config.display().to_string()]);
    assert_eq!(code, 1);
    assert!(out.contains("MISSING"), "{out}");
}

#[test]
fn the_socket_names_are_the_layouts() {
    use bxcore::layout;
    assert_eq!(brokerd::broker::SOCKET, layout::BROKER.file());
    assert_eq!(brokerd::admin::SOCKET, layout::ADMIN.file());
    assert_eq!(brokerd::state_socket::SOCKET, layout::STATE.file());
    assert_eq!(brokerd::decide::SOCKET, layout::DECIDE.file());
}

#[test]
fn the_command_line_offers_serve_check_and_audit_and_refuses_a_missing_config() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("The box's tool broker\n"), "{out}");
    let serve = out.find("  serve  Serve broker.sock, admin.sock, state.sock and decide.sock");
    let check = out.find("  check  Load and check the configuration and the files it names");
    let audit = out.find("  audit  The audit chain");
    assert!(
        serve.is_some() && check.is_some() && audit.is_some(),
        "{out}"
    );
    assert!(serve < check && check < audit, "{out}");
    let (code, out, _) = run(&["--version"]);
    assert_eq!(
        (code, out.as_str()),
        (0, concat!("brokerd ", env!("CARGO_PKG_VERSION"), "\n"))
    );
    let (code, _, err) = run(&["audit", "verify"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("Usage: brokerd audit verify --config <CONFIG>"),
        "{err}"
    );
}
