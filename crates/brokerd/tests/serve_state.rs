//! state.sock end to end: where it is, how it is bound, and that it serves beside the others.

mod support;

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;

use bxcore::SessionQuery as StateQuestion;
use bxcore::{DataClass, ErrorCode, Label, Message, SessionId};
use support::*;

fn question(session: &str) -> Message {
    Message::SessionState(StateQuestion {
        session: SessionId::new(session).unwrap(),
    })
}

#[test]
fn it_answers_on_its_default_path_from_the_state_files() {
    let h = Home::new("");
    let b = Brokerd::start(&h);
    fs::write(
        h.state_file("s1"),
        r#"{"taint":"secret","untrusted":false}"#,
    )
    .unwrap();
    let r = request(&h.state_sock(), 2, question("s1"));
    assert_eq!(
        r[0].msg,
        Message::SessionStateReply(Label {
            class: DataClass::Secret,
            untrusted: false
        })
    );
    let log = b.stderr();
    let tools = log
        .find(&format!(
            "brokerd: serving tools on {} and approvals on {}",
            h.broker_sock().display(),
            h.admin_sock().display()
        ))
        .expect(&log);
    let state = log
        .find(&format!(
            "brokerd: serving session state on {}",
            h.state_sock().display()
        ))
        .expect(&log);
    assert!(tools < state, "{log}");
}

#[test]
fn its_directory_is_0700_its_socket_0600_and_a_stale_one_is_replaced() {
    let h = Home::new("");
    let dir = h.home.join("run/memory-broker");
    fs::create_dir_all(&dir).unwrap();
    // A stale socket from a brokerd that died: bound, then its listener dropped. A child another
    // test forks at that moment holds a copy of the listener until its exec closes it, so the
    // socket is stale once that has happened, not at once.
    drop(std::os::unix::net::UnixListener::bind(h.state_sock()).unwrap());
    wait_until(
        "the dropped listener's socket to refuse connections",
        || UnixStream::connect(h.state_sock()).is_err(),
    );
    let _b = Brokerd::start(&h);
    let dmode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    let smeta = fs::symlink_metadata(h.state_sock()).unwrap();
    assert_eq!(dmode, 0o700);
    assert!(smeta.file_type().is_socket());
    assert_eq!(smeta.permissions().mode() & 0o777, 0o600);
    assert!(matches!(
        request(&h.state_sock(), 1, question("x"))[0].msg,
        Message::SessionStateReply(_)
    ));
}

#[test]
fn sockets_state_in_the_config_moves_it() {
    let h = Home::new("");
    let moved = h.home.join("elsewhere/st.sock");
    h.write_config(&format!(
        "[sockets]\nstate = {:?}\n",
        moved.display().to_string()
    ));
    let mut b = Brokerd::spawn(&h);
    wait_until("the moved state socket answers", || ping(&moved).is_some());
    let r = request(&moved, 1, question("x"));
    assert!(matches!(r[0].msg, Message::SessionStateReply(_)), "{r:?}");
    assert!(!h.state_sock().exists());
    b.kill();
}

#[test]
fn a_silent_connection_does_not_hold_up_the_next() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    let _silent = UnixStream::connect(h.state_sock()).unwrap();
    let _half = {
        let mut s = UnixStream::connect(h.state_sock()).unwrap();
        std::io::Write::write_all(&mut s, &[0, 0, 0]).unwrap();
        s
    };
    let r = request(&h.state_sock(), 3, question("y"));
    assert!(matches!(r[0].msg, Message::SessionStateReply(_)), "{r:?}");
}

#[test]
fn the_other_sockets_refuse_the_question() {
    let h = Home::new("");
    let _b = Brokerd::start(&h);
    for (sock, name) in [
        (h.broker_sock(), "broker.sock"),
        (h.admin_sock(), "admin.sock"),
    ] {
        let r = request(&sock, 5, question("x"));
        match &r[0].msg {
            Message::Error(e) => {
                assert_eq!(e.code, ErrorCode::Forbidden);
                assert_eq!(e.detail, format!("session_state is not accepted on {name}"));
            }
            other => panic!("{other:?}"),
        }
    }
}
