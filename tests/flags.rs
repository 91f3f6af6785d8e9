//! Issue 17, findings 6 and 7: times on every daemon line and in `audit tail`, `bxctl logs`;
//! every flag listed for a subcommand does what it says there, or is not listed there.

use boxmaker_e2e::{DevBox, bxctl, said};

/// `2026-11-30T22:50:29.123Z`.
fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() == 24
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && s.ends_with('Z')
}

#[test]
fn logs_show_every_daemon_line_with_its_time_and_refuse_an_unknown_daemon() {
    let b = DevBox::new();
    b.up(&[]);
    for d in ["loopd", "brokerd", "inferproxy"] {
        let out = b.bxctl(&["logs", d]);
        assert!(out.status.success(), "{}", said(&out));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            !text.trim().is_empty(),
            "{d} logged nothing: {}",
            said(&out)
        );
        for line in text.lines() {
            let stamp = line.split(' ').next().unwrap_or_default();
            assert!(is_rfc3339(stamp), "{d}: a line without its time: {line:?}");
        }
    }
    let out = b.bxctl(&["logs"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("brokerd    | "));
    let out = b.bxctl(&["logs", "sshd"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sshd is not a daemon of the box"));
}

#[test]
fn audit_tail_shows_times_a_person_reads() {
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["audit", "tail"]);
    assert!(out.status.success(), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let first = text
        .lines()
        .next()
        .unwrap_or_else(|| panic!("{}", said(&out)));
    let time = first.split_whitespace().nth(1).unwrap();
    assert!(is_rfc3339(time), "{first}");
}

#[test]
fn a_flag_a_subcommand_does_not_use_is_refused_as_usage() {
    for args in [
        &["demo", "--json"][..],
        &["dev", "down", "--json"],
        &["status", "--admin", "/x.sock"],
        &["selftest", "--timeout", "5"],
        &["logs", "--json"],
    ] {
        let out = bxctl(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", said(&out));
    }
    for (cmd, flag) in [
        (&["selftest", "--help"][..], "--json"),
        (&["status", "--help"], "--json"),
        (&["approvals", "--help"], "--admin"),
        (&["chat", "--help"], "--model-timeout"),
    ] {
        let out = bxctl(cmd);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(flag),
            "{cmd:?}: {}",
            said(&out)
        );
    }
}

#[test]
fn the_script_provider_refuses_model_flags_before_it_makes_the_home() {
    let b = DevBox::new();
    let out = b.try_up(&["--model", "gpt-4o"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--provider openai or anthropic"));
    assert!(!b.home().exists(), "nothing was written");
}
