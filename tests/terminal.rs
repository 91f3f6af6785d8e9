//! What reaches the owner's terminal: `bxctl chat` on a pseudo-terminal, against a dev box whose
//! scripted model answers with every sequence a terminal would obey (OSC 52, OSC 8, OSC 0,
//! SGR 8, clear-screen, a C1 CSI, bidi overrides and isolates, zero-width characters, U+2028,
//! DEL) in its text, in a tool call's name and arguments, and in what the tool answered. The
//! bytes the terminal received are read from the pty's master side.

use std::fs;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Instant;

use boxmaker_e2e::{DEADLINE, DevBox, bin_dir};
use nix::pty::openpty;

/// The hostile text, as TOML basic-string escapes (so the script file itself is plain ASCII).
const HOSTILE: &str = concat!(
    r"clip\u001b]52;c;ZWNobyBwd25lZA==\u0007",
    r" link\u001b]8;;https://evil.example/\u001b\\here\u001b]8;;\u001b\\",
    r" title\u001b]0;owned\u0007",
    r" conceal\u001b[8m",
    r" clear\u001b[2J\u001b[H",
    r" csi\u009b2J",
    r" bidi notes/\u202etxt.tsil-gnippohs \u2066iso\u2069",
    r" zw\u200b\u200d\ufeff sep\u2028 del\u007f cr\r end",
);

/// Every character that must not reach the terminal as itself (a carriage return does: the
/// terminal driver turns each newline into CR LF; the model's shows as `\u{d}`).
const RAW: &[char] = &[
    '\u{1b}', '\u{7}', '\u{9b}', '\u{202e}', '\u{2066}', '\u{2069}', '\u{200b}', '\u{200d}',
    '\u{feff}', '\u{2028}', '\u{7f}',
];

/// Run `bxctl chat` with stdin, stdout and stderr on a new pty; every byte it wrote.
fn chat_on_a_pty(b: &DevBox, text: &str) -> (bool, Vec<u8>) {
    let pty = openpty(None, None).expect("a pseudo-terminal");
    let slave: OwnedFd = pty.slave;
    let mut child = Command::new(bin_dir().join("bxctl"))
        .args(["chat", "--session", "s1", text, "--home", &b.home_arg()])
        .env_remove("BOXMAKER_HOME")
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .expect("bxctl starts");
    // Only the child holds the slave now: the master reads EIO once it exits.
    let mut master = fs::File::from(pty.master);
    let until = Instant::now() + DEADLINE;
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        assert!(
            Instant::now() < until,
            "bxctl chat did not finish within {DEADLINE:?}; so far: {}",
            String::from_utf8_lossy(&bytes)
        );
        let mut fds = [nix::poll::PollFd::new(
            std::os::fd::AsFd::as_fd(&master),
            nix::poll::PollFlags::POLLIN,
        )];
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(200u16));
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            // EIO: the last slave descriptor closed.
            Err(e) if e.raw_os_error() == Some(libc_eio()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("reading the pty ({}): {e}", master.as_raw_fd()),
        }
    }
    // Its terminal closed; it ends, or is killed at the deadline.
    let mut status = None;
    let waited = bxtest::try_wait_for("bxctl chat to exit", DEADLINE, || {
        status = child.try_wait().expect("bxctl's status");
        status.is_some()
    });
    if let Err(e) = waited {
        bxtest::reap(&mut child);
        panic!("{e}");
    }
    let status = status.expect("it ended");
    (status.success(), bytes)
}

fn libc_eio() -> i32 {
    nix::errno::Errno::EIO as i32
}

#[test]
fn chat_shows_every_terminal_sequence_of_the_model_and_the_tool_escaped() {
    let b = DevBox::new();
    let script = b.beside("hostile.toml");
    fs::write(
        &script,
        format!(
            "[[step]]\ntext = \"{HOSTILE}\"\n\
             tool_calls = [{{ tool = \"time_now\", args = {{ note = \"{HOSTILE}\" }} }}]\n\
             [[step]]\nafter = \"tool\"\ntext = \"after {{last_tool}}\"\n\
             tool_calls = [{{ tool = \"evil{HOSTILE}\" }}]\n\
             [[step]]\nafter = \"tool\"\ntext = \"last {{last_tool}}\"\n"
        ),
    )
    .unwrap();
    b.up(&["--script", &script.display().to_string()]);
    let (ok, bytes) = chat_on_a_pty(&b, "go");
    let shown = String::from_utf8_lossy(&bytes);
    assert!(ok, "bxctl chat failed:\n{shown}");
    // bxctl colours its own lines on a terminal (`ESC[..m`): take those out, then no control
    // of the model's may be left.
    let own = regex_lite_strip_sgr(&shown);
    for c in RAW {
        assert!(
            !own.contains(*c),
            "{:?} reached the terminal:\n{shown:?}",
            c
        );
    }
    for want in [
        r"clip\u{1b}]52;c;ZWNobyBwd25lZA==\u{7}",
        r"title\u{1b}]0;owned\u{7}",
        r"conceal\u{1b}[8m",
        r"clear\u{1b}[2J\u{1b}[H",
        r"csi\u{9b}2J",
        r"notes/\u{202e}txt.tsil-gnippohs \u{2066}iso\u{2069}",
        r"zw\u{200b}\u{200d}\u{feff} sep\u{2028} del\u{7f} cr\u{d} end",
        // The tool call line: its name.
        r"evilclip\u{1b}]52;c;",
    ] {
        assert!(own.contains(want), "{want} not shown:\n{own}");
    }
}

/// `s` without bxctl's own colour sequences: `ESC [ <digits;> m`.
fn regex_lite_strip_sgr(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("\u{1b}[") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let n = after
            .find(|c: char| !(c.is_ascii_digit() || c == ';'))
            .unwrap_or(after.len());
        if after[n..].starts_with('m') {
            rest = &after[n + 1..];
        } else {
            out.push_str("\u{1b}[");
            rest = after;
        }
    }
    out.push_str(rest);
    out
}
