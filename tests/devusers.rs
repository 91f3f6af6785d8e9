//! The dev box's users against the real binaries, as root: one user per daemon and per box,
//! each socket its client's (0600 in a 0700 directory), `[peers]` as on the device, `admin.sock`
//! the owner's alone, and two boxes on one machine out of each other's reach, by the file modes
//! and, with the modes opened up, by each server's peer check. As a normal user the dev box
//! keeps that user's uid for every daemon.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use boxmaker_e2e::{DAEMONS, DevBox, bxctl_as, said};
use bxcore::layout::{self, SOCKETS, SocketSpec};
use serde_json::Value;

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The sockets a dev box serves: those of its daemons.
fn served() -> Vec<SocketSpec> {
    SOCKETS
        .iter()
        .copied()
        .filter(|s| DAEMONS.contains(&s.server))
        .collect()
}

/// Open `b`'s socket directories (0711) and sockets (0666), as a mistake would: then only the
/// servers' peer checks stand between another uid and the sockets.
fn open_modes(b: &DevBox) {
    for spec in served() {
        let path = spec.path(b.home());
        let dir = path.parent().unwrap();
        fs::set_permissions(dir, fs::Permissions::from_mode(0o711)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
    }
}

/// Wait until `daemon`'s log in `b` says it refused `uid` on `socket`.
fn wait_refused_in_log(b: &DevBox, daemon: &str, uid: u32, socket: &str) {
    let log = b.home().join(format!("logs/{daemon}.log"));
    let want = format!("refused a connection from uid {uid} on {socket}");
    bxtest::wait_for(
        &format!("`{want}` in {}", log.display()),
        bxtest::DEADLINE,
        || fs::read_to_string(&log).is_ok_and(|t| t.contains(&want)),
    );
}

fn skip_unless_root() -> bool {
    if bxtest::is_root() {
        return false;
    }
    bxtest::skip("needs root (the dev box has users per daemon only when run as root)");
    true
}

#[test]
fn a_process_as_loopds_user_is_refused_on_admin_sock_by_its_mode_and_by_brokerds_peer_check() {
    if skip_unless_root() {
        return;
    }
    let b = DevBox::new();
    b.up(&[]);
    let (name, uid, gid) = b.user("loopd").expect("loopd's user");
    let home = b.home_arg();

    // The socket's mode: loopd's user cannot even connect.
    let out = bxctl_as(uid, gid, &["approvals", "--home", &home]);
    assert_eq!(out.status.code(), Some(1), "as {name}: {}", said(&out));
    let (_, err) = text(&out);
    assert!(err.contains("Permission denied"), "as {name}: {err}");

    // The peer check: with the modes opened, brokerd still refuses loopd's uid on admin.sock.
    open_modes(&b);
    let out = bxctl_as(uid, gid, &["approvals", "--home", &home]);
    assert_eq!(out.status.code(), Some(1), "as {name}: {}", said(&out));
    wait_refused_in_log(&b, "brokerd", uid, "admin.sock");
    let out = bxctl_as(uid, gid, &["approve", "no-such-approval", "--home", &home]);
    assert_eq!(out.status.code(), Some(1), "as {name}: {}", said(&out));

    // The owner (who ran `dev up`) is served.
    let out = b.bxctl(&["approvals"]);
    assert!(out.status.success(), "{}", said(&out));
}

#[test]
fn box_as_daemon_users_reach_none_of_box_bs_sockets_even_with_the_modes_opened() {
    if skip_unless_root() {
        return;
    }
    let (a, b) = (DevBox::new(), DevBox::new());
    a.up(&[]);
    b.up(&[]);
    assert_ne!(a.box_id(), b.box_id(), "each box has its own id");
    let b_home = b.home_arg();
    let a_users: Vec<(String, u32, u32)> = layout::DAEMONS
        .iter()
        .map(|d| {
            a.user(d.name)
                .unwrap_or_else(|| panic!("{}'s user in A", d.name))
        })
        .collect();
    for d in layout::DAEMONS {
        let (_, b_uid, _) = b.user(d.name).unwrap();
        assert!(
            a_users.iter().all(|(_, uid, _)| *uid != b_uid),
            "{}'s user in B is no user of A",
            d.name
        );
    }

    let states = |uid: u32, gid: u32| -> Vec<(String, Value)> {
        let out = bxctl_as(uid, gid, &["status", "--json", "--home", &b_home]);
        assert_eq!(out.status.code(), Some(1), "{}", said(&out));
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        served()
            .iter()
            .map(|spec| {
                let line = s["sockets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|x| x["name"] == spec.file().as_str())
                    .unwrap()
                    .clone();
                (spec.file(), line)
            })
            .collect()
    };
    // By the modes: no socket of B lets a user of A connect.
    for (name, uid, gid) in &a_users {
        for (sock, line) in states(*uid, *gid) {
            assert_eq!(line["state"], "refuses", "{sock} as {name} of A: {line}");
            assert!(
                line["why"].as_str().unwrap().contains("Permission denied"),
                "{sock} as {name} of A: {line}"
            );
        }
    }
    // By the peer checks: with B's modes opened, each of B's servers refuses each user of A.
    open_modes(&b);
    for (name, uid, gid) in &a_users {
        for (sock, line) in states(*uid, *gid) {
            assert_eq!(line["state"], "refuses", "{sock} as {name} of A: {line}");
        }
        for spec in served() {
            wait_refused_in_log(&b, spec.server, *uid, &spec.file());
        }
    }
    // Both boxes still serve their own.
    for x in [&a, &b] {
        let chat = x.bxctl(&["chat", "--session", "s1", "hello"]);
        assert!(chat.status.success(), "{}", said(&chat));
    }
}

/// The owner and mode of `path`.
fn owned(path: &Path) -> (u32, u32, u32) {
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

#[test]
fn each_socket_is_its_clients_0600_in_a_0700_directory_and_its_peers_are_that_client_alone() {
    if skip_unless_root() {
        return;
    }
    let b = DevBox::new();
    b.up(&[]);
    let me = nix::unistd::getuid().as_raw();
    let status = b.bxctl(&["status", "--json"]);
    assert!(status.status.success(), "{}", said(&status));
    let s: Value = serde_json::from_slice(&status.stdout).unwrap();
    for spec in served() {
        let (want_uid, want_gid, peer) = if spec.client == layout::OWNER {
            (me, nix::unistd::getgid().as_raw(), Value::from(me))
        } else {
            let (name, uid, gid) = b.user(spec.client).unwrap();
            (uid, gid, Value::from(name))
        };
        let path = spec.path(b.home());
        assert_eq!(
            owned(&path),
            (want_uid, want_gid, 0o600),
            "{}",
            path.display()
        );
        assert_eq!(
            owned(path.parent().unwrap()),
            (want_uid, want_gid, 0o700),
            "{}",
            path.display()
        );
        let config: toml::Table = toml::from_str(
            &fs::read_to_string(b.home().join(format!("etc/{}.toml", spec.server))).unwrap(),
        )
        .unwrap();
        let peers = &config["peers"][&spec.file()];
        assert_eq!(
            serde_json::to_value(peers).unwrap(),
            Value::Array(vec![peer]),
            "[peers] of {} in {}.toml",
            spec.file(),
            spec.server
        );
    }
    for d in DAEMONS {
        let (name, uid, gid) = b.user(d).unwrap();
        let line = s["daemons"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == d)
            .unwrap();
        assert_eq!(
            line["processes"][0]["uid"], uid,
            "{d} runs as {name}: {line}"
        );
        let state = layout::daemon(d).unwrap().state_path(b.home());
        assert_eq!(owned(&state), (uid, gid, 0o700), "{}", state.display());
    }
    let (_, broker, broker_gid) = b.user("brokerd").unwrap();
    assert_eq!(
        owned(&b.home().join("workspace")),
        (broker, broker_gid, 0o700),
        "the workspace is brokerd's alone"
    );
    assert_eq!(owned(b.home()).2, 0o711, "the home: enter, not list");
    for dir in ["logs", "dev"] {
        assert_eq!(
            owned(&b.home().join(dir)),
            (me, owned(b.home()).1, 0o700),
            "{dir}"
        );
    }
}

#[test]
fn two_ups_at_once_on_a_machine_without_their_users_both_come_up_each_with_its_own() {
    if skip_unless_root() {
        return;
    }
    // Both create their users at once, under the one lock; each box's daemons run as the uids
    // its directories were given to.
    for _ in 0..3 {
        let (a, b) = (DevBox::new(), DevBox::new());
        let (ra, rb) = std::thread::scope(|s| {
            let ta = s.spawn(|| a.try_up(&[]));
            let tb = s.spawn(|| b.try_up(&[]));
            // bounded: each `dev up` runs within bxtest's deadline (try_up)
            (ta.join().unwrap(), tb.join().unwrap())
        });
        assert!(ra.status.success(), "the first: {}", said(&ra));
        assert!(rb.status.success(), "the second: {}", said(&rb));
        assert_ne!(a.box_id(), b.box_id());
        for x in [&a, &b] {
            let chat = x.bxctl(&["chat", "--session", "s1", "hello"]);
            assert!(chat.status.success(), "{}", said(&chat));
        }
        let names: Vec<String> = [&a, &b]
            .iter()
            .flat_map(|x| layout::DAEMONS.iter().map(|d| x.user(d.name).unwrap().0))
            .collect();
        drop((a, b));
        for n in names {
            assert!(
                nix::unistd::User::from_name(&n).unwrap().is_none(),
                "`dev down` removed {n}"
            );
        }
    }
}

#[test]
fn down_gives_the_home_back_to_root_and_removes_the_users_and_up_makes_them_again() {
    if skip_unless_root() {
        return;
    }
    let b = DevBox::new();
    b.up(&[]);
    let id = b.box_id().unwrap();
    let down = b.down();
    assert!(down.status.success(), "{}", said(&down));
    let (out, _) = text(&down);
    for d in layout::DAEMONS {
        let name = bxctl::dev::user::name(&id, d.name).unwrap();
        assert!(out.contains(&format!("removed the user {name}")), "{out}");
        assert!(
            nix::unistd::User::from_name(&name).unwrap().is_none(),
            "{name}"
        );
    }
    for d in DAEMONS {
        let state = layout::daemon(d).unwrap().state_path(b.home());
        assert_eq!(owned(&state).0, 0, "{} is root's again", state.display());
    }
    for spec in served() {
        let dir = spec.path(b.home()).parent().unwrap().to_path_buf();
        assert_eq!(owned(&dir).0, 0, "{} is root's again", dir.display());
    }
    // The same box again: the same id, its users made anew, its state theirs.
    b.up(&[]);
    assert_eq!(b.box_id().as_deref(), Some(id.as_str()));
    let chat = b.bxctl(&["chat", "--session", "s1", "hello"]);
    assert!(chat.status.success(), "{}", said(&chat));
}

#[test]
fn as_a_normal_user_every_daemon_keeps_that_uid_and_every_socket_is_that_users() {
    if skip_unless_root() {
        return;
    }
    // A normal user: nobody, on a temporary directory of its own.
    let (uid, gid) = (65534, 65534);
    let b = DevBox::new();
    let dir = b.home().parent().unwrap();
    nix::unistd::chown(dir, Some(uid.into()), Some(gid.into())).unwrap();
    let home = b.home_arg();
    let up = bxctl_as(uid, gid, &["dev", "up", "--home", &home]);
    assert!(up.status.success(), "{}", said(&up));
    assert_eq!(b.box_id(), None, "no users of its own");
    for spec in served() {
        let path = spec.path(b.home());
        assert_eq!(owned(&path), (uid, gid, 0o600), "{}", path.display());
    }
    let status = bxctl_as(uid, gid, &["status", "--json", "--home", &home]);
    assert!(status.status.success(), "{}", said(&status));
    let s: Value = serde_json::from_slice(&status.stdout).unwrap();
    for line in s["daemons"].as_array().unwrap() {
        if let Some(p) = line["processes"].as_array().unwrap().first() {
            assert_eq!(p["uid"], uid, "{line}");
        }
    }
    let chat = bxctl_as(
        uid,
        gid,
        &["chat", "--home", &home, "--session", "s1", "hello"],
    );
    assert!(chat.status.success(), "{}", said(&chat));
    let down = bxctl_as(uid, gid, &["dev", "down", "--home", &home]);
    assert!(down.status.success(), "{}", said(&down));
    // As root, a home made by a normal user is refused, not taken over.
    let again = b.try_up(&[]);
    assert_eq!(again.status.code(), Some(1), "{}", said(&again));
    assert!(
        text(&again).1.contains("by a normal user"),
        "{}",
        said(&again)
    );
}

#[test]
fn status_and_its_confined_check_show_each_session_s_worker_as_loopd_s_user() {
    if skip_unless_root() {
        return;
    }
    let b = DevBox::new();
    b.up(&[]);
    for s in ["w1", "w2"] {
        let chat = b.bxctl(&["chat", "--new", "--session", s, "hello"]);
        assert!(chat.status.success(), "{}", said(&chat));
    }
    let status = b.bxctl(&["status", "--json"]);
    assert!(status.status.success(), "{}", said(&status));
    let s: Value = serde_json::from_slice(&status.stdout).unwrap();
    let loopd = s["daemons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "loopd")
        .unwrap();
    let (name, uid, _) = b.user("loopd").unwrap();
    let workers = loopd["workers"]
        .as_array()
        .expect("loopd's workers are listed");
    let sessions: Vec<&str> = workers
        .iter()
        .map(|w| w["session"].as_str().unwrap())
        .collect();
    assert_eq!(sessions.len(), 2, "{loopd}");
    assert!(
        sessions.contains(&"w1") && sessions.contains(&"w2"),
        "{loopd}"
    );
    for w in workers {
        assert_eq!(w["uid"], uid, "a worker runs as {name}: {w}");
        assert_eq!(w["seccomp"], 2, "{w}");
        assert_eq!(w["no_new_privs"], true, "{w}");
        assert_eq!(w["no_capabilities"], true, "{w}");
    }
    let text = b.bxctl(&["status"]);
    let out = String::from_utf8_lossy(&text.stdout);
    for s in ["w1", "w2"] {
        assert!(
            out.lines()
                .any(|l| l.contains(&format!("worker {s}")) && l.ends_with(": confined")),
            "{out}"
        );
    }
}
