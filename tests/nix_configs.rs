//! The NixOS module's configurations are ones the daemons accept: each daemon's configuration is
//! rendered by `nixos-module/configs.nix` (the function the module serializes with
//! `pkgs.formats.toml`) with `nix-instantiate`, written as TOML with its home in a temporary
//! directory, and handed to the real `<daemon> check --config`, which loads it and every file
//! it names and must exit 0. Once for the module's defaults (only `enable` and `owner` set), once
//! for a fuller device (an OpenAI-compatible provider with a key, two slots, workspace roots,
//! tightened tools, the Matrix channel).
//!
//! Debian's Nix 2.8 is enough (builtins only); without `nix-instantiate` the test says
//! `skipped: nix-instantiate is not installed`.

use bxtest::OutputBounded;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use boxmaker_e2e::bin_dir;
use serde_json::{Value, json};

const DAEMONS: [&str; 5] = ["loopd", "brokerd", "inferproxy", "memoryd", "gatewayd"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the repository")
        .to_path_buf()
}

fn have_nix() -> bool {
    Command::new("nix-instantiate")
        .arg("--version")
        .output_bounded()
        .is_ok_and(|o| o.status.success())
}

/// `configs.nix` applied to the module's option defaults (`defaults.nix`) with `args` over
/// them (top-level keys replaced whole), as JSON: `{ loopd = ...; brokerd = ...; ... }`.
fn render(args: &Value) -> Value {
    let module = repo().join("nixos-module");
    let expr = format!(
        "{{ args }}: let d = import {}/defaults.nix; in import {}/configs.nix \
         ({{ inherit (d) home inference tools; }} // builtins.fromJSON args)",
        module.display(),
        module.display()
    );
    let out = Command::new("nix-instantiate")
        .args([
            "--eval", "--strict", "--json", "-E", &expr, "--argstr", "args",
        ])
        .arg(args.to_string())
        .output_bounded()
        .expect("nix-instantiate runs");
    assert!(
        out.status.success(),
        "nix-instantiate on configs.nix failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("nix-instantiate prints JSON")
}

/// What the module always passes besides the typed options: the home (here a temporary
/// directory), the owner, and the default script the package installs as
/// `share/boxmaker/inferproxy-default-script.toml`.
fn device(home: &Path) -> Value {
    json!({
        "home": home,
        "ownerUser": "alice",
        "defaultScript": repo().join("crates/inferproxy/scripts/default.toml"),
    })
}

/// Write each daemon's configuration (with `settings`, the module's free-form TOML, merged
/// over it) to `<home>/etc/<daemon>.toml` and run `<daemon> check --config` on it; every
/// daemon that refuses it is returned with what it said.
fn check_all(
    home: &Path,
    configs: &Value,
    settings: &Value,
    credentials: Option<&Path>,
) -> Vec<String> {
    let etc = home.join("etc");
    fs::create_dir_all(&etc).unwrap();
    let mut refused = Vec::new();
    // channeld, when the device has the Matrix channel (configs.nix renders it only then).
    let channel = configs.get("channeld").map(|_| "channeld");
    for daemon in DAEMONS.into_iter().chain(channel) {
        let mut cfg = configs[daemon].clone();
        assert!(
            cfg.is_object(),
            "configs.nix renders no {daemon}: {configs}"
        );
        merge(&mut cfg, &settings[daemon]);
        let value = toml::Value::try_from(&cfg).expect("the configuration is TOML-shaped");
        let text = toml::to_string(&value).unwrap();
        let file = etc.join(format!("{daemon}.toml"));
        fs::write(&file, &text).unwrap();
        let mut cmd = Command::new(bin_dir().join(daemon));
        cmd.arg("check").arg("--config").arg(&file);
        match credentials {
            Some(dir) => cmd.env("CREDENTIALS_DIRECTORY", dir),
            None => cmd.env_remove("CREDENTIALS_DIRECTORY"),
        };
        let out = cmd.output_bounded().expect("the daemon runs");
        if !out.status.success() {
            refused.push(format!(
                "{daemon} check refused the module's configuration:\n{text}\n--- stdout:\n{}--- stderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    refused
}

/// `settings` over `base`, table by table, as the module merges settings.<daemon>.
fn merge(base: &mut Value, settings: &Value) {
    let (Some(b), Some(s)) = (base.as_object_mut(), settings.as_object()) else {
        if !settings.is_null() {
            *base = settings.clone();
        }
        return;
    };
    for (k, v) in s {
        merge(b.entry(k.clone()).or_insert(Value::Null), v);
    }
}

#[test]
fn the_modules_default_configurations_pass_every_daemons_check() {
    if !have_nix() {
        bxtest::skip("nix-instantiate is not installed");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let configs = render(&device(home.path()));
    let refused = check_all(home.path(), &configs, &json!({}), None);
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

#[test]
fn a_fuller_devices_configurations_pass_every_daemons_check() {
    if !have_nix() {
        bxtest::skip("nix-instantiate is not installed");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let projects = home.path().join("projects");
    let mail = home.path().join("mail");
    fs::create_dir_all(&projects).unwrap();
    fs::create_dir_all(&mail).unwrap();
    // systemd's LoadCredential=api_key:<apiKeyFile> puts the key here and names the directory
    // in $CREDENTIALS_DIRECTORY; the configuration itself never names the key.
    let creds = home.path().join("credentials");
    fs::create_dir_all(&creds).unwrap();
    fs::write(creds.join("api_key"), "sk-test-not-a-real-key\n").unwrap();
    // As systemd makes a credential: readable by its owner only (inferproxy refuses more).
    fs::set_permissions(creds.join("api_key"), fs::Permissions::from_mode(0o400)).unwrap();
    // services.boxmaker.channels.matrix's token, the credential matrix_token.
    fs::write(creds.join("matrix_token"), "syt_test_not_a_real_token\n").unwrap();
    fs::set_permissions(
        creds.join("matrix_token"),
        fs::Permissions::from_mode(0o400),
    )
    .unwrap();

    let mut args = device(home.path());
    args["inference"] = json!({
        "provider": "openai",
        "baseUrl": "http://127.0.0.1:8080/v1",
        "apiKeyFile": "/var/lib/boxmaker-keys/api-key",
        "script": null,
        "slots": {
            "main": { "model": "qwen2.5-32b-instruct", "maxTokens": 4096, "contextTokens": 32768, "temperature": 0.7 },
            "small": { "model": "qwen2.5-7b-instruct", "maxTokens": 1024, "contextTokens": 8192, "temperature": null }
        }
    });
    args["tools"] = json!({
        "web_fetch": { "enabled": false },
        "workspace_write": { "approval": "always" }
    });
    args["matrix"] = json!({
        "homeserver": "http://127.0.0.1:8008",
        "user": "@box:localhost",
        "owners": ["@alice:localhost"],
        "rooms": ["!abc:localhost"]
    });
    let configs = render(&args);
    assert!(
        configs["channeld"].get("matrix").is_some()
            && !configs["channeld"].to_string().contains("token"),
        "the token reaches channeld as a credential, never in its configuration: {}",
        configs["channeld"]
    );
    assert!(
        configs["inferproxy"]["provider"]
            .get("api_key_file")
            .is_none(),
        "the key reaches inferproxy as a credential, never as a path in its configuration: {}",
        configs["inferproxy"]
    );
    assert_eq!(configs["loopd"]["loop"]["context_tokens"], json!(32768));
    // A declared tool (docs/tools.md), as services.boxmaker.settings.brokerd carries it: its
    // server's program in the store on the device, /bin/true here (check starts no server).
    let settings = json!({
        "brokerd": {
            "workspace": { "roots": [
                { "path": projects, "class": "private", "writable": true },
                { "path": mail, "class": "private", "untrusted": true }
            ] },
            "tool_servers": {
                "time": { "command": ["/bin/true", "--local-timezone", "Etc/UTC"] },
                // A server with a place of its own for each session (under brokerd's state).
                "memory": {
                    "command": ["/bin/true"],
                    "state": "session",
                    "env": { "MEMORY_FILE_PATH": "{state}/memory.jsonl" },
                    "memory_mb": 4096
                }
            },
            "declared_tools": [{
                "name": "now", "server": "time", "tool": "get_current_time",
                "description": "The current time in an IANA timezone.",
                "parameters": { "type": "object", "properties": { "timezone": { "type": "string" } } },
                "digest": "0".repeat(64), "reads": "public", "effect": "none"
            }, {
                "name": "recall", "server": "memory", "tool": "read_graph",
                "description": "What this session noted.",
                "parameters": { "type": "object" },
                "digest": "1".repeat(64), "reads": "private", "effect": "none"
            }]
        }
    });
    let refused = check_all(home.path(), &configs, &settings, Some(&creds));
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

/// The CA bundle the module hands the build-time check (pkgs.cacert's there; a test CA here).
fn ca_bundle() -> PathBuf {
    repo().join("crates/bxtls/tests/ca.pem")
}

/// What `nixos-module/validation.nix` makes of `daemon`'s configuration `settings` for the
/// build-time check (default.nix's validated configurations): the configuration with its
/// device files moved under the stand-in root, and the stand-ins to make.
fn validation(daemon: &str, settings: &Value, credentials: &[&str]) -> Value {
    let module = repo().join("nixos-module");
    let expr = format!(
        "{{ args }}: let a = builtins.fromJSON args; in import {}/validation.nix \
         {{ inherit (a) daemon settings credentials caBundle defaultScript; }}",
        module.display()
    );
    let args = json!({
        "daemon": daemon,
        "settings": settings,
        "credentials": credentials,
        "caBundle": ca_bundle(),
        "defaultScript": repo().join("crates/inferproxy/scripts/default.toml"),
    });
    let out = Command::new("nix-instantiate")
        .args([
            "--eval", "--strict", "--json", "-E", &expr, "--argstr", "args",
        ])
        .arg(args.to_string())
        .output_bounded()
        .expect("nix-instantiate runs");
    assert!(
        out.status.success(),
        "nix-instantiate on validation.nix failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("nix-instantiate prints JSON")
}

/// `nixos-module/validate-config.sh` on `daemon`'s configuration as `validation` prepared it,
/// with the daemons on PATH, as the module's derivation runs it; `Err` with what it said.
fn validate(dir: &Path, daemon: &str, v: &Value) -> Result<String, String> {
    let value = toml::Value::try_from(&v["settings"]).expect("the configuration is TOML-shaped");
    let file = dir.join(format!("{daemon}-checked.toml"));
    fs::write(&file, toml::to_string(&value).unwrap()).unwrap();
    let lines = |k: &str| {
        v[k].as_array()
            .expect("a list")
            .iter()
            .map(|x| x.as_str().expect("a string").to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg(repo().join("nixos-module/validate-config.sh"))
        .arg(daemon)
        .arg(&file)
        .env("PATH", path)
        .env("TMPDIR", dir)
        .env("fakeDirs", lines("dirs"))
        .env("fakeFiles", lines("files"))
        .env("fakeCredentials", lines("credentials"))
        .env_remove("CREDENTIALS_DIRECTORY")
        .output_bounded()
        .expect("bash runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(said)
    } else {
        Err(said)
    }
}

#[test]
fn the_build_time_check_passes_a_devices_configurations_with_its_files_stood_in_for() {
    if !have_nix() {
        bxtest::skip("nix-instantiate is not installed");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let mut args = device(home.path());
    args["inference"] = json!({
        "provider": "openai",
        "baseUrl": "https://api.openai.com/v1",
        "apiKeyFile": "/var/lib/boxmaker-keys/api-key",
        "script": null,
        "slots": { "main": { "model": "gpt-4o-mini", "maxTokens": 4096, "contextTokens": 128000, "temperature": null } }
    });
    args["honcho"] = json!({ "url": "http://127.0.0.1:8765", "workspace": "boxmaker" });
    // The Matrix channel on an https homeserver (an address: no name is looked up).
    args["matrix"] = json!({
        "homeserver": "https://127.0.0.1:8448",
        "user": "@box:example.org",
        "owners": ["@alice:example.org"],
        "rooms": ["!abc:example.org"]
    });
    let configs = render(&args);
    // Files that exist only on the device, none of them on this machine: the workspace roots,
    // a gateway host's secret file, Honcho's key file, the Matrix token file, CA bundles
    // outside the store.
    let gone = format!("/nonexistent-{}", bxtest::unique_name("device"));
    let settings = json!({
        "brokerd": { "workspace": { "roots": [
            { "path": format!("{gone}/projects"), "class": "private", "writable": true }
        ] } },
        "inferproxy": { "provider": { "ca_file": format!("{gone}/provider-ca.pem") } },
        "gatewayd": {
            "hosts": [ { "name": "api.example.org", "header": "authorization", "prefix": "Bearer ",
                         "secret_file": format!("{gone}/keys/example-token") } ],
            "dns": { "servers": [ "9.9.9.9:53" ] },
            "tls": { "ca_file": format!("{gone}/ca.pem") }
        },
        "memoryd": { "honcho": { "key_file": format!("{gone}/keys/honcho") } },
        "channeld": {
            "matrix": { "token_file": format!("{gone}/keys/matrix-token") },
            "tls": { "ca_file": format!("{gone}/matrix-ca.pem") }
        }
    });
    let credentials: [(&str, &[&str]); 6] = [
        ("loopd", &[]),
        ("brokerd", &[]),
        ("inferproxy", &["api_key"]),
        ("memoryd", &[]),
        ("gatewayd", &[]),
        ("channeld", &["matrix_token"]),
    ];
    let mut refused = Vec::new();
    for (daemon, creds) in credentials {
        let mut cfg = configs[daemon].clone();
        merge(&mut cfg, &settings[daemon]);
        let v = validation(daemon, &cfg, creds);
        // Each device file has its stand-in (or, a CA bundle, is left out), none is checked
        // where it is not.
        let checked = v["settings"].to_string();
        assert!(
            !checked.contains(&format!("\"{gone}")),
            "{daemon}: {checked}"
        );
        if let Err(said) = validate(home.path(), daemon, &v) {
            refused.push(format!("{daemon}: {said}"));
        }
    }
    assert!(refused.is_empty(), "{}", refused.join("\n"));
    // The https provider is checked with a CA bundle from the store: the build's sandbox has
    // no /etc/ssl, and inferproxy refuses an https provider without a bundle.
    let mut inferproxy = configs["inferproxy"].clone();
    merge(&mut inferproxy, &settings["inferproxy"]);
    let v = validation("inferproxy", &inferproxy, &["api_key"]);
    assert_eq!(
        v["settings"]["provider"]["ca_file"],
        json!(ca_bundle()),
        "{v}"
    );
    let mut bare = inferproxy.clone();
    bare["provider"].as_object_mut().unwrap().remove("ca_file");
    let v = validation("inferproxy", &bare, &["api_key"]);
    assert_eq!(
        v["settings"]["provider"]["ca_file"],
        json!(ca_bundle()),
        "{v}"
    );
    // channeld's https homeserver too, and its token as the credential the module's unit loads
    // (no token_file: what channels.matrix writes).
    let mut channeld = configs["channeld"].clone();
    merge(&mut channeld, &settings["channeld"]);
    let v = validation("channeld", &channeld, &["matrix_token"]);
    assert_eq!(v["settings"]["tls"]["ca_file"], json!(ca_bundle()), "{v}");
    let module = configs["channeld"].clone();
    let v = validation("channeld", &module, &["matrix_token"]);
    assert_eq!(v["settings"]["tls"]["ca_file"], json!(ca_bundle()), "{v}");
    validate(home.path(), "channeld", &v).unwrap();
    // Without the credential's stand-in channeld would refuse it: no token to read.
    let bare = validation("channeld", &module, &[]);
    let said = validate(home.path(), "channeld", &bare)
        .expect_err("channeld passed a configuration without a token");
    assert!(
        said.contains("credentials/matrix_token") && said.contains("channel-token-missing"),
        "{said}"
    );
    // And without the stand-ins the check would not pass: brokerd refuses a missing root.
    let mut brokerd = configs["brokerd"].clone();
    merge(&mut brokerd, &settings["brokerd"]);
    let mut bare = validation("brokerd", &brokerd, &[]);
    bare["dirs"] = json!([]);
    assert!(
        validate(home.path(), "brokerd", &bare).is_err(),
        "brokerd passed a workspace root that exists nowhere"
    );
}

#[test]
fn the_build_time_check_stands_the_packages_script_in_for_one_only_the_device_has() {
    if !have_nix() {
        bxtest::skip("nix-instantiate is not installed");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let configs = render(&device(home.path()));
    let mut cfg = configs["inferproxy"].clone();
    let gone = format!("/nonexistent-{}/turns.toml", bxtest::unique_name("script"));
    merge(&mut cfg, &json!({ "provider": { "script": gone } }));
    let v = validation("inferproxy", &cfg, &[]);
    assert_eq!(
        v["settings"]["provider"]["script"],
        json!(repo().join("crates/inferproxy/scripts/default.toml")),
        "{v}"
    );
    assert!(v["settings"]["provider"].get("ca_file").is_none(), "{v}");
    validate(home.path(), "inferproxy", &v).unwrap();
}

#[test]
fn the_build_time_check_fails_a_configuration_its_daemon_refuses() {
    if !have_nix() {
        bxtest::skip("nix-instantiate is not installed");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let configs = render(&device(home.path()));
    let mut cfg = configs["loopd"].clone();
    merge(&mut cfg, &json!({ "loop": { "no_such_key": true } }));
    let said = validate(home.path(), "loopd", &validation("loopd", &cfg, &[]))
        .expect_err("validate-config.sh passed a key loopd does not know");
    assert!(said.contains("no_such_key"), "{said}");
    assert!(
        said.contains("loopd refuses the configuration services.boxmaker.settings.loopd makes"),
        "{said}"
    );
    assert!(
        said.contains("see docs/runbook.md#module-config-refused"),
        "{said}"
    );
}
