//! `channeld serve` and `channeld check`: the start-up every daemon runs (the configuration,
//! the token, the CA bundle and the homeserver's addresses read while the whole filesystem is
//! there; channel.sock bound; then the sandbox, and only then threads), and the sync loop.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bxcore::layout;
use bxharden::daemon::{self, Cli, Command, NoMore, Spec, Start, StartError, Usage};
use bxharden::{Daemon, Profile, SeccompProfile};

use crate::channel::Channel;
use crate::config::{CONFIG_ANCHOR, Config};
use crate::matrix::{Client, Pinned};
use crate::state::State;
use crate::token::Token;

/// channeld, for the start-up every daemon runs.
pub const SPEC: Spec = Spec {
    daemon: Daemon {
        name: "channeld",
        version: env!("CARGO_PKG_VERSION"),
    },
    config_anchor: CONFIG_ANCHOR,
};

/// The command line's words.
pub const USAGE: Usage = Usage {
    about: "The Matrix channel: the owner's turns and approvals from their phone",
    serve: "Serve the owner's Matrix rooms, and channel.sock",
    check: "Load and check the configuration, the token file and the CA bundle; print what would be served",
};

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

fn describe(cfg: &Config, p: &Prepared) -> String {
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

/// `channeld check --config FILE`.
pub fn check(config: &Path) -> ExitCode {
    daemon::check(SPEC, config, |cfg: Config| {
        let p = prepare(&cfg)?;
        println!("channeld: configuration ok");
        println!("channeld: would serve {}", describe(&cfg, &p));
        Ok(())
    })
}

/// `channeld serve --config FILE`.
pub fn serve(config: &Path) -> ExitCode {
    daemon::run(SPEC, || start(config))
}

fn start(config: &Path) -> Result<std::convert::Infallible, StartError> {
    let mut s = Start::<Config>::load(SPEC, config)?;
    let prepared = prepare(s.cfg())?;
    let dir = s.cfg().own_dir();
    s.own_dir(&dir)?;
    let state = State::load(&dir).map_err(|e| StartError::anchored(&e))?;
    let path = s.cfg().sockets.channel.clone();
    let socket = s.listen(layout::CHANNEL, &path)?;

    let hs = s.cfg().homeserver();
    let mut profile = Profile::new(SeccompProfile::Channeld)
        .read_write(&dir)
        .read_only(std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf()))
        .connect_tcp(hs.port);
    for socket in [&s.cfg().sockets.bridge, &s.cfg().sockets.decide] {
        if let Some(d) = socket.parent().filter(|d| d.is_dir()) {
            profile = profile.read_write(d);
        }
    }
    let (cfg, running) = s.sandbox(&profile)?;
    let what = describe(&cfg, &prepared);
    let ch = Arc::new(Channel::new(cfg, prepared.client, dir, state));
    let served = Arc::clone(&ch);
    running.serve(socket, move |stream, env| {
        crate::owner::handle(stream, env, &served)
    })?;
    let syncing = Arc::clone(&ch);
    std::thread::Builder::new()
        .name("sync".into())
        .stack_size(512 * 1024)
        .spawn(move || crate::channel::run(&syncing))
        .map_err(|e| {
            StartError::own(
                bxharden::serve::LISTENER_ANCHOR,
                format!("cannot start the sync thread: {e}"),
            )
        })?;
    bxharden::log::notice(&format!("serving {what}"));
    running.ready()
}

/// The whole program.
pub fn main() -> ExitCode {
    match Cli::<NoMore>::parse(SPEC.daemon, &USAGE) {
        Command::Serve { config } => serve(&config),
        Command::Check { config } => check(&config),
        Command::More(no) => match no {},
    }
}
