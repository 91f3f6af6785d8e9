//! `inferproxy.toml`: what inferproxy serves, which provider it talks to, and its slots.
//!
//! Every table refuses unknown keys, and every value is checked when the file loads, so a typo
//! or a nonsensical setting (a key file for the `script` provider, a plain-HTTP provider off
//! this machine) is a refusal to start, never a surprise at the first request.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bxharden::{Peers, SandboxConfig};
use serde::Deserialize;

/// The runbook anchor of a configuration that does not load.
pub const CONFIG_ANCHOR: &str = "inferproxy-config-invalid";

/// The longest `timeout_ms` accepted: one hour.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// The most retries accepted.
pub const MAX_RETRIES: u32 = 10;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub paths: Paths,
    #[serde(default)]
    pub sockets: Sockets,
    #[serde(default)]
    pub peers: Peers,
    pub provider: ProviderConfig,
    #[serde(default)]
    pub slots: BTreeMap<String, Slot>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    #[serde(default)]
    pub serve: bxharden::ServeConfig,
}

/// `[paths]`: the box's home, as every daemon has it.
pub use bxharden::config::Paths;

/// `[sockets]`: empty or absent means the default under home.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sockets {
    /// Default `<run>/loop-infer/infer.sock` (`bxcore::layout::run_dir`).
    #[serde(default)]
    pub infer: Option<PathBuf>,
}

/// `[provider] kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// `POST {base_url}/chat/completions`: OpenAI and every compatible server.
    Openai,
    /// `POST {base_url}/v1/messages`.
    Anthropic,
    /// Replies from a script file.
    Script,
}

impl ProviderKind {
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Script => "script",
        }
    }
}

/// `[provider] max_tokens_key`: the name an OpenAI-compatible request gives the slot's
/// `max_tokens`. Every compatible server takes `max_tokens`; OpenAI's reasoning models take only
/// `max_completion_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensKey {
    #[default]
    MaxTokens,
    MaxCompletionTokens,
}

impl MaxTokensKey {
    pub fn name(self) -> &'static str {
        match self {
            MaxTokensKey::MaxTokens => "max_tokens",
            MaxTokensKey::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// `[provider]`, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    /// openai: ends in `/v1` as OpenAI's SDKs take it; anthropic: the host, without `/v1`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// The key's file; absent: the systemd credential `api_key`.
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// The `script` provider's file.
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// The PEM bundle of trusted CA certificates for an `https` base URL; absent: the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Allow `http://` to a host that is not loopback (the key then crosses the network in
    /// clear): only for a trusted local network.
    #[serde(default)]
    pub plain_http: bool,
    /// openai only: `max_tokens` (absent) or `max_completion_tokens`.
    #[serde(default)]
    pub max_tokens_key: Option<MaxTokensKey>,
    /// openai only: the server takes no key (a local llama.cpp or vLLM), so none is read and
    /// no auth header is sent. Without it a key is required.
    #[serde(default)]
    pub keyless: bool,
}

/// `[slots.<name>]`: what loopd names instead of a model.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slot {
    pub model: String,
    /// The most tokens one reply may have.
    pub max_tokens: u32,
    /// The model's context window; a request estimated (bytes / 4) over it is refused before
    /// it is sent.
    pub context_tokens: u64,
    /// Absent: the provider's default (some models take none).
    #[serde(default)]
    pub temperature: Option<f64>,
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// The deadline of one request, retries and the whole stream included.
    pub timeout_ms: u64,
    /// How many times a 429, a 5xx or a failed connection is retried before the first byte of
    /// the reply is forwarded.
    pub retries: u32,
    /// The first retry waits this long, each next one twice as long (unless the provider's
    /// `Retry-After` says otherwise).
    pub backoff_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // loopd's own deadline for a whole model call (`[inference] timeout_ms`): a
            // small device's model streams a long reply for minutes, and the shorter of the two
            // would cut it.
            timeout_ms: 300_000,
            retries: 2,
            backoff_ms: 500,
        }
    }
}

impl Limits {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
    pub fn backoff(&self) -> Duration {
        Duration::from_millis(self.backoff_ms)
    }
}

/// Where a provider is: the endpoint URL and what Landlock and TLS need to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The full URL requests go to (`.../chat/completions`, `.../v1/messages`).
    pub url: String,
    /// The host, as written (a name or an address).
    pub host: String,
    /// The TCP port: the one Landlock lets inferproxy connect to.
    pub port: u16,
    /// `https`.
    pub tls: bool,
}

pub use bxharden::daemon::ConfigError;

impl bxharden::daemon::DaemonConfig for Config {
    const SOCKETS: &'static [bxcore::layout::SocketSpec] = &[bxcore::layout::INFER];

    fn check(&mut self) -> Result<(), String> {
        self.validate()
    }

    /// The files `[provider]` names (`api_key_file`, `script`, `ca_file`), when relative, are
    /// taken relative to the configuration's own directory.
    fn resolve(&mut self, dir: &Path) {
        for p in [
            &mut self.provider.api_key_file,
            &mut self.provider.script,
            &mut self.provider.ca_file,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
    }

    bxharden::common_tables!();
}

impl Config {
    fn validate(&self) -> Result<(), String> {
        self.paths.check()?;
        if let Some(p) = &self.sockets.infer {
            if !p.as_os_str().is_empty() && !p.is_absolute() {
                return Err(format!(
                    "[sockets] infer must be an absolute path, not {}",
                    p.display()
                ));
            }
        }
        let p = &self.provider;
        match p.kind {
            ProviderKind::Script => {
                if p.script.is_none() {
                    return Err("[provider] kind = \"script\" needs script = \"<file>\"".into());
                }
                for (set, key) in [
                    (p.base_url.is_some(), "base_url"),
                    (p.api_key_file.is_some(), "api_key_file"),
                    (p.ca_file.is_some(), "ca_file"),
                    (p.plain_http, "plain_http"),
                    (p.max_tokens_key.is_some(), "max_tokens_key"),
                    (p.keyless, "keyless"),
                ] {
                    if set {
                        return Err(format!(
                            "[provider] {key} does not apply to kind = \"script\""
                        ));
                    }
                }
            }
            ProviderKind::Openai | ProviderKind::Anthropic => {
                if p.script.is_some() {
                    return Err(format!(
                        "[provider] script applies only to kind = \"script\", not {:?}",
                        p.kind.name()
                    ));
                }
                if p.kind == ProviderKind::Anthropic && p.max_tokens_key.is_some() {
                    return Err(
                        "[provider] max_tokens_key applies only to kind = \"openai\"".into(),
                    );
                }
                if p.kind == ProviderKind::Anthropic && p.keyless {
                    return Err(
                        "[provider] keyless applies only to kind = \"openai\": Anthropic's API \
                         always takes a key"
                            .into(),
                    );
                }
                if p.keyless && p.api_key_file.is_some() {
                    return Err(
                        "[provider] keyless = true and api_key_file say different things: a \
                         keyless server is sent no key"
                            .into(),
                    );
                }
                self.endpoint()?;
            }
        }
        if self.slots.is_empty() {
            return Err("no [slots.<name>] is configured: loopd needs at least one".into());
        }
        for (name, s) in &self.slots {
            if name.is_empty() {
                return Err("a slot's name is empty".into());
            }
            if s.model.trim().is_empty() {
                return Err(format!("[slots.{name}] model is empty"));
            }
            if s.max_tokens == 0 {
                return Err(format!("[slots.{name}] max_tokens must be at least 1"));
            }
            if s.context_tokens == 0 {
                return Err(format!("[slots.{name}] context_tokens must be at least 1"));
            }
            if let Some(t) = s.temperature {
                if !(0.0..=2.0).contains(&t) {
                    return Err(format!(
                        "[slots.{name}] temperature must be between 0 and 2, not {t}"
                    ));
                }
            }
        }
        let l = &self.limits;
        if l.timeout_ms == 0 || l.timeout_ms > MAX_TIMEOUT_MS {
            return Err(format!(
                "[limits] timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, not {}",
                l.timeout_ms
            ));
        }
        if l.retries > MAX_RETRIES {
            return Err(format!(
                "[limits] retries must be at most {MAX_RETRIES}, not {}",
                l.retries
            ));
        }
        if l.backoff_ms == 0 || l.backoff_ms > 60_000 {
            return Err(format!(
                "[limits] backoff_ms must be between 1 and 60000, not {}",
                l.backoff_ms
            ));
        }
        Ok(())
    }

    /// The socket path: `[sockets] infer`, else `<run>/loop-infer/infer.sock`.
    pub fn infer_socket(&self) -> PathBuf {
        match &self.sockets.infer {
            Some(p) if !p.as_os_str().is_empty() => p.clone(),
            _ => bxcore::layout::INFER.path(&self.paths.home),
        }
    }

    /// inferproxy's own directory, `<home>/infer`.
    pub fn own_dir(&self) -> PathBuf {
        self.paths.home.join("infer")
    }

    /// The provider's endpoint (openai and anthropic only).
    pub fn endpoint(&self) -> Result<Endpoint, String> {
        let p = &self.provider;
        let suffix = match p.kind {
            ProviderKind::Openai => "/chat/completions",
            ProviderKind::Anthropic => "/v1/messages",
            ProviderKind::Script => {
                return Err("the script provider has no endpoint".into());
            }
        };
        let Some(base) = &p.base_url else {
            return Err(format!(
                "[provider] kind = {:?} needs base_url",
                p.kind.name()
            ));
        };
        endpoint(base, suffix, p.plain_http)
    }
}

/// Parse a base URL and build its endpoint: `scheme://host[:port][/path]`, with no user info,
/// query or fragment, and `http` only to loopback unless `plain_http`.
pub fn endpoint(base: &str, suffix: &str, plain_http: bool) -> Result<Endpoint, String> {
    let bad = |why: &str| format!("[provider] base_url {base:?}: {why}");
    let (tls, rest) = if let Some(r) = base.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = base.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(bad(
            "must start with https:// (or http:// for a local server)",
        ));
    };
    if rest.contains(['?', '#']) {
        return Err(bad("must have no query or fragment"));
    }
    if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("must have no spaces or control characters"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(bad(
            "must not carry user info (the key goes in api_key_file)",
        ));
    }
    let (host, port) = split_host_port(authority).map_err(|w| bad(&w))?;
    let port = port.unwrap_or(if tls { 443 } else { 80 });
    if !tls && !plain_http && !is_loopback(&host) {
        return Err(bad(
            "plain http:// sends the API key in clear; use https://, a loopback host, \
             or set [provider] plain_http = true for a trusted local network",
        ));
    }
    let path = path.trim_end_matches('/');
    Ok(Endpoint {
        url: format!(
            "{}://{authority}{path}{suffix}",
            if tls { "https" } else { "http" }
        ),
        host,
        port,
        tls,
    })
}

fn split_host_port(authority: &str) -> Result<(String, Option<u16>), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err("an IPv6 address without its closing ]".into());
        };
        let host = &rest[..end];
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{host:?} is not an IPv6 address"));
        }
        match &rest[end + 1..] {
            "" => (host, None),
            p => match p.strip_prefix(':') {
                Some(p) => (host, Some(p)),
                None => return Err("junk after the IPv6 address".into()),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'))
    {
        return Err(format!("{host:?} is not a host name or address"));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("{p:?} is not a port")),
            Ok(n) => Some(n),
        },
    };
    Ok((host.to_string(), port))
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = r#"
[paths]
home = "/var/lib/boxmaker"

[provider]
kind = "script"
script = "/etc/boxmaker/script.toml"

[slots.main]
model = "scripted"
max_tokens = 1024
context_tokens = 100000
"#;

    fn parse(text: &str) -> Result<Config, String> {
        bxharden::daemon::parse::<Config>(Path::new("inferproxy.toml"), text)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_minimal_script_config_takes_every_default() {
        let c = parse(SCRIPT).unwrap();
        assert_eq!(
            c.infer_socket(),
            Path::new("/run/boxmaker/loop-infer/infer.sock")
        );
        assert_eq!(c.own_dir(), Path::new("/var/lib/boxmaker/infer"));
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.limits.timeout_ms, 300_000);
        assert_eq!(c.limits.retries, 2);
        assert!(c.sandbox.require);
        assert_eq!(c.slots["main"].temperature, None);
    }

    #[test]
    fn relative_provider_files_are_beside_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inferproxy.toml");
        std::fs::write(
            &path,
            SCRIPT.replace("/etc/boxmaker/script.toml", "scripts/s.toml"),
        )
        .unwrap();
        let c = bxharden::daemon::load::<Config>(&path).unwrap();
        assert_eq!(c.provider.script, Some(dir.path().join("scripts/s.toml")));
    }

    #[test]
    fn an_empty_socket_path_means_the_default() {
        let c = parse(&format!("{SCRIPT}\n[sockets]\ninfer = \"\"\n")).unwrap();
        assert_eq!(
            c.infer_socket(),
            Path::new("/run/boxmaker/loop-infer/infer.sock")
        );
        let c = parse(&format!("{SCRIPT}\n[sockets]\ninfer = \"/tmp/x/i.sock\"\n")).unwrap();
        assert_eq!(c.infer_socket(), Path::new("/tmp/x/i.sock"));
    }

    #[test]
    fn an_unknown_key_anywhere_is_refused() {
        for text in [
            format!("{SCRIPT}\nhom = \"/x\"\n"),
            SCRIPT.replace("home = ", "hom = \"/x\"\nhome = "),
            format!("{SCRIPT}\n[limits]\ntimeout = 5\n"),
            format!("{SCRIPT}\n[sandbox]\nusr = \"x\"\n"),
            format!("{SCRIPT}\n[sockets]\nloop = \"/x\"\n"),
            SCRIPT.replace("max_tokens = 1024", "max_tokens = 1024\ntop_p = 1"),
            SCRIPT.replace("kind = \"script\"", "kind = \"script\"\nkey = \"sk\""),
            format!("{SCRIPT}\n[models]\nx = 1\n"),
        ] {
            let e = parse(&text).unwrap_err();
            assert!(e.contains("unknown field"), "{text}: {e}");
        }
    }

    #[test]
    fn every_openai_key_is_read() {
        let c = parse(
            r#"
[paths]
home = "/h"
[sockets]
infer = "/run/i/infer.sock"
[peers]
"infer.sock" = ["bx-loop", 1000]
[provider]
kind = "openai"
base_url = "https://models.example/v1/"
api_key_file = "/run/credentials/key"
ca_file = "/etc/ssl/certs/ca-bundle.crt"
[slots.main]
model = "gpt-4o-mini"
max_tokens = 2048
context_tokens = 128000
temperature = 0.2
[limits]
timeout_ms = 30000
retries = 3
backoff_ms = 100
[sandbox]
user = "bx-infer"
require = true
"#,
        )
        .unwrap();
        let e = c.endpoint().unwrap();
        assert_eq!(e.url, "https://models.example/v1/chat/completions");
        assert_eq!(
            (e.host.as_str(), e.port, e.tls),
            ("models.example", 443, true)
        );
        assert_eq!(c.slots["main"].temperature, Some(0.2));
        assert_eq!(c.limits.retries, 3);
        assert_eq!(c.peers.0["infer.sock"].len(), 2);
    }

    #[test]
    fn max_tokens_key_is_for_openai_only() {
        let openai = r#"
[paths]
home = "/h"
[provider]
kind = "openai"
base_url = "https://x/v1"
max_tokens_key = "max_completion_tokens"
[slots.main]
model = "m"
max_tokens = 1
context_tokens = 1
"#;
        let c = parse(openai).unwrap();
        assert_eq!(
            c.provider.max_tokens_key,
            Some(MaxTokensKey::MaxCompletionTokens)
        );
        let e = parse(&openai.replace("openai", "anthropic")).unwrap_err();
        assert!(e.contains("max_tokens_key applies only"), "{e}");
        let e = parse(&openai.replace("max_completion_tokens", "max_toks")).unwrap_err();
        assert!(e.contains("unknown variant"), "{e}");
        let e = parse(&SCRIPT.replace(
            "kind = \"script\"",
            "kind = \"script\"\nmax_tokens_key = \"max_tokens\"",
        ))
        .unwrap_err();
        assert!(e.contains("max_tokens_key does not apply"), "{e}");
    }

    #[test]
    fn anthropic_endpoints_add_v1_messages() {
        let e = endpoint("https://api.example", "/v1/messages", false).unwrap();
        assert_eq!(e.url, "https://api.example/v1/messages");
        let e = endpoint("http://127.0.0.1:8080", "/v1/messages", false).unwrap();
        assert_eq!(e.url, "http://127.0.0.1:8080/v1/messages");
        assert_eq!(e.port, 8080);
        assert!(!e.tls);
        let e = endpoint("http://[::1]:9/v1", "/chat/completions", false).unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 9));
        assert_eq!(e.url, "http://[::1]:9/v1/chat/completions");
    }

    #[test]
    fn plain_http_off_this_machine_needs_plain_http() {
        let e = endpoint("http://192.168.1.9:8080/v1", "/chat/completions", false).unwrap_err();
        assert!(e.contains("plain_http = true"), "{e}");
        let ok = endpoint("http://192.168.1.9:8080/v1", "/chat/completions", true).unwrap();
        assert_eq!(ok.port, 8080);
        assert!(endpoint("http://localhost:8080/v1", "/chat/completions", false).is_ok());
    }

    #[test]
    fn bad_base_urls_are_refused() {
        for bad in [
            "ftp://x/v1",
            "models.example/v1",
            "https://user:pw@models.example/v1",
            "https://models.example/v1?x=1",
            "https://models.example:0/v1",
            "https://models.example:99999/v1",
            "https:///v1",
            "https://mod els.example/v1",
            "https://[::1/v1",
        ] {
            assert!(
                endpoint(bad, "/chat/completions", false).is_err(),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn nonsensical_provider_settings_are_refused() {
        let cases = [
            (
                SCRIPT.replace("kind = \"script\"", "kind = \"openai\""),
                "script applies only",
            ),
            (
                SCRIPT.replace(
                    "script = \"/etc/boxmaker/script.toml\"",
                    "base_url = \"https://x/v1\"",
                ),
                "needs script",
            ),
            (
                SCRIPT.replace(
                    "kind = \"script\"",
                    "kind = \"script\"\napi_key_file = \"/k\"",
                ),
                "api_key_file does not apply",
            ),
            (
                SCRIPT.replace("kind = \"script\"", "kind = \"bard\""),
                "unknown variant",
            ),
        ];
        for (text, want) in cases {
            let e = parse(&text).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        let no_base = r#"
[paths]
home = "/h"
[provider]
kind = "anthropic"
[slots.main]
model = "m"
max_tokens = 1
context_tokens = 1
"#;
        assert!(parse(no_base).unwrap_err().contains("needs base_url"));
    }

    #[test]
    fn bad_slots_and_limits_are_refused() {
        let cases = [
            (SCRIPT.replace("model = \"scripted\"", "model = \" \""), "model is empty"),
            (SCRIPT.replace("max_tokens = 1024", "max_tokens = 0"), "max_tokens"),
            (
                SCRIPT.replace("context_tokens = 100000", "context_tokens = 0"),
                "context_tokens",
            ),
            (
                SCRIPT.replace("max_tokens = 1024", "max_tokens = 1024\ntemperature = 3.5"),
                "temperature",
            ),
            (format!("{SCRIPT}\n[limits]\ntimeout_ms = 0\n"), "timeout_ms"),
            (
                format!("{SCRIPT}\n[limits]\ntimeout_ms = 3600001\n"),
                "timeout_ms",
            ),
            (format!("{SCRIPT}\n[limits]\nretries = 11\n"), "retries"),
            (format!("{SCRIPT}\n[limits]\nbackoff_ms = 0\n"), "backoff_ms"),
            (format!("{SCRIPT}\n[serve]\nfirst_frame_ms = 0\n"), "first_frame_ms"),
            (format!("{SCRIPT}\n[serve]\nwrite_ms = 0\n"), "write_ms"),
            (
                SCRIPT.replace(
                    "[slots.main]\nmodel = \"scripted\"\nmax_tokens = 1024\ncontext_tokens = 100000\n",
                    "",
                ),
                "no [slots.<name>]",
            ),
            (
                SCRIPT.replace("home = \"/var/lib/boxmaker\"", "home = \"rel\""),
                "absolute",
            ),
            (
                format!("{SCRIPT}\n[peers]\n\"loop.sock\" = [\"x\"]\n"),
                "does not serve",
            ),
        ];
        for (text, want) in cases {
            let e = parse(&text).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
