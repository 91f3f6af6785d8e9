//! `gatewayd check --config`: a configuration it refuses says why and where, with its runbook
//! pointer, and exits 1; one it accepts prints what it would serve and never a secret.

use std::path::Path;
use std::process::Command;

const CA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls/ca.pem");
const SECRET: &str = "tok-5e1f0a9b8c7d6e5f";

/// `gatewayd check` on `body` (after the common head) in a fresh home, with `env`.
fn check(body: &str, env: &[(&str, &Path)]) -> (bool, String) {
    let home = tempfile::tempdir().unwrap();
    bxtest::write_private(&home.path().join("token"), &format!("{SECRET}\n"));
    let text = format!(
        "[paths]\nhome = {:?}\n[dns]\nservers = [\"192.0.2.53:53\"]\n[tls]\nca_file = {CA:?}\n{body}",
        home.path().display().to_string()
    )
    .replace("{home}", &home.path().display().to_string());
    let cfg = home.path().join("gatewayd.toml");
    std::fs::write(&cfg, text).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gatewayd"));
    cmd.arg("check").arg("--config").arg(&cfg);
    cmd.env_remove("CREDENTIALS_DIRECTORY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = bxtest::run(&mut cmd, "gatewayd check", bxtest::DEADLINE).unwrap();
    (out.status.success(), bxtest::said(&out))
}

fn refused(body: &str, why: &str) {
    let (ok, said) = check(body, &[]);
    assert!(!ok, "accepted: {said}");
    assert!(said.contains(why), "{said}");
    assert!(
        said.contains("see docs/runbook.md#gateway-config-invalid"),
        "{said}"
    );
    assert!(!said.contains(SECRET), "{said}");
}

#[test]
fn an_empty_allow_list_is_the_default_and_says_so() {
    let (ok, said) = check("", &[]);
    assert!(ok, "{said}");
    assert!(said.contains("no host (the allow-list is empty)"), "{said}");
}

#[test]
fn a_host_with_a_credential_file_is_served_and_the_secret_never_printed() {
    let body = "[[hosts]]\nname = \"api.example.org\"\nheader = \"authorization\"\nprefix = \"Bearer \"\nsecret_file = \"{home}/token\"\n";
    let (ok, said) = check(body, &[]);
    assert!(ok, "{said}");
    assert!(
        said.contains("api.example.org (credential in authorization)"),
        "{said}"
    );
    assert!(!said.contains(SECRET), "{said}");
}

#[test]
fn a_systemd_credential_is_read_from_the_credentials_directory() {
    let creds = tempfile::tempdir().unwrap();
    bxtest::write_private(&creds.path().join("example"), SECRET);
    let body =
        "[[hosts]]\nname = \"api.example.org\"\nheader = \"x-api-key\"\ncredential = \"example\"\n";
    let (ok, said) = check(body, &[("CREDENTIALS_DIRECTORY", creds.path())]);
    assert!(ok, "{said}");
    assert!(!said.contains(SECRET), "{said}");
    refused(body, "needs $CREDENTIALS_DIRECTORY");
}

#[test]
fn each_wrong_setting_is_refused_with_what_is_wrong() {
    for (body, why) in [
        (
            "[limits]\nmax_redirects = 6\n",
            "max_redirects must be at most 5",
        ),
        ("[limits]\ntimeout_ms = 0\n", "timeout_ms must be between 1"),
        ("[[hosts]]\nname = \"*\"\n", "is not a host name"),
        ("[[hosts]]\nname = \"a b.org\"\n", "is not a host name"),
        (
            "[[hosts]]\nname = \"x.org\"\nunknown = 1\n",
            "unknown field",
        ),
        (
            "[[hosts]]\nname = \"x.org\"\nheader = \"authorization\"\n",
            "header goes with secret_file",
        ),
        (
            "[[hosts]]\nname = \"x.org\"\nheader = \"a\"\nsecret_file = \"{home}/token\"\ncredential = \"c\"\n",
            "give one of them",
        ),
        (
            "[[hosts]]\nname = \"x.org\"\naddresses = [\"10.0.0.0/33\"]\n",
            "the prefix length",
        ),
        (
            "[[hosts]]\nname = \"x.org\"\n[[hosts]]\nname = \"X.org\"\n",
            "the same name as [[hosts]] 1",
        ),
        (
            "[[hosts]]\nname = \"x.org\"\ncredential = \"../etc\"\nheader = \"a\"\n",
            "is not a credential name",
        ),
    ] {
        refused(body, why);
    }
}

#[test]
fn a_secret_file_too_short_to_check_for_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let short = home.path().join("short");
    bxtest::write_private(&short, "abc\n");
    let body = format!(
        "[[hosts]]\nname = \"x.org\"\nheader = \"a\"\nsecret_file = {:?}\n",
        short.display().to_string()
    );
    refused(&body, "at least 8 are needed");
}

#[test]
fn a_secret_file_others_may_read_is_refused_and_never_printed() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let open = home.path().join("open");
    std::fs::write(&open, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let body = format!(
        "[[hosts]]\nname = \"x.org\"\nheader = \"a\"\nsecret_file = {:?}\n",
        open.display().to_string()
    );
    refused(
        &body,
        "has mode 0644: its group or others may read or change it",
    );
}

#[test]
fn addresses_that_reach_the_whole_web_are_refused() {
    for block in [
        "0.0.0.0/0",
        "::/0",
        "10.0.0.0/7",
        "8.8.8.0/24",
        "::ffff:0.0.0.0/96",
        "::ffff:127.0.0.1/128",
        "64:ff9b:1::/48",
    ] {
        let body = format!("[[hosts]]\nname = \"nas.home.arpa\"\naddresses = [{block:?}]\n");
        refused(
            &body,
            &format!("addresses {block} reaches beyond one refused range"),
        );
    }
    let (ok, said) = check(
        "[[hosts]]\nname = \"nas.home.arpa\"\naddresses = [\"192.168.1.0/24\", \"fd00::/8\", \"10.0.0.5\"]\n",
        &[],
    );
    assert!(ok, "{said}");
}

#[test]
fn a_credential_on_a_wildcard_entry_is_refused() {
    refused(
        "[[hosts]]\nname = \"*.example.org\"\nheader = \"authorization\"\nsecret_file = \"{home}/token\"\n",
        "a credential goes to one named host, never to every name below a suffix",
    );
}

#[test]
fn a_credential_on_a_plain_http_entry_is_refused() {
    refused(
        "[[hosts]]\nname = \"api.example.org\"\nhttp = true\nheader = \"authorization\"\nsecret_file = \"{home}/token\"\n",
        "a credential is never sent over plain http",
    );
}

#[test]
fn a_wildcard_below_a_single_label_is_refused() {
    for name in ["*.org", "*.lan"] {
        refused(
            &format!("[[hosts]]\nname = {name:?}\n"),
            "allows every name in a top-level domain",
        );
    }
}
