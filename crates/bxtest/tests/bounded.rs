//! The test support itself: skips on CI, children past their deadline, waits that say what.

use std::process::Command;
use std::time::{Duration, Instant};

use bxtest::{Bounded, parse_allowed, run, skip_verdict, try_wait_for};

#[test]
fn a_child_past_its_deadline_is_killed_with_its_group_before_its_output_is_read() {
    // The grandchild keeps the stdout pipe open: reading to the end without killing the group
    // first never ends (the hang of the activation test under load).
    let started = Instant::now();
    let err = run(
        Command::new("sh").args(["-c", "echo started; sleep 600 & sleep 600"]),
        "a shell that outlives its deadline",
        Duration::from_millis(500),
    )
    .expect_err("it cannot end in time");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "it took {:?}",
        started.elapsed()
    );
    assert!(
        err.contains("a shell that outlives its deadline did not end within 500ms"),
        "{err}"
    );
    assert!(err.contains("started"), "what it said is kept: {err}");
}

#[test]
fn a_child_that_ends_leaves_nothing_of_its_group_behind() {
    let out = run(
        Command::new("sh").args(["-c", "sleep 600 >/dev/null 2>&1 & echo $!"]),
        "a shell that leaves a child",
        Duration::from_secs(60),
    )
    .expect("the shell ends at once");
    let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    bxtest::wait_for(
        "the left-behind sleep to be gone",
        Duration::from_secs(60),
        || {
            // Reaped by init, or a zombie of it: either way no longer running.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z"))
                .unwrap_or(true)
        },
    );
}

#[test]
fn a_bounded_child_is_killed_when_dropped() {
    let b = Bounded::spawn(Command::new("sleep").arg("600"), "sleep").unwrap();
    let pid = b.id();
    drop(b);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}

#[test]
fn a_wait_past_its_deadline_says_what_it_waited_for() {
    let err = try_wait_for("the moon to turn green", Duration::from_millis(50), || {
        false
    })
    .unwrap_err();
    assert!(err.contains("the moon to turn green"), "{err}");
}

#[test]
fn a_skip_passes_off_ci_and_fails_on_ci_unless_its_reason_is_listed() {
    let allowed = parse_allowed(
        "# nixpkgs cannot be fetched from a CI machine\nnix flake show --offline\n\n",
    );
    assert_eq!(allowed, ["nix flake show --offline"]);
    assert!(skip_verdict("needs root", false, &allowed).is_ok());
    let err = skip_verdict("needs root", true, &allowed).unwrap_err();
    assert!(err.contains("skipped on CI: needs root"), "{err}");
    assert!(err.contains(".ci/allowed-skips"), "{err}");
    assert!(skip_verdict("nix flake show --offline (no nixpkgs)", true, &allowed).is_ok());
}

#[test]
fn the_allowed_skips_file_exists_and_every_entry_says_why() {
    let text = std::fs::read_to_string(bxtest::allowed_skips_file()).unwrap();
    let mut said_why = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            said_why = true;
        } else if line.is_empty() {
            said_why = false;
        } else {
            assert!(said_why, "{line:?} has no `#` line above it saying why");
        }
    }
}
