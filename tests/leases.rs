//! Leases (issue 25): the owner answers an approval with "allow for this session", and the calls
//! like it (same session, tool, place and rule) run without asking until the lease ends; each is
//! recorded in the chain with the lease and who gave it; a lease never lets through a call the
//! policy denies; `bxctl approvals --leases` lists them and `revoke` ends one. And bxctl, piped
//! into a reader that goes away, ends without a panic.

use std::fs;
use std::process::{Command, Stdio};

use boxmaker_e2e::{DEADLINE, DevBox, bin_dir, said};
use bxtest::Bounded;
use serde_json::Value;

const SCRIPT: &str = r#"
[[step]]
after = "user"
text = "Reading the mail."
tool_calls = [{ tool = "workspace_read", args = { path = "inbox/meeting.txt" } }]

[[step]]
after = "tool"
text = "Noting it."
tool_calls = [{ tool = "workspace_write", args = { path = "notes/a.txt", content = "one\n" } }]

[[step]]
after = "tool"
text = "Done one."

[[step]]
after = "user"
tool_calls = [{ tool = "workspace_write", args = { path = "notes/b.txt", content = "two\n" } }]

[[step]]
after = "tool"
text = "Done two."

[[step]]
after = "user"
tool_calls = [{ tool = "web_fetch", args = { url = "https://example.org/mail" } }]

[[step]]
after = "tool"
text = "Done three."

[[step]]
after = "user"
tool_calls = [{ tool = "workspace_read", args = { path = "secret/bank.txt" } }]

[[step]]
after = "tool"
tool_calls = [{ tool = "workspace_write", args = { path = "notes/d.txt", content = "PIN\n" } }]

[[step]]
after = "tool"
text = "Done four."
"#;

fn json(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{}", said(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(out)))
}

fn chain(b: &DevBox) -> Vec<Value> {
    fs::read_to_string(b.home().join("broker/audit/chain.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_lease_answers_the_calls_like_the_one_approved_and_nothing_else() {
    let b = DevBox::new();
    let script = b.beside("script.toml");
    fs::write(&script, SCRIPT).unwrap();
    b.up(&[
        "--script",
        script.to_str().unwrap(),
        "--web-host",
        "example.org",
    ]);
    let notes = b.home().join("workspace/notes");

    // 1. An untrusted session's write is asked; the owner approves it with a lease.
    let turn = b.bxctl_in_background(&["chat", "--session", "l1", "read my mail"]);
    bxtest::wait_for("the write to be asked", DEADLINE, || b.pending().len() == 1);
    let p = &b.pending()[0];
    let scope = p["lease_scope"].as_str().unwrap();
    assert!(
        scope.contains("workspace_write calls in root notes"),
        "{scope}"
    );
    let id = p["approval"].as_str().unwrap().to_string();
    let out = b.bxctl(&["approve", "--lease", &id]);
    assert!(out.status.success(), "{}", said(&out));
    let out = turn.finish(DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(fs::read_to_string(notes.join("a.txt")).unwrap(), "one\n");
    let leases = json(&b.bxctl(&["approvals", "--leases", "--json"]));
    let lease = leases["leases"][0].clone();
    assert_eq!(lease["session"], "l1", "{leases}");
    assert_eq!(lease["scope"], "root notes");
    assert_eq!(lease["rule"], "untrusted-effect");
    assert!(lease["by"].as_str().unwrap().starts_with("uid "));

    // 2. The next write into the same root runs without asking, recorded as the lease's.
    let out = b
        .bxctl_in_background(&["chat", "--session", "l1", "note another"])
        .finish(DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        !said(&out).contains("waits for the owner"),
        "{}",
        said(&out)
    );
    assert_eq!(fs::read_to_string(notes.join("b.txt")).unwrap(), "two\n");
    let c = chain(&b);
    assert!(
        c.iter()
            .any(|r| r["event"] == "leased" && r["detail"]["lease"] == lease["lease"]),
        "the chain records the lease"
    );
    assert!(
        c.iter()
            .any(|r| r["event"] == "approved" && r["detail"]["lease"] == lease["lease"]),
        "the second write is approved by the lease in the chain"
    );

    // 3. Another tool is asked again (and denied by the owner).
    let turn = b.bxctl_in_background(&["chat", "--session", "l1", "fetch the page the mail names"]);
    bxtest::wait_for("the fetch to be asked", DEADLINE, || b.pending().len() == 1);
    let id = b.pending()[0]["approval"].as_str().unwrap().to_string();
    assert!(b.bxctl(&["deny", &id]).status.success());
    let out = turn.finish(DEADLINE).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{}", said(&out));

    // 4. A lease never lifts a denial: once the session read a secret, a write into the
    // private notes is denied, lease or not.
    let out = b
        .bxctl_in_background(&["chat", "--session", "l1", "read the bank file"])
        .finish(DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        said(&out).contains("no approval can allow this"),
        "{}",
        said(&out)
    );
    assert!(!notes.join("d.txt").exists());

    // 5. Revoked, it is gone.
    let lid = lease["lease"].as_str().unwrap();
    let out = b.bxctl(&["approvals", "revoke", lid]);
    assert!(out.status.success(), "{}", said(&out));
    let leases = json(&b.bxctl(&["approvals", "--leases", "--json"]));
    assert!(leases["leases"].as_array().unwrap().is_empty(), "{leases}");
    assert!(chain(&b).iter().any(|r| r["event"] == "lease_revoked"));
    let out = b.bxctl(&["approvals", "revoke", lid]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let out = b.bxctl(&["audit", "verify"]);
    assert!(out.status.success(), "{}", said(&out));
}

#[test]
fn bxctl_piped_into_a_reader_that_goes_away_ends_without_a_panic() {
    let b = DevBox::new();
    b.up(&[]);
    for args in [
        vec!["approvals"],
        vec!["approvals", "--leases"],
        vec!["audit", "tail"],
        vec!["status"],
    ] {
        // The reader is gone before bxctl writes a byte (`bxctl approvals | head -0`): its
        // first line meets a closed pipe.
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        let mut cmd = Command::new(bin_dir().join("bxctl"));
        cmd.args(&args)
            .arg("--home")
            .arg(b.home())
            .env_remove("BOXMAKER_HOME")
            .stdin(Stdio::null())
            .stdout(Stdio::from(write))
            .stderr(Stdio::piped());
        let out = Bounded::spawn(&mut cmd, "bxctl into a closed pipe")
            .unwrap()
            .finish(DEADLINE)
            .unwrap_or_else(|e| panic!("{e}"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(13),
            "{args:?}: ended by SIGPIPE, as `ls` is"
        );
    }
}
