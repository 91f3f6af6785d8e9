//! `gatewayd.toml`: where gatewayd listens, which name servers it asks, its limits, and the
//! hosts the box may reach, each with the ports, plain HTTP, internal addresses and credential
//! it is allowed. Every table refuses unknown keys and every value is checked when the file
//! loads: a typo is a refusal to start, never a host opened by surprise.
//!
//! ```toml
//! [paths]
//! home = "/var/lib/boxmaker"
//! [dns]
//! servers = ["9.9.9.9:53"]        # absent: the name servers of /etc/resolv.conf, port 53
//! [limits]
//! timeout_ms = 30000               # a whole fetch, every hop and every byte
//! max_bytes = 1048576              # the most of a body read; a request may ask for less
//! [[hosts]]
//! name = "api.example.org"         # or "*.example.org": every name below it
//! header = "authorization"         # the credential added to its requests, and only to them
//! prefix = "Bearer "
//! secret_file = "/run/credentials/gatewayd.service/example"
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bxharden::{Peers, SandboxConfig, ServeConfig};
use serde::Deserialize;

use crate::address::Block;
use crate::hosts::Pattern;

/// The runbook anchor of a configuration gatewayd refuses.
pub const CONFIG_ANCHOR: &str = "gateway-config-invalid";

/// The most redirects a fetch follows, whatever the configuration says.
pub const MAX_REDIRECTS: u8 = 5;
/// The longest `timeout_ms` accepted: ten minutes.
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// The largest `max_bytes` accepted: 16 MiB (the reply must fit a frame as text).
pub const MAX_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// The shortest secret accepted: a shorter one would match by chance, and refuse good requests.
pub const MIN_SECRET_BYTES: usize = 8;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub paths: Paths,
    #[serde(default)]
    pub sockets: Sockets,
    #[serde(default)]
    pub peers: Peers,
    #[serde(default)]
    pub dns: Dns,
    #[serde(default)]
    pub tls: Tls,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub hosts: Vec<HostEntry>,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    #[serde(default)]
    pub serve: ServeConfig,
}

/// `[paths]`: the box's home, as every daemon has it.
pub use bxharden::config::Paths;

/// `[sockets]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sockets {
    /// Default `<run>/broker-gateway/gateway.sock`.
    #[serde(default)]
    pub gateway: Option<PathBuf>,
}

/// `[dns]`: names are looked up over TCP (gatewayd makes stream sockets only), by these servers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dns {
    /// `address:port`; empty: the `nameserver` lines of `/etc/resolv.conf`, port 53.
    pub servers: Vec<SocketAddr>,
    /// How long one server has to answer.
    pub timeout_ms: u64,
}

impl Default for Dns {
    fn default() -> Self {
        Dns {
            servers: Vec::new(),
            timeout_ms: 5_000,
        }
    }
}

/// `[tls]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// The PEM bundle of trusted CA certificates; absent: the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// A whole fetch: lookups, connections, every redirect and every byte of the body.
    pub timeout_ms: u64,
    /// The most bytes of a response body read; the rest is never read.
    pub max_bytes: u64,
    /// The most bytes of a response's head (status line and headers).
    pub max_header_bytes: usize,
    /// The most redirects followed, at most [`MAX_REDIRECTS`].
    pub max_redirects: u8,
    /// The most bytes of a request body.
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: 30_000,
            max_bytes: 1024 * 1024,
            max_header_bytes: 64 * 1024,
            max_redirects: MAX_REDIRECTS,
            max_request_bytes: 64 * 1024,
        }
    }
}

/// `[[hosts]]`: one name (or every name below a suffix) the box may reach.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    /// `example.org`, `*.example.org` (every name below it, not the suffix itself), or an
    /// address.
    pub name: Pattern,
    /// Allow `http://` (HTTPS only otherwise).
    #[serde(default)]
    pub http: bool,
    /// Ports besides 443 (and 80 with `http`).
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Addresses in refused ranges (loopback, private, link-local, ...) this host may resolve
    /// to: a server on the owner's own network.
    #[serde(default)]
    pub addresses: Vec<Block>,
    /// The header a credential is sent in, to this host only.
    #[serde(default)]
    pub header: Option<String>,
    /// Put before the secret in the header's value (`"Bearer "`).
    #[serde(default)]
    pub prefix: Option<String>,
    /// The file holding the secret (one line; a final newline is not part of it).
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// Instead of `secret_file`: the name of a systemd credential (`LoadCredential=`), read
    /// from `$CREDENTIALS_DIRECTORY`, as the NixOS module hands secrets over.
    #[serde(default)]
    pub credential: Option<String>,
}

impl HostEntry {
    /// Whether a URL on `port` with TLS (`tls`) may go to this host.
    pub fn allows_port(&self, port: u16, tls: bool) -> bool {
        (tls && port == 443) || (self.http && !tls && port == 80) || self.ports.contains(&port)
    }
}

pub use bxharden::daemon::ConfigError;

impl bxharden::daemon::DaemonConfig for Config {
    const SOCKETS: &'static [bxcore::layout::SocketSpec] = &[bxcore::layout::GATEWAY];

    fn check(&mut self) -> Result<(), String> {
        self.validate()
    }

    /// `secret_file` and `ca_file`, when relative, are taken from the configuration's directory.
    fn resolve(&mut self, dir: &Path) {
        let files = self
            .hosts
            .iter_mut()
            .filter_map(|h| h.secret_file.as_mut())
            .chain(self.tls.ca_file.as_mut());
        for p in files {
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
        if let Some(p) = &self.sockets.gateway {
            if !p.is_absolute() {
                return Err(format!(
                    "[sockets] gateway must be an absolute path, not {}",
                    p.display()
                ));
            }
        }
        if self.dns.timeout_ms == 0 || self.dns.timeout_ms > MAX_TIMEOUT_MS {
            return Err(format!(
                "[dns] timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, not {}",
                self.dns.timeout_ms
            ));
        }
        if let Some(s) = self.dns.servers.iter().find(|s| s.port() == 0) {
            return Err(format!("[dns] servers: {s} has no port"));
        }
        let l = &self.limits;
        if l.timeout_ms == 0 || l.timeout_ms > MAX_TIMEOUT_MS {
            return Err(format!(
                "[limits] timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, not {}",
                l.timeout_ms
            ));
        }
        if l.max_bytes == 0 || l.max_bytes > MAX_BODY_BYTES {
            return Err(format!(
                "[limits] max_bytes must be between 1 and {MAX_BODY_BYTES}, not {}",
                l.max_bytes
            ));
        }
        if !(1024..=1024 * 1024).contains(&l.max_header_bytes) {
            return Err(format!(
                "[limits] max_header_bytes must be between 1024 and 1048576, not {}",
                l.max_header_bytes
            ));
        }
        if l.max_redirects > MAX_REDIRECTS {
            return Err(format!(
                "[limits] max_redirects must be at most {MAX_REDIRECTS}, not {}",
                l.max_redirects
            ));
        }
        if l.max_request_bytes > 1024 * 1024 {
            return Err(format!(
                "[limits] max_request_bytes must be at most 1048576, not {}",
                l.max_request_bytes
            ));
        }
        for (i, h) in self.hosts.iter().enumerate() {
            let at = format!("[[hosts]] {} ({})", i + 1, h.name);
            if let Some(p) = h.ports.iter().find(|p| **p == 0) {
                return Err(format!("{at}: port {p} is not a port"));
            }
            if let Some(c) = &h.credential {
                let ok = !c.is_empty()
                    && c != "."
                    && c != ".."
                    && c.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
                if !ok {
                    return Err(format!(
                        "{at}: credential {c:?} is not a credential name (letters, digits, . _ -)"
                    ));
                }
            }
            if let Some(b) = h.addresses.iter().find(|b| b.refused_range().is_none()) {
                return Err(format!(
                    "{at}: addresses {b} reaches beyond one refused range: `addresses` lets \
                     this host reach a server on the owner's own network (192.168.1.0/24, \
                     10.0.0.5); name that network, not the web at large"
                ));
            }
            let secret = h.secret_file.is_some() || h.credential.is_some();
            if secret && matches!(h.name, Pattern::Below(_)) {
                return Err(format!(
                    "{at}: a credential goes to one named host, never to every name below a \
                     suffix (any of them could be another's server); name the host itself"
                ));
            }
            if secret && h.http {
                return Err(format!(
                    "{at}: a credential is never sent over plain http (anyone on the path \
                     reads it); remove http = true, or the credential"
                ));
            }
            if h.secret_file.is_some() && h.credential.is_some() {
                return Err(format!(
                    "{at}: secret_file and credential: give one of them"
                ));
            }
            match (&h.header, secret) {
                (Some(name), true) => {
                    if ureq::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                        return Err(format!("{at}: header {name:?} is not a header name"));
                    }
                }
                (None, false) => {
                    if h.prefix.is_some() {
                        return Err(format!("{at}: prefix needs header and secret_file"));
                    }
                }
                _ => {
                    return Err(format!(
                        "{at}: header goes with secret_file (or credential), and they with it"
                    ));
                }
            }
            if let Some(j) = self.hosts[..i].iter().position(|o| o.name == h.name) {
                return Err(format!("{at}: the same name as [[hosts]] {}", j + 1));
            }
        }
        Ok(())
    }

    /// The socket path: `[sockets] gateway`, else `<run>/broker-gateway/gateway.sock`.
    pub fn gateway_socket(&self) -> PathBuf {
        match &self.sockets.gateway {
            Some(p) => p.clone(),
            None => bxcore::layout::GATEWAY.path(&self.paths.home),
        }
    }

    /// gatewayd's own directory, `<home>/gateway`.
    pub fn own_dir(&self) -> PathBuf {
        bxcore::layout::daemon("gatewayd")
            .map(|d| d.state_path(&self.paths.home))
            .unwrap_or_else(|| self.paths.home.join("gateway"))
    }

    /// Every TCP port a fetch may connect to: 443, 80 when a host allows `http`, each host's
    /// own ports, and the name servers' (Landlock's connect rule).
    pub fn ports(&self, dns: &[SocketAddr]) -> Vec<u16> {
        let mut p = vec![443];
        for h in &self.hosts {
            if h.http {
                p.push(80);
            }
            p.extend(&h.ports);
        }
        p.extend(dns.iter().map(SocketAddr::port));
        p.sort_unstable();
        p.dedup();
        p
    }
}
