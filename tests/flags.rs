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

#[test]
fn the_lines_shown_after_a_failed_start_are_that_runs_only() {
    let b = DevBox::new();
    b.up(&[]);
    assert!(b.down().status.success());
    let config = b.home().join("etc/brokerd.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("no_such_key = 1\n{text}")).unwrap();
    let up = b.try_up(&[]);
    assert_eq!(up.status.code(), Some(1), "{}", said(&up));
    let err = String::from_utf8_lossy(&up.stderr).into_owned();
    assert!(err.contains("no_such_key"), "{err}");
    assert!(
        !err.contains("serving tools on"),
        "the first run's lines were shown again: {err}"
    );
}

#[test]
fn a_provider_that_reports_no_usage_shows_usage_unknown_not_zero_tokens() {
    // The script provider reports none.
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["chat", "hello"]);
    assert!(out.status.success(), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("usage unknown"), "{text}");
    assert!(!text.contains("0 tokens"), "{text}");
}

#[test]
fn completions_and_the_man_page_come_from_the_command_line() {
    let out = bxctl(&["completions", "bash"]);
    assert!(out.status.success(), "{}", said(&out));
    let bash = String::from_utf8_lossy(&out.stdout).into_owned();
    for word in ["_bxctl", "selftest", "logs", "--model-timeout"] {
        assert!(bash.contains(word), "{word} is not completed");
    }
    let out = bxctl(&["man"]);
    assert!(out.status.success(), "{}", said(&out));
    let man = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        man.starts_with(".ie") || man.starts_with(".TH"),
        "{}",
        &man[..man.len().min(200)]
    );
    assert!(man.contains("bxctl"), "{man}");
    let out = bxctl(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
}
