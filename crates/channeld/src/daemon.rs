//! What channeld's table (`main.rs`) is made of: what its configuration names, read while the
//! whole filesystem is there (the token, the CA bundle, the homeserver's addresses), what it says
//! it serves, and its sandbox.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bxharden::daemon::StartError;
use bxharden::{Profile, SeccompProfile};

use crate::config::{CONFIG_ANCHOR, Config};
use crate::matrix::{Client, Pinned};
use crate::token::Token;

/// What the configuration names, read before the sandbox.
#[derive(Debug)]
pub struct Prepared {
    pub client: Client,
    pub addresses: Vec<std::net::SocketAddr>,
    pub token_from: PathBuf,
    pub ca: String,
}

fn own(e: impl std::fmt::Display) -> StartError {
    StartError::own(CONFIG_ANCHOR, e)
}

/// Read the token and the CA bundle, look the homeserver up, and build the client.
pub fn prepare(cfg: &Config) -> Result<Prepared, StartError> {
    let token_from =
        Token::source(cfg.matrix.token_file.as_deref()).map_err(|e| StartError::anchored(&e))?;
    let token = Token::read(&token_from).map_err(|e| StartError::anchored(&e))?;
    let hs = cfg.homeserver();
    let (roots, ca) = if hs.tls {
        match bxtls::load(cfg.tls.ca_file.as_deref()).map_err(own)? {
            Some(b) => (b.certs, b.path.display().to_string()),
            None => {
                return Err(own(
                    "no CA bundle: [tls] ca_file is not set and the system has none of \
                     /etc/ssl/certs/ca-certificates.crt, /etc/ssl/certs/ca-bundle.crt, \
                     /etc/pki/tls/certs/ca-bundle.crt",
                ));
            }
        }
    } else {
        (Vec::new(), "nothing (plain http on loopback)".to_string())
    };
    let pinned = Pinned::new(&hs.host, hs.port);
    let addresses = pinned.addresses().to_vec();
    if addresses.is_empty() {
        bxharden::log::notice(&format!(
            "the homeserver's host {} does not resolve now; every request fails until a restart \
             finds it",
            hs.host
        ));
    }
    let client = Client::new(
        &hs,
        pinned,
        token,
        roots,
        cfg.limits.max_response_bytes,
        Duration::from_millis(cfg.limits.request_ms),
    );
    Ok(Prepared {
        client,
        addresses,
        token_from,
        ca,
    })
}

/// What channeld serves, for `check` and the start-up notice. Never the token.
pub fn describe(cfg: &Config, p: &Prepared) -> String {
    let a: Vec<String> = p.addresses.iter().map(ToString::to_string).collect();
    format!(
        "{} as {} (addresses {}; trusting {}), the token from {}, rooms {}, owners who may pair \
         {}; turns on {}, decisions on {}, the owner on {}",
        p.client.base(),
        cfg.matrix.user,
        if a.is_empty() {
            "none".into()
        } else {
            a.join(", ")
        },
        p.ca,
        p.token_from.display(),
        cfg.matrix.rooms.join(", "),
        if cfg.matrix.owners.is_empty() {
            "(anyone who sends the code)".to_string()
        } else {
            cfg.matrix.owners.join(", ")
        },
        cfg.sockets.bridge.display(),
        cfg.sockets.decide.display(),
        cfg.sockets.channel.display(),
    )
}

/// What channeld may touch: its own directory read-write, its configuration, the directories of
/// bridge.sock and decide.sock (when they exist), TCP connect to the homeserver's port.
pub fn profile(cfg: &Config, config: &Path) -> Profile {
    let mut profile = Profile::new(SeccompProfile::Channeld)
        .read_write(cfg.own_dir())
        .read_only(std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf()))
        .connect_tcp(cfg.homeserver().port);
    for socket in [&cfg.sockets.bridge, &cfg.sockets.decide] {
        if let Some(d) = socket.parent().filter(|d| d.is_dir()) {
            profile = profile.read_write(d);
        }
    }
    profile
}
