//! brokerd under its real sandbox: as root it drops to an unprivileged user, and in any case
//! every thread runs with `NoNewPrivs: 1` and `Seccomp: 2` (filter mode, `KillProcess`), and it
//! still serves: ping, a tool call with its raise, an approval list, a state question.

mod support;

use std::fs;
use std::os::unix::fs::chown;
use std::path::Path;

use bxcore::{CallId, DataClass, Message, SessionId, ToolRequest, ToolResponse};
use serde_json::json;
use support::*;

fn status_field(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .trim()
        .to_string()
}

fn chown_tree(p: &Path, uid: u32, gid: u32) {
    chown(p, Some(uid), Some(gid)).unwrap();
    if p.is_dir() {
        for e in fs::read_dir(p).unwrap() {
            chown_tree(&e.unwrap().path(), uid, gid);
        }
    }
}

#[test]
fn it_serves_under_its_real_sandbox_with_seccomp_and_no_new_privs_on_every_thread() {
    let h = Home::new("");
    fs::write(h.dir("vault").join("k.txt"), "inside").unwrap();
    let root = format!(
        "[[workspace.roots]]\npath = {:?}\nclass = \"secret\"\n",
        h.home.join("vault").display().to_string()
    );
    let want_uid;
    if is_root() {
        let nobody = nix::unistd::User::from_name("nobody")
            .unwrap()
            .expect("a nobody user");
        want_uid = nobody.uid.as_raw();
        // The test (root) is the peer on every socket; brokerd runs as nobody.
        let text = format!(
            "[paths]\nhome = {:?}\n\n[sandbox]\nuser = \"nobody\"\n\n[peers]\n\"broker.sock\" = [0]\n\"admin.sock\" = [0]\n\"state.sock\" = [0]\n\n{root}",
            h.home.display().to_string()
        );
        fs::write(&h.config, text).unwrap();
        chown_tree(&h.home, want_uid, nobody.gid.as_raw());
    } else {
        want_uid = nix::unistd::geteuid().as_raw();
        let text = format!(
            "[paths]\nhome = {:?}\n\n{root}",
            h.home.display().to_string()
        );
        fs::write(&h.config, text).unwrap();
    }
    let b = Brokerd::start(&h);
    let log = b.stderr();
    assert!(log.contains("seccomp brokerd ("), "{log}");
    assert!(log.contains("otherwise kill"), "{log}");
    assert!(!log.contains("NOT APPLIED"), "{log}");

    // It serves, under the sandbox, through each socket.
    let r = request(
        &h.broker_sock(),
        1,
        Message::ToolRequest(ToolRequest {
            session: SessionId::new("s").unwrap(),
            call: CallId(1),
            tool: "workspace_read".into(),
            args: json!({"path": h.home.join("vault/k.txt").display().to_string()}),
        }),
    );
    assert!(
        matches!(
            &r.last().unwrap().msg,
            Message::ToolResponse(ToolResponse::Result {
                class: DataClass::Secret,
                ..
            })
        ),
        "{r:?} {}",
        b.stderr()
    );
    let r = request(
        &h.state_sock(),
        2,
        Message::SessionState(bxcore::SessionQuery {
            session: SessionId::new("s").unwrap(),
        }),
    );
    assert!(matches!(
        r[0].msg,
        Message::SessionStateReply(bxcore::Label {
            class: DataClass::Secret,
            ..
        })
    ));
    let r = request(&h.admin_sock(), 3, Message::AuditVerify {});
    assert!(
        matches!(&r[0].msg, Message::AuditReport(a) if a.ok),
        "{r:?}"
    );
    // A path the sandbox does not allow, even if the policy did: outside every root anyway.
    let r = request(
        &h.broker_sock(),
        4,
        Message::ToolRequest(ToolRequest {
            session: SessionId::new("s").unwrap(),
            call: CallId(4),
            tool: "workspace_read".into(),
            args: json!({"path": "/etc/shadow"}),
        }),
    );
    assert!(matches!(
        &r.last().unwrap().msg,
        Message::ToolResponse(ToolResponse::Failed { .. })
    ));

    let pid = b.pid();
    let mut threads = 0;
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        // A connection's thread that ends while the list is read is gone: not one to check.
        let Ok(status) = fs::read_to_string(t.unwrap().path().join("status")) else {
            continue;
        };
        assert_eq!(status_field(&status, "Seccomp"), "2", "{status}");
        assert_eq!(status_field(&status, "NoNewPrivs"), "1", "{status}");
        let uids = status_field(&status, "Uid");
        assert!(
            uids.split_whitespace().all(|u| u == want_uid.to_string()),
            "{uids}"
        );
        if is_root() {
            for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
                assert_eq!(status_field(&status, cap), "0000000000000000", "{cap}");
            }
        }
        threads += 1;
    }
    assert!(
        threads >= 4,
        "the main thread and three accept threads: {threads}"
    );
}

#[test]
fn as_root_with_no_user_it_refuses_to_start_while_the_sandbox_is_required() {
    if !is_root() {
        bxtest::skip("needs root");
        return;
    }
    let h = Home::new("");
    fs::write(
        &h.config,
        format!("[paths]\nhome = {:?}\n", h.home.display().to_string()),
    )
    .unwrap();
    let mut b = Brokerd::spawn(&h);
    assert_eq!(b.wait_exit(), 1);
    let log = b.stderr();
    assert!(
        log.contains("see docs/runbook.md#sandbox-unavailable"),
        "{log}"
    );
    assert!(ping(&h.broker_sock()).is_none(), "it serves nothing: {log}");
    assert!(
        records(&h).iter().all(|r| r["event"] != "started"),
        "it never started"
    );
}
