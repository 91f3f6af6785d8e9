//! `bxctl dev up` validates first and rolls back (issue 25, finding 6): a key path taken from the
//! current directory is stored absolute; a key inferproxy would refuse is refused before anything
//! is written; a local server that takes no key needs no dummy file; and a `dev up` that fails
//! leaves the home and the machine as they were (its users removed), so the next one works.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use boxmaker_e2e::{DEADLINE, DevBox, bin_dir, said};
use bxtest::model::{Paced, PacedModel};

/// `bxctl dev up --home HOME args...` run in `cwd`.
fn up_in(b: &DevBox, cwd: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(bin_dir().join("bxctl"));
    cmd.current_dir(cwd)
        .env_remove("BOXMAKER_HOME")
        .args(["dev", "up", "--home"])
        .arg(b.home())
        .args(args);
    bxtest::run(&mut cmd, "bxctl dev up", DEADLINE).unwrap_or_else(|e| panic!("{e}"))
}

fn key(path: &std::path::Path, text: &str, mode: u32) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_relative_key_file_is_stored_absolute_and_the_box_answers() {
    let model = PacedModel::start(vec![Paced::text("Hello from the model.")]);
    let b = DevBox::new();
    let dir = b.beside("keys");
    fs::create_dir(&dir).unwrap();
    key(&dir.join("dummy.key"), "sk-local\n", 0o600);
    let url = model.base_url();
    let out = up_in(
        &b,
        &dir,
        &[
            "--provider",
            "openai",
            "--base-url",
            &url,
            "--model",
            "m",
            "--api-key-file",
            "./dummy.key",
        ],
    );
    assert!(out.status.success(), "{}", said(&out));
    let cfg = fs::read_to_string(b.home().join("etc/inferproxy.toml")).unwrap();
    let absolute = dir.join("dummy.key").display().to_string();
    assert!(
        cfg.contains(&format!("api_key_file = \"{absolute}\"")),
        "{cfg}"
    );
    let out = b.bxctl(&["chat", "--session", "k", "hello"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("Hello from the model."));
}

/// `dev up` with a key file holding `text` at `mode` is refused as usage (exit 2), saying `says`,
/// and nothing of the home is made.
fn refused_before_anything_is_written(text: &str, mode: u32, says: &str) {
    let b = DevBox::new();
    let k = b.beside("the.key");
    key(&k, text, mode);
    let out = b.try_up(&[
        "--provider",
        "openai",
        "--model",
        "m",
        "--api-key-file",
        k.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(said(&out).contains(says), "{}", said(&out));
    assert_eq!(
        said(&out).matches("see docs/runbook.md#").count(),
        1,
        "one pointer: {}",
        said(&out)
    );
    assert!(!b.home().exists(), "nothing was made");
}

#[test]
fn an_empty_key_file_is_refused_before_anything_is_written() {
    refused_before_anything_is_written(" \n", 0o600, "the file is empty");
}

#[test]
fn a_key_file_others_may_read_is_refused_before_anything_is_written() {
    refused_before_anything_is_written(
        "sk-test\n",
        0o644,
        "see docs/runbook.md#inferproxy-key-open",
    );
}

#[test]
fn a_local_server_that_takes_no_key_needs_no_key_file() {
    let model = PacedModel::start(vec![Paced::text("Keyless and fine.")]);
    let b = DevBox::new();
    let url = model.base_url();
    b.up(&["--provider", "openai", "--base-url", &url, "--model", "m"]);
    let cfg = fs::read_to_string(b.home().join("etc/inferproxy.toml")).unwrap();
    assert!(cfg.contains("keyless = true"), "{cfg}");
    assert!(!cfg.contains("api_key_file"), "{cfg}");
    let out = b.bxctl(&["chat", "--session", "k", "hello"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("Keyless and fine."));
    // Anthropic's API always takes a key.
    let a = DevBox::new();
    let out = a.try_up(&["--provider", "anthropic", "--model", "m"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(!a.home().exists());
}

/// The users a failed `dev up` said it removed again.
fn removed_users(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("removed the user "))
        .filter_map(|l| l.strip_suffix(" again"))
        .map(str::to_string)
        .collect()
}

/// inferproxy refuses a plain-HTTP provider off this machine when it starts: the daemons start,
/// one fails, and `dev up` takes everything back.
const REFUSED_URL: &str = "http://192.0.2.1:8080/v1";

#[test]
fn a_dev_up_that_fails_to_start_leaves_the_home_and_the_machine_as_they_were() {
    let b = DevBox::at("parent/of/home");
    let args = [
        "--provider",
        "openai",
        "--base-url",
        REFUSED_URL,
        "--model",
        "m",
    ];
    let out = b.try_up(&args);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let text = said(&out);
    assert!(text.contains("inferproxy"), "{text}");
    assert!(!text.contains("made a dev box"), "{text}");
    assert!(!b.home().exists(), "the home was taken back: {text}");
    assert!(
        !b.beside("parent").exists(),
        "the parents made for it too: {text}"
    );
    if bxtest::is_root() {
        let users = removed_users(&out);
        assert_eq!(
            users.len(),
            bxcore::layout::DAEMONS.len(),
            "one user per daemon: {text}"
        );
        for u in users {
            assert!(
                nix::unistd::User::from_name(&u).unwrap().is_none(),
                "{u} is gone"
            );
        }
    }
    // The same home takes the next `dev up` at once.
    b.up(&[]);
}

#[test]
fn a_failed_dev_up_in_an_empty_home_leaves_it_empty() {
    let b = DevBox::new();
    fs::create_dir(b.home()).unwrap();
    fs::set_permissions(b.home(), fs::Permissions::from_mode(0o750)).unwrap();
    let out = b.try_up(&[
        "--provider",
        "openai",
        "--base-url",
        REFUSED_URL,
        "--model",
        "m",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert_eq!(fs::read_dir(b.home()).unwrap().count(), 0, "{}", said(&out));
    let mode = fs::metadata(b.home()).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o750);
    b.up(&[]);
}
