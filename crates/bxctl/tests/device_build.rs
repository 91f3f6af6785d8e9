//! The bxctl a device installs is built without the `devbox` feature (`nix/package.nix`,
//! `buildNoDefaultFeatures`): it has no dev box and no demo, neither the commands nor their code,
//! and the owner's commands are all there. Built with the feature (the gate), this test builds
//! the device's bxctl beside it first (`target/device-bxctl`); built without it (the Nix
//! package's check phase), it checks the bxctl it was built with.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use bxtest::OutputBounded;

/// A build on a loaded machine may take long; it still ends.
const BUILD: Duration = Duration::from_secs(1800);

/// The bxctl built without the `devbox` feature.
fn device_bxctl() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let this = PathBuf::from(env!("CARGO_BIN_EXE_bxctl"));
        if !cfg!(feature = "devbox") {
            return this;
        }
        // target/<profile>/bxctl → target/device-bxctl, a target directory of its own, so the
        // bxctl the other tests run is never replaced.
        let target = this
            .parent()
            .and_then(Path::parent)
            .expect("bxctl is in target/<profile>")
            .join("device-bxctl");
        let out = bxtest::run(
            Command::new(env!("CARGO"))
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .args([
                    "build",
                    "--locked",
                    "--offline",
                    "-p",
                    "bxctl",
                    "--bin",
                    "bxctl",
                    "--no-default-features",
                    "--target-dir",
                ])
                .arg(&target),
            "cargo build -p bxctl --no-default-features",
            BUILD,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "{}", bxtest::said(&out));
        target.join("debug/bxctl")
    })
}

fn bxctl(args: &[&str]) -> Output {
    Command::new(device_bxctl())
        .args(args)
        .env_remove("BOXMAKER_HOME")
        .output_bounded()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_device_build_has_neither_dev_nor_demo_and_every_owners_command() {
    let help = stdout(&bxctl(&["--help"]));
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        commands,
        [
            "chat",
            "approvals",
            "approve",
            "deny",
            "marks",
            "audit",
            "memory",
            "tools",
            "channel",
            "status",
            "selftest",
            "logs",
            "completions",
            "man",
            "check",
            "help"
        ],
        "{help}"
    );
    for args in [&["dev", "up"][..], &["dev", "down"], &["demo"]] {
        let out = bxctl(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            bxtest::said(&out)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("unrecognized subcommand"), "{args:?}: {err}");
    }
    let bash = stdout(&bxctl(&["completions", "bash"]));
    assert!(bash.contains("selftest"), "{bash}");
    assert!(
        !bash.contains("demo") && !bash.contains("restart"),
        "{bash}"
    );
}

#[test]
fn the_device_build_holds_none_of_the_dev_boxs_code() {
    let bin = std::fs::read(device_bxctl()).unwrap();
    // Strings only the dev box and the demo have: the lock its users are made under, its
    // runbook entry, a line of the demo's conversation.
    for only_there in [
        "/run/lock/boxmaker-dev-users.lock",
        "devbox-start-failed",
        "Remember that my cat is called Biscuit.",
    ] {
        assert!(
            !bin.windows(only_there.len())
                .any(|w| w == only_there.as_bytes()),
            "the device's bxctl holds {only_there:?}"
        );
    }
}

#[test]
fn the_device_build_finds_a_box_by_its_home_and_says_when_it_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    let out = bxctl(&["status", "--home", gone.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", bxtest::said(&out));
    assert!(
        stdout(&out).starts_with(&format!(
            "box at {}: the home does not exist",
            gone.display()
        )),
        "{}",
        bxtest::said(&out)
    );
}
