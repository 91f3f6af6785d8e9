//! `bxcore::layout` and the NixOS module's `nixos-module/layout.json` say the same thing about
//! every socket and daemon the module knows.

use std::collections::BTreeSet;
use std::path::Path;

use bxcore::layout::{self, DAEMONS, OWNER, SOCKETS};
use serde_json::Value;

fn module_layout() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../nixos-module/layout.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A client as the module names it: a user, or `@owner`.
fn module_client(client: &str) -> String {
    match layout::daemon(client) {
        Some(d) => d.user.to_string(),
        None => client.to_string(),
    }
}

#[test]
fn every_socket_of_the_module_is_in_the_table_with_the_same_dir_server_and_client() {
    let l = module_layout();
    let sockets = l["sockets"].as_object().unwrap();
    assert!(!sockets.is_empty());
    for (name, s) in sockets {
        let spec = SOCKETS
            .iter()
            .find(|x| x.name == name)
            .unwrap_or_else(|| panic!("layout.json's socket {name} is not in bxcore::layout"));
        assert_eq!(s["dir"], spec.dir, "{name}: dir");
        assert_eq!(s["server"], spec.server, "{name}: server");
        assert_eq!(
            s["client"].as_str().unwrap(),
            module_client(spec.client),
            "{name}: client"
        );
    }
    assert_eq!(l["owner"], OWNER);
}

#[test]
fn every_daemon_of_the_module_has_its_state_dir_user_and_sockets() {
    let l = module_layout();
    for (name, d) in l["daemons"].as_object().unwrap() {
        let spec = layout::daemon(name).unwrap_or_else(|| panic!("{name} is not in DAEMONS"));
        assert_eq!(d["state_dir"], spec.state_dir, "{name}");
        assert_eq!(d["user"], spec.user, "{name}");
        let serves: BTreeSet<&str> = d["serves"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let ours: BTreeSet<&str> = SOCKETS
            .iter()
            .filter(|s| s.server == name)
            .map(|s| s.name)
            .collect();
        assert_eq!(serves, ours, "{name}: the sockets it serves");
    }
    for spec in DAEMONS {
        assert!(
            l["users"].get(spec.user).is_some(),
            "{} is not a user of the module",
            spec.user
        );
    }
}

#[test]
fn the_devices_home_and_run_directory_are_the_modules() {
    let l = module_layout();
    assert_eq!(l["device"]["home"], layout::DEVICE_HOME);
    assert_eq!(l["device"]["run"], layout::DEVICE_RUN);
}

#[test]
fn the_devices_sockets_live_under_run_and_any_other_homes_under_the_home() {
    assert_eq!(
        layout::BROKER.path(Path::new(layout::DEVICE_HOME)),
        Path::new("/run/boxmaker/loop-broker/broker.sock")
    );
    assert_eq!(
        layout::BROKER.path(Path::new("/tmp/box")),
        Path::new("/tmp/box/run/loop-broker/broker.sock")
    );
}

#[test]
fn socket_paths_and_names() {
    assert_eq!(layout::STATE.file(), "state.sock");
    let dirs: BTreeSet<&str> = SOCKETS.iter().map(|s| s.dir).collect();
    assert_eq!(
        dirs.len(),
        SOCKETS.len(),
        "no two sockets share a directory"
    );
}

/// `docs/architecture.md`'s socket table and each socket's dispatch table and cap in
/// `bxcore::layout` say the same thing.
#[test]
fn the_architecture_doc_lists_each_sockets_dispatch_table_and_cap() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    for spec in SOCKETS {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", spec.file())))
            .unwrap_or_else(|| panic!("docs/architecture.md has no row for {}", spec.file()));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let doc_kinds: BTreeSet<&str> = cells[5]
            .split(',')
            .map(|k| k.trim().trim_matches('`'))
            .collect();
        let mut ours: BTreeSet<&str> = spec.accepts.iter().copied().collect();
        ours.insert("ping");
        assert_eq!(doc_kinds, ours, "{}: accepts", spec.file());
        assert_eq!(
            cells[6],
            spec.max_connections.to_string(),
            "{}: cap",
            spec.file()
        );
    }
}

#[test]
fn only_loop_sock_and_its_twin_answer_a_wrong_kind_with_bad_message() {
    for spec in SOCKETS {
        // bridge.sock is loop.sock for the channel daemon: the same table, the same answers.
        let want = if spec.name == "loop" || spec.name == "bridge" {
            layout::WrongKind::BadMessage
        } else {
            layout::WrongKind::Forbidden
        };
        assert_eq!(spec.wrong_kind, want, "{}", spec.file());
        assert!(
            !spec.accepts.contains(&"ping"),
            "ping is every socket's, not a table's"
        );
        assert!(spec.max_connections >= 1);
    }
}
