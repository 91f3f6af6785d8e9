//! `channeld.toml`: the homeserver, the bot's account and its token, the owner's Matrix ids and
//! rooms, where loopd and brokerd are, and the limits. Every table refuses unknown keys and
//! every value is checked when the file loads.
//!
//! ```toml
//! [paths]
//! home = "/var/lib/boxmaker"
//! [matrix]
//! homeserver = "https://matrix.example.org"   # or http://127.0.0.1:8008 on loopback
//! user = "@box:example.org"                    # the bot's own account
//! token_file = "/var/lib/boxmaker-keys/matrix-token"   # or credential = "matrix_token" (systemd)
//! owners = ["@me:example.org"]                 # who may pair (bxctl channel pair) and invite
//! rooms = ["!abcdef:example.org"]              # the only rooms it serves
//! ```

use std::path::{Path, PathBuf};

use bxharden::{Peers, SandboxConfig, ServeConfig};
use serde::Deserialize;

use bxcore::layout;

/// The runbook anchor of a configuration channeld refuses.
pub const CONFIG_ANCHOR: &str = "channel-config-invalid";

/// The systemd credential the token is read from when `token_file` is not set.
pub const CREDENTIAL: &str = "matrix_token";

/// The longest timeout accepted anywhere: an hour.
pub const MAX_TIMEOUT_MS: u64 = 60 * 60 * 1000;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub paths: Paths,
    pub matrix: Matrix,
    #[serde(default)]
    pub sockets: Sockets,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub tls: Tls,
    #[serde(default)]
    pub peers: Peers,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    #[serde(default)]
    pub serve: ServeConfig,
}

pub use bxharden::config::Paths;

/// `[matrix]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matrix {
    /// The homeserver's base URL: `https://host[:port]`, or `http://` to a loopback address.
    pub homeserver: String,
    /// The bot's own user id, `@name:server`: its own messages are never turns.
    pub user: String,
    /// The access token's file (0600); absent: the systemd credential [`CREDENTIAL`].
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The Matrix ids that may be paired as the owner (`bxctl channel pair`) and whose invites
    /// to a configured room are taken. Nobody is the owner before pairing.
    #[serde(default)]
    pub owners: Vec<String>,
    /// The room ids (`!id:server`) the channel serves; a message anywhere else is never a turn.
    pub rooms: Vec<String>,
    /// Every session the channel runs is named `<prefix><room digest>`; loopd's `[bridge]`
    /// and brokerd's `[decide]` must have the same prefix.
    #[serde(default = "default_prefix")]
    pub session_prefix: String,
}

fn default_prefix() -> String {
    layout::CHANNEL_SESSION_PREFIX.to_string()
}

/// `[sockets]`: where loopd, brokerd and the owner meet channeld; empty means the default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sockets {
    /// loopd's bridge.sock.
    pub bridge: PathBuf,
    /// brokerd's decide.sock.
    pub decide: PathBuf,
    /// channel.sock, which channeld serves to the owner.
    pub channel: PathBuf,
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
    /// How long one `/sync` long poll waits on the server.
    pub sync_timeout_ms: u64,
    /// Every other request, whole.
    pub request_ms: u64,
    /// The most bytes of one response read; the rest is never read.
    pub max_response_bytes: u64,
    /// The shortest time between two edits of a streaming answer.
    pub edit_interval_ms: u64,
    /// The most bytes of an answer shown; the rest is cut with a note.
    pub max_reply_bytes: usize,
    /// The most bytes of a message from the owner handed to loopd as a turn.
    pub max_turn_bytes: usize,
    /// How long one turn may take, waiting for approvals included.
    pub turn_ms: u64,
    /// The longest wait between two tries while the homeserver is down.
    pub max_backoff_ms: u64,
    /// How long a pairing code is good for.
    pub pairing_ms: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            sync_timeout_ms: 30_000,
            request_ms: 30_000,
            max_response_bytes: 4 * 1024 * 1024,
            edit_interval_ms: 1_000,
            max_reply_bytes: 16_000,
            max_turn_bytes: 16_000,
            turn_ms: 30 * 60 * 1000,
            max_backoff_ms: 60_000,
            pairing_ms: 10 * 60 * 1000,
        }
    }
}

pub use bxharden::daemon::ConfigError;

impl bxharden::daemon::DaemonConfig for Config {
    const SOCKETS: &'static [layout::SocketSpec] = &[layout::CHANNEL];

    fn check(&mut self) -> Result<(), String> {
        self.validate()?;
        let home = self.paths.home.clone();
        for (path, spec) in [
            (&mut self.sockets.bridge, layout::BRIDGE),
            (&mut self.sockets.decide, layout::DECIDE),
            (&mut self.sockets.channel, layout::CHANNEL),
        ] {
            if path.as_os_str().is_empty() {
                *path = spec.path(&home);
            }
        }
        Ok(())
    }

    fn resolve(&mut self, dir: &Path) {
        for p in self
            .matrix
            .token_file
            .iter_mut()
            .chain(self.tls.ca_file.iter_mut())
        {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
    }

    bxharden::common_tables!();
}

/// The homeserver's URL taken apart: what the client connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Homeserver {
    /// `https://host:port` or `http://host:port`, no path, no final slash.
    pub base: String,
    pub tls: bool,
    /// Without brackets for an IPv6 address.
    pub host: String,
    pub port: u16,
}

impl Homeserver {
    /// `url` checked: `https://` (or `http://` to a loopback address), a host, an optional port,
    /// no user, no query, no path but `/`.
    pub fn parse(url: &str) -> Result<Homeserver, String> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!(
                "[matrix] homeserver {url:?} must start with https:// (or http:// on loopback)"
            ));
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty()
            || authority.contains(['/', '?', '#', '@'])
            || authority.contains(char::is_whitespace)
        {
            return Err(format!(
                "[matrix] homeserver {url:?} must be a scheme, a host and a port only"
            ));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("[matrix] homeserver {url:?}: an unclosed ["))?;
            (h.to_string(), after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("[matrix] homeserver {url:?}: {p:?} is not a port"))?,
            None if tls => 443,
            None => 80,
        };
        if host.is_empty() {
            return Err(format!("[matrix] homeserver {url:?} names no host"));
        }
        if !tls {
            let loopback = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|a| a.is_loopback());
            if !loopback {
                return Err(format!(
                    "[matrix] homeserver {url:?}: plain http is for a loopback address only; the \
                     token would cross the network in the clear"
                ));
            }
        }
        let shown = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        Ok(Homeserver {
            base: format!("{}://{shown}:{port}", if tls { "https" } else { "http" }),
            tls,
            host,
            port,
        })
    }
}

/// Whether `s` is a Matrix user id: `@localpart:server`, printable ASCII, at most 255 bytes.
pub fn is_user_id(s: &str) -> bool {
    is_id(s, '@')
}

/// Whether `s` is a Matrix room id: `!opaque:server`, or (room version 12 and later) `!opaque`
/// alone, printable ASCII, at most 255 bytes.
pub fn is_room_id(s: &str) -> bool {
    s.len() > 1 && s.len() <= 255 && s.starts_with('!') && s.bytes().all(|b| b.is_ascii_graphic())
}

fn is_id(s: &str, sigil: char) -> bool {
    s.len() <= 255
        && s.starts_with(sigil)
        && s[1..]
            .split_once(':')
            .is_some_and(|(l, d)| !l.is_empty() && !d.is_empty())
        && s.bytes().all(|b| b.is_ascii_graphic())
}

impl Config {
    /// Read, parse and check `path` (`bxharden::daemon::load`).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        bxharden::daemon::load(path)
    }

    /// Parse and check `text` (named `path` in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        bxharden::daemon::parse(path, text)
    }

    /// The homeserver, checked when the file loaded.
    pub fn homeserver(&self) -> Homeserver {
        // Checked by `validate`, so this parse cannot fail; fail closed to an unusable address.
        Homeserver::parse(&self.matrix.homeserver).unwrap_or(Homeserver {
            base: String::new(),
            tls: true,
            host: String::new(),
            port: 443,
        })
    }

    /// channeld's own directory, `<home>/channel`.
    pub fn own_dir(&self) -> PathBuf {
        layout::daemon("channeld")
            .map(|d| d.state_path(&self.paths.home))
            .unwrap_or_else(|| self.paths.home.join("channel"))
    }

    fn validate(&self) -> Result<(), String> {
        self.paths.check()?;
        Homeserver::parse(&self.matrix.homeserver)?;
        let m = &self.matrix;
        if !is_user_id(&m.user) {
            return Err(format!(
                "[matrix] user {:?} is not a Matrix user id (@name:server)",
                m.user
            ));
        }
        if let Some(o) = m.owners.iter().find(|o| !is_user_id(o)) {
            return Err(format!(
                "[matrix] owners: {o:?} is not a Matrix user id (@name:server)"
            ));
        }
        if m.owners.contains(&m.user) {
            return Err(format!(
                "[matrix] owners: {:?} is the channel's own account",
                m.user
            ));
        }
        if m.rooms.is_empty() {
            return Err("[matrix] rooms is empty: name the room ids the channel serves".into());
        }
        if let Some(r) = m.rooms.iter().find(|r| !is_room_id(r)) {
            return Err(format!(
                "[matrix] rooms: {r:?} is not a room id (!id or !id:server; an alias is not taken)"
            ));
        }
        let p = &m.session_prefix;
        if p.is_empty() || p.len() > 32 || bxcore::SessionId::new(p.clone()).is_err() {
            return Err(format!(
                "[matrix] session_prefix {p:?} must be 1 to 32 of A-Z a-z 0-9 _ -"
            ));
        }
        let l = &self.limits;
        for (key, ms) in [
            ("sync_timeout_ms", l.sync_timeout_ms),
            ("request_ms", l.request_ms),
            ("edit_interval_ms", l.edit_interval_ms),
            ("turn_ms", l.turn_ms),
            ("max_backoff_ms", l.max_backoff_ms),
            ("pairing_ms", l.pairing_ms),
        ] {
            if ms == 0 || ms > MAX_TIMEOUT_MS {
                return Err(format!(
                    "[limits] {key} must be between 1 and {MAX_TIMEOUT_MS}, not {ms}"
                ));
            }
        }
        if !(64 * 1024..=64 * 1024 * 1024).contains(&l.max_response_bytes) {
            return Err(format!(
                "[limits] max_response_bytes must be between 65536 and 67108864, not {}",
                l.max_response_bytes
            ));
        }
        for (key, n) in [
            ("max_reply_bytes", l.max_reply_bytes),
            ("max_turn_bytes", l.max_turn_bytes),
        ] {
            if !(256..=60_000).contains(&n) {
                return Err(format!(
                    "[limits] {key} must be between 256 and 60000 (a Matrix event is at most \
                     65536 bytes), not {n}"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_homeserver_url_is_taken_apart_and_plain_http_only_on_loopback() {
        let h = Homeserver::parse("https://matrix.example.org").unwrap();
        assert_eq!(
            (h.base.as_str(), h.tls, h.host.as_str(), h.port),
            (
                "https://matrix.example.org:443",
                true,
                "matrix.example.org",
                443
            )
        );
        let h = Homeserver::parse("http://127.0.0.1:8008/").unwrap();
        assert_eq!(h.base, "http://127.0.0.1:8008");
        let h = Homeserver::parse("http://[::1]:8008").unwrap();
        assert_eq!((h.host.as_str(), h.port), ("::1", 8008));
        for bad in [
            "http://matrix.example.org",
            "ftp://x",
            "https://",
            "https://a/b",
            "https://u@a",
            "https://a:0",
            "https://a:x",
        ] {
            assert!(Homeserver::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_are_checked() {
        assert!(is_user_id("@me:example.org"));
        assert!(!is_user_id("me:example.org"));
        assert!(!is_user_id("@me"));
        assert!(!is_user_id("@m e:x"));
        assert!(is_room_id("!abc:example.org"));
        assert!(is_room_id("!t7ZK2RxnXKQ_9Bwu1TspBqYJ0SGljJVpyjuGBa1v_Og"));
        assert!(!is_room_id("#alias:example.org"));
        assert!(!is_room_id("!"));
    }
}
