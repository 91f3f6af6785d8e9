//! `bxctl dev up` and `dev down` against the real binaries: a second `up` on a running home, a
//! daemon that died before `down`, a daemon that fails at start, and what `status`, `selftest`
//! and `chat` see of a running box.

use std::fs;

use boxmaker_e2e::{DAEMONS, DevBox, said};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_second_up_on_a_running_home_refuses_and_after_down_it_reuses_the_home() {
    let b = DevBox::new();
    b.up(&[]);
    let second = b.try_up(&[]);
    assert_eq!(second.status.code(), Some(1), "{}", said(&second));
    let (_, err) = text(&second);
    assert!(
        err.contains("runs already") && err.contains("bxctl dev down"),
        "{err}"
    );
    for d in DAEMONS {
        let pid = b.pid(d).expect("its pid file is kept");
        assert!(
            fs::metadata(format!("/proc/{pid}")).is_ok(),
            "{d} still runs"
        );
    }

    let down = b.down();
    assert!(down.status.success(), "{}", said(&down));
    let again = b.up(&[]);
    let (out, _) = text(&again);
    assert!(out.contains("reusing the dev box in"), "{out}");
}

#[test]
fn down_with_a_daemon_already_dead_says_so_and_stops_the_others() {
    let b = DevBox::new();
    b.up(&[]);
    let dead = b.pid("inferproxy").unwrap();
    kill(Pid::from_raw(dead as i32), Signal::SIGKILL).unwrap();
    bxtest::wait_for("the killed inferproxy to be gone", bxtest::DEADLINE, || {
        bxtest::gone(dead)
    });
    let down = b.down();
    assert!(down.status.success(), "{}", said(&down));
    let (out, _) = text(&down);
    assert!(
        out.contains(&format!("inferproxy (pid {dead}): was not running")),
        "{out}"
    );
    for d in ["loopd", "brokerd"] {
        assert!(
            out.lines()
                .any(|l| l.contains(&format!("{d} (pid")) && l.contains("stopped on SIGTERM")),
            "{d}: {out}"
        );
    }
    for d in DAEMONS {
        assert!(b.pid(d).is_none(), "{d}'s pid file is removed");
    }
}

#[test]
fn a_daemon_that_fails_at_start_is_reported_with_its_runbook_line() {
    let b = DevBox::new();
    b.up(&[]);
    assert!(b.down().status.success());
    // A key brokerd does not know: it refuses its configuration.
    let config = b.home().join("etc/brokerd.toml");
    let text_before = fs::read_to_string(&config).unwrap();
    fs::write(&config, format!("no_such_key = 1\n{text_before}")).unwrap();

    let up = b.try_up(&[]);
    assert_eq!(up.status.code(), Some(1), "{}", said(&up));
    let (_, err) = text(&up);
    assert!(err.contains("brokerd ended ("), "{err}");
    assert!(
        err.contains("no_such_key"),
        "brokerd's own words are quoted: {err}"
    );
    assert!(
        err.contains("see docs/runbook.md#devbox-start-failed"),
        "{err}"
    );
    // What had started is stopped again, said so, with its log whole and its sink gone.
    for d in DAEMONS {
        if let Some(pid) = b.pid(d) {
            panic!("{d} (pid {pid}) was left with a pid file");
        }
        let sink = b.home().join(format!("dev/{d}.sink.pid"));
        assert!(!sink.exists(), "{} was left", sink.display());
    }
    let (said_out, _) = text(&up);
    assert!(
        said_out.contains("gatewayd: stopped again, as the box did not come up"),
        "{said_out}"
    );
    // A box that was down before is down again: as root, its users went as `dev down` takes
    // them, and nothing of the home is theirs.
    if bxtest::is_root() {
        for d in DAEMONS {
            assert!(b.user(d).is_none(), "{d}'s user was left: {:?}", b.user(d));
        }
    }
}

#[test]
fn status_shows_every_socket_answering_and_every_daemon_confined() {
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["status", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in [
        "loop.sock",
        "broker.sock",
        "admin.sock",
        "state.sock",
        "infer.sock",
    ] {
        let sock = s["sockets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == name)
            .unwrap();
        assert_eq!(sock["state"], "answers", "{name}: {sock}");
    }
    for d in DAEMONS {
        let line = s["daemons"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == d)
            .unwrap();
        let procs = line["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 1, "{d}: {line}");
        assert_eq!(procs[0]["seccomp"], 2, "{d}: {line}");
        assert_eq!(procs[0]["no_new_privs"], true, "{d}: {line}");
        assert_eq!(procs[0]["no_capabilities"], true, "{d}: {line}");
        if nix::unistd::geteuid().is_root() {
            assert_ne!(procs[0]["uid"], 0, "{d} dropped root: {line}");
        }
    }
    assert_eq!(s["audit"]["ok"], true, "{s}");
    assert_eq!(s["pending"], 0, "{s}");
}

#[test]
fn selftest_passes_on_a_running_dev_box() {
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["selftest"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("selftest: ok\n"));
}

#[test]
fn selftest_fails_with_its_runbook_line_when_the_box_is_down() {
    let b = DevBox::new();
    b.up(&[]);
    assert!(b.down().status.success());
    let out = b.bxctl(&["selftest"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (_, err) = text(&out);
    assert!(err.starts_with("selftest: FAILED: "), "{err}");
    assert!(
        err.trim_end()
            .ends_with("see docs/runbook.md#bxctl-selftest-failed"),
        "{err}"
    );
}

#[test]
fn chat_streams_a_turn_as_json_frames_and_resumes_the_session() {
    let b = DevBox::new();
    b.up(&[]);
    let out = b.bxctl(&["chat", "--json", "--session", "s1", "hello"]);
    assert!(out.status.success(), "{}", said(&out));
    let frames: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = frames.last().unwrap();
    assert_eq!(last["msg"]["kind"], "turn_done", "{frames:?}");
    assert_eq!(last["final"], true);
    assert!(
        frames[..frames.len() - 1]
            .iter()
            .all(|f| f["msg"]["kind"] == "turn_event" && f["final"] == false)
    );
    assert!(
        frames
            .iter()
            .any(|f| f["msg"]["event"]["type"] == "assistant_text")
    );

    // The same session again: resumed, and a tool call shows with its result.
    let out = b.bxctl(&["chat", "--json", "--session", "s1", "what time is it?"]);
    assert!(out.status.success(), "{}", said(&out));
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        body.contains("\"type\":\"tool_call\"") && body.contains("\"tool\":\"time_now\""),
        "{body}"
    );
    assert!(body.contains("\"type\":\"tool_result\""), "{body}");
    let log = fs::read_to_string(b.home().join("loop/sessions/s1.jsonl")).unwrap();
    assert!(
        log.contains("what time is it?"),
        "the session log holds both turns"
    );
}

#[test]
fn a_home_not_made_by_dev_up_is_refused_and_left_alone() {
    let b = DevBox::new();
    fs::create_dir_all(b.home()).unwrap();
    fs::write(b.home().join("precious.txt"), "mine").unwrap();
    let out = b.try_up(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("was not made by `bxctl dev up`"));
    let names: Vec<_> = fs::read_dir(b.home())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["precious.txt"], "nothing was written into it");
}

#[test]
fn every_daemon_starts_with_a_clean_environment() {
    if !bxtest::is_root() {
        bxtest::skip(
            "needs root (a daemon's environment is readable only by root once it has dropped)",
        );
        return;
    }
    let b = DevBox::new();
    let up = b.try_up_with(
        &[],
        &[
            ("BX_CANARY", "the caller's secret"),
            ("LD_PRELOAD", ""),
            ("RUST_LOG", "info"),
        ],
    );
    assert!(up.status.success(), "{}", said(&up));
    for d in DAEMONS {
        let pid = b.pid(d).expect("a pid file");
        let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
        let mut names: Vec<String> = environ
            .split(|b| *b == 0)
            .filter(|v| !v.is_empty())
            .map(|v| {
                let v = String::from_utf8_lossy(v);
                v.split_once('=')
                    .map_or(v.to_string(), |(k, _)| k.to_string())
            })
            .collect();
        names.sort();
        // Only what `dev up` sets for it (its sockets handed over, where to say it is ready)
        // and the caller's RUST_LOG.
        assert_eq!(
            names,
            [
                "LISTEN_FDNAMES",
                "LISTEN_FDS",
                "LISTEN_PID",
                "NOTIFY_SOCKET",
                "RUST_LOG"
            ],
            "{d}'s environment"
        );
    }
}

#[test]
fn up_after_a_daemon_died_starts_only_that_daemon() {
    let b = DevBox::new();
    b.up(&[]);
    let (broker, looper) = (b.pid("brokerd").unwrap(), b.pid("loopd").unwrap());
    let dead = b.pid("inferproxy").unwrap();
    kill(Pid::from_raw(dead as i32), Signal::SIGKILL).unwrap();
    bxtest::wait_for("the killed inferproxy to be gone", bxtest::DEADLINE, || {
        bxtest::gone(dead)
    });
    let again = b.up(&[]);
    let (out, _) = text(&again);
    assert!(out.contains("brokerd: runs already"), "{out}");
    assert!(out.contains("loopd: runs already"), "{out}");
    assert!(out.contains("inferproxy: up"), "{out}");
    assert_eq!(b.pid("brokerd"), Some(broker), "brokerd was left alone");
    assert_eq!(b.pid("loopd"), Some(looper), "loopd was left alone");
    assert_ne!(b.pid("inferproxy"), Some(dead));
    let chat = b.bxctl(&["chat", "--session", "s1", "hello"]);
    assert!(chat.status.success(), "{}", said(&chat));
}

#[test]
fn missing_parents_of_the_home_are_made_0755_before_anything_starts() {
    use std::os::unix::fs::PermissionsExt;
    let b = DevBox::at("a/b/home");
    b.up(&[]);
    for dir in ["a", "a/b"] {
        let mode = fs::metadata(b.beside(dir)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755, "{dir} is {mode:04o}");
    }
    let status = b.bxctl(&["status"]);
    assert!(status.status.success(), "{}", said(&status));
}

#[test]
fn a_pid_file_naming_a_process_dev_up_did_not_start_is_not_taken_for_a_daemon() {
    use std::os::unix::fs::PermissionsExt;
    let b = DevBox::new();
    b.up(&[]);
    let down = b.down();
    assert!(down.status.success(), "{}", said(&down));
    // A process that looks like loopd by name, in a pid file without the start time dev up
    // records: dev down must not signal it.
    let fake = b.beside("loopd");
    fs::copy("/bin/sleep", &fake).unwrap();
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = std::process::Command::new(&fake);
    cmd.arg("600");
    let other = bxtest::Bounded::spawn(&mut cmd, "a process named loopd").unwrap();
    let pid = other.id();
    fs::write(b.home().join("dev/loopd.pid"), format!("{pid}\n")).unwrap();
    let down = b.down();
    assert!(down.status.success(), "{}", said(&down));
    let (out, _) = text(&down);
    assert!(out.contains("loopd: was not running"), "{out}");
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(!stat.contains(") Z"), "it was killed: {stat}");
    drop(other);
}

#[test]
fn a_wrong_flag_on_a_new_home_is_refused_before_anything_is_written() {
    let b = DevBox::at("parent/home");
    let key = b.beside("key");
    fs::write(&key, "sk-test\n").unwrap();
    // A key file must be its owner's alone: inferproxy refuses one others may read.
    fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let key = key.display().to_string();
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "--provider",
                "openai",
                "--base-url",
                "127.0.0.1:9999/v1",
                "--model",
                "m",
                "--api-key-file",
                &key,
            ],
            "--base-url 127.0.0.1:9999/v1 is not a URL",
        ),
        (
            &[
                "--provider",
                "openai",
                "--model",
                "m",
                "--api-key-file",
                "/nonexistent/key",
            ],
            "--api-key-file /nonexistent/key",
        ),
        (
            &["--provider", "anthropic", "--api-key-file", &key],
            "needs --model NAME",
        ),
        (
            &["--model", "m"],
            "--model goes with --provider openai or anthropic",
        ),
        (
            &["--script", "/nonexistent/script.toml"],
            "--script /nonexistent/script.toml",
        ),
    ];
    for (flags, says) in cases {
        let out = b.try_up(flags);
        assert!(!out.status.success(), "{flags:?}: {}", said(&out));
        let (_, err) = text(&out);
        assert!(err.contains(says), "{flags:?}: {err}");
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(
            err.trim_end()
                .ends_with("see docs/runbook.md#devbox-refused"),
            "{flags:?}: {err}"
        );
        assert!(
            !b.beside("parent").exists(),
            "{flags:?}: nothing is made, not even the parent"
        );
    }
    // The same home then comes up with good flags.
    b.up(&[]);
}

#[test]
fn a_reused_home_needs_no_flags_and_refuses_changed_ones_saying_which() {
    let b = DevBox::new();
    let key = b.beside("key");
    fs::write(&key, "sk-test\n").unwrap();
    // A key file must be its owner's alone: inferproxy refuses one others may read.
    fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let key = key.display().to_string();
    // The endpoint is never called: only `dev up` and `down` run here.
    let flags = [
        "--provider",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m1",
        "--api-key-file",
        &key,
    ];
    b.up(&flags);
    let down = b.down();
    assert!(down.status.success(), "{}", said(&down));
    let config = b.home().join("etc/inferproxy.toml");
    let before = fs::read_to_string(&config).unwrap();

    let changed = b.try_up(&["--model", "m2"]);
    assert!(!changed.status.success(), "{}", said(&changed));
    let (_, err) = text(&changed);
    assert!(err.contains("--model m2, not m1"), "{err}");
    let changed = b.try_up(&["--provider", "anthropic"]);
    let (_, err) = text(&changed);
    assert!(err.contains("--provider anthropic, not openai"), "{err}");
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        before,
        "nothing changed"
    );

    // No flags: it comes up as it was made; the same flags again are as good.
    let again = b.up(&[]);
    let (out, _) = text(&again);
    assert!(out.contains("reusing the dev box in"), "{out}");
    let down = b.down();
    assert!(down.status.success(), "{}", said(&down));
    b.up(&flags);
}

#[test]
fn dev_restart_stops_and_starts_every_daemon_with_no_flags() {
    let b = DevBox::new();
    b.up(&[]);
    let before: Vec<Option<u32>> = DAEMONS.iter().map(|d| b.pid(d)).collect();
    let out = b.bxctl(&["dev", "restart"]);
    assert!(out.status.success(), "{}", said(&out));
    for (d, was) in DAEMONS.iter().zip(before) {
        let now = b.pid(d);
        assert!(now.is_some() && now != was, "{d}: {was:?} then {now:?}");
    }
    let chat = b.bxctl(&["chat", "--session", "s1", "hello"]);
    assert!(chat.status.success(), "{}", said(&chat));
}

#[test]
fn status_on_a_removed_live_home_says_the_home_is_gone_and_lists_no_daemon_of_another_box() {
    // Another box runs on the machine meanwhile: its daemons have the same names.
    let other = DevBox::new();
    other.up(&[]);
    let b = DevBox::new();
    b.up(&[]);
    let pids: Vec<u32> = DAEMONS.iter().filter_map(|d| b.pid(d)).collect();
    let box_id = b.box_id();
    fs::remove_dir_all(b.home()).unwrap();

    let out = b.bxctl(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["home_exists"], false, "{s}");
    assert_eq!(s["problems"].as_array().unwrap().len(), 1, "{s}");
    assert!(
        s["problems"][0]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{s}"
    );
    for line in s["daemons"].as_array().unwrap() {
        assert_eq!(line["processes"], Value::Array(Vec::new()), "{line}");
    }
    let out = b.bxctl(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (text_out, _) = text(&out);
    assert!(
        text_out.starts_with(&format!("box at {}: the home does not exist", b.home_arg())),
        "{text_out}"
    );

    // The orphans go, and as root their users with them.
    for pid in pids {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        bxtest::wait_for("an orphaned daemon to die", bxtest::DEADLINE, || {
            bxtest::gone(pid)
        });
    }
    if let Some(id) = box_id {
        let removed = bxctl::dev::user::remove_all(&id).unwrap();
        assert!(removed.iter().all(|(_, r)| r.is_ok()), "{removed:?}");
    }
    let st = other.bxctl(&["status"]);
    assert!(st.status.success(), "the other box: {}", said(&st));
}

#[test]
fn a_daemon_that_never_says_ready_is_named_and_what_had_started_is_stopped() {
    use std::os::unix::fs::PermissionsExt;
    // bxctl and the real gatewayd, brokerd, inferproxy and memoryd, beside a loopd that takes its
    // sockets and never says READY=1.
    let b = DevBox::new();
    let bin = b.beside("bin");
    fs::create_dir(&bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    for exe in ["bxctl", "gatewayd", "brokerd", "inferproxy", "memoryd"] {
        let from = boxmaker_e2e::bin_dir().join(exe);
        if fs::hard_link(&from, bin.join(exe)).is_err() {
            fs::copy(&from, bin.join(exe)).unwrap();
        }
    }
    fs::write(bin.join("loopd"), "#!/bin/sh\nexec sleep 600\n").unwrap();
    fs::set_permissions(bin.join("loopd"), fs::Permissions::from_mode(0o755)).unwrap();
    let home = b.home_arg();
    let mut cmd = std::process::Command::new(bin.join("bxctl"));
    cmd.args(["dev", "up", "--home", &home])
        .env_remove("BOXMAKER_HOME");
    let out = bxtest::run(&mut cmd, "dev up with a silent loopd", bxtest::DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (_, err) = text(&out);
    assert!(err.contains("loopd did not say READY=1"), "{err}");
    assert!(
        err.trim_end()
            .ends_with("see docs/runbook.md#devbox-start-failed"),
        "{err}"
    );
    for d in DAEMONS {
        if let Some(pid) = b.pid(d) {
            panic!("{d} (pid {pid}) was left with a pid file");
        }
    }
}

#[test]
fn each_daemon_logs_into_a_pipe_and_holds_no_descriptor_of_its_log_file() {
    let b = DevBox::new();
    b.up(&[]);
    for d in DAEMONS {
        let pid = b.pid(d).expect("a pid file");
        let log = fs::canonicalize(b.home().join(format!("logs/{d}.log"))).unwrap();
        let fds = format!("/proc/{pid}/fd");
        for fd in ["1", "2"] {
            let to = fs::read_link(format!("{fds}/{fd}")).unwrap();
            assert!(
                to.to_string_lossy().starts_with("pipe:["),
                "{d}'s descriptor {fd} is {}, not a pipe",
                to.display()
            );
        }
        for entry in fs::read_dir(&fds).unwrap() {
            let to = fs::read_link(entry.unwrap().path()).unwrap_or_default();
            assert_ne!(to, log, "{d} holds a descriptor of its own log file");
        }
        // What it said at start is in the log, copied from the pipe.
        let text = fs::read_to_string(&log).unwrap();
        assert!(text.contains(d), "{d}'s log: {text}");
        // The sink can do nothing but copy: seccomp's strict mode.
        let sink = fs::read_to_string(b.home().join(format!("dev/{d}.sink.pid"))).unwrap();
        let sink = sink.split_whitespace().next().unwrap();
        let status = fs::read_to_string(format!("/proc/{sink}/status")).unwrap();
        assert!(
            status.lines().any(|l| l == "Seccomp:\t1"),
            "{d}'s log sink: {status}"
        );
    }
    // What brokerd says as it stops is in its log once `down` returns: the sink copied the rest
    // of the pipe and ended.
    // A sink that ended leaves its daemon's lines nowhere: status says so.
    let sink = fs::read_to_string(b.home().join("dev/loopd.sink.pid")).unwrap();
    let sink: u32 = sink.split_whitespace().next().unwrap().parse().unwrap();
    let _ = kill(Pid::from_raw(sink as i32), Signal::SIGKILL);
    bxtest::wait_for("the sink to end", boxmaker_e2e::DEADLINE, || {
        fs::read_to_string(format!("/proc/{sink}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    });
    let status = b.bxctl(&["status"]);
    assert_eq!(status.status.code(), Some(1), "{}", said(&status));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("loopd's log sink is not running"),
        "{}",
        said(&status)
    );
    let down = b.down();
    assert!(down.status.success(), "{}", said(&down));
    let text = fs::read_to_string(b.home().join("logs/brokerd.log")).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("audit chain head") && l.contains("(at stop)")),
        "{text}"
    );
    assert!(
        !b.home().join("dev/brokerd.sink.pid").exists(),
        "the sink's pid file is removed once it ended"
    );
}
