//! brokerd serve: who may connect, the directories it makes and refuses, pong on every socket,
//! and web_fetch through a gateway socket.

mod support;

use std::fs;
use std::os::unix::fs::{PermissionsExt, chown};
use std::os::unix::net::UnixListener;
use std::thread;

use bxcore::{
    CallId, DataClass, Envelope, ErrorCode, FetchReply, Message, SessionId, ToolRequest,
    ToolResponse, read_frame, write_frame,
};
use serde_json::json;
use support::*;

#[test]
fn every_socket_answers_ping_as_brokerd() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    for s in [h.broker_sock(), h.admin_sock(), h.state_sock()] {
        match ping(&s) {
            Some(Message::Pong(p)) => {
                assert_eq!(p.daemon, "brokerd");
                assert_eq!(p.version, env!("CARGO_PKG_VERSION"));
                assert_eq!(p.protocol, bxcore::PROTOCOL_VERSION);
            }
            o => panic!("{o:?}"),
        }
    }
}

#[test]
fn a_peer_not_listed_is_refused_on_every_socket() {
    let h = Home::new(
        "[peers]\n\"broker.sock\" = [4242424]\n\"admin.sock\" = [4242424]\n\"state.sock\" = [4242424]\n",
    );
    let mut b = Brokerd::spawn(&h);
    wait_until("the sockets exist", || h.admin_sock().exists());
    let me = nix::unistd::geteuid().as_raw();
    for (s, name) in [
        (h.broker_sock(), "broker.sock"),
        (h.admin_sock(), "admin.sock"),
        (h.state_sock(), "state.sock"),
    ] {
        let r = request(&s, 3, Message::ToolsList {});
        match &r[0].msg {
            Message::Error(e) => {
                assert_eq!(r[0].id, 0);
                assert_eq!(e.code, ErrorCode::Forbidden);
                assert_eq!(e.detail, format!("uid {me} may not connect to {name}"));
            }
            o => panic!("{o:?}"),
        }
        b.wait_log(&format!(
            "brokerd: refused a connection from uid {me} on {name}; see docs/runbook.md#socket-peer-refused"
        ));
    }
    b.kill();
}

#[test]
fn its_directories_are_made_0700_and_a_wider_one_is_tightened() {
    let h = Home::new("");
    fs::create_dir_all(h.home.join("broker/sessions")).unwrap();
    fs::set_permissions(
        h.home.join("broker/sessions"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let b = Brokerd::start(&h);
    for d in ["broker", "broker/sessions", "broker/audit"] {
        let mode = fs::metadata(h.home.join(d)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{d}");
    }
    let chain = fs::metadata(h.chain()).unwrap().permissions().mode() & 0o777;
    assert_eq!(chain, 0o600);
    b.wait_log(&format!(
        "brokerd: {}: the directory was 0755, made 0700",
        h.home.join("broker/sessions").display()
    ));
}

#[test]
fn a_directory_of_another_user_is_refused() {
    if !is_root() {
        bxtest::skip("needs root");
        return;
    }
    let h = Home::new("");
    fs::create_dir_all(h.home.join("broker/audit")).unwrap();
    chown(h.home.join("broker/audit"), Some(65534), Some(65534)).unwrap();
    let mut b = Brokerd::spawn(&h);
    assert_eq!(b.wait_exit(), 1);
    let log = b.stderr();
    assert!(log.contains("belongs to uid 65534"), "{log}");
    assert!(
        log.contains("see docs/runbook.md#state-dir-refused"),
        "{log}"
    );
    assert!(!h.chain().exists());
}

#[test]
fn web_fetch_goes_through_the_gateway_and_taints_the_session_untrusted() {
    let h = Home::new("");
    let gw = h.home.join("gw/gateway.sock");
    fs::create_dir_all(gw.parent().unwrap()).unwrap();
    // A test double for gatewayd: one fetch_request, one fetch_reply.
    let listener = UnixListener::bind(&gw).unwrap();
    let seen = thread::spawn(move || {
        let mut s = bxtest::accept(&listener, "brokerd's fetch request");
        let env = read_frame(&mut s).unwrap();
        let reply = Message::FetchReply(FetchReply {
            status: 200,
            headers: vec![],
            body: "page text".into(),
            truncated: false,
        });
        write_frame(&mut s, &Envelope::new(env.id, true, reply)).unwrap();
        env.msg
    });
    h.write_config(&format!(
        "[gateway]\nsocket = {:?}\n",
        gw.display().to_string()
    ));
    let _b = Brokerd::start(&h);
    let r = request(
        &h.broker_sock(),
        1,
        Message::ToolRequest(ToolRequest {
            session: SessionId::new("s").unwrap(),
            call: CallId(1),
            tool: "web_fetch".into(),
            args: json!({"url": "https://example.org/a"}),
        }),
    );
    assert_eq!(
        r.last().unwrap().msg,
        Message::ToolResponse(ToolResponse::Result {
            content: "HTTP 200\n\npage text".into(),
            class: DataClass::Public,
            untrusted: true,
        })
    );
    match bxtest::join(seen, "the gateway double") {
        Message::FetchRequest(f) => {
            assert_eq!(f.url, "https://example.org/a");
            assert_eq!(f.method, "GET");
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(
        fs::read_to_string(h.state_file("s")).unwrap(),
        r#"{"taint":"private","untrusted":true}"#
    );
}
