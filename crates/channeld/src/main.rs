//! channeld, as its table: `channeld serve --config FILE` and `channeld check --config FILE`.

use std::process::ExitCode;
use std::sync::Arc;

use bxcore::layout::ChannelRequest;
use bxharden::daemon::{NoMore, Running, Spec, Start, StartError, Table, Usage};
use bxharden::serve::Socket;
use bxharden::{Daemon, Profile};
use channeld::channel::Channel;
use channeld::config::{CONFIG_ANCHOR, Config};
use channeld::daemon::{self, Prepared};
use channeld::state::State;

/// What `serve` opens: the client read, the channel's state, channel.sock.
struct Opened {
    read: Prepared,
    state: State,
    socket: Socket<ChannelRequest>,
}

struct Channeld;

impl Table for Channeld {
    const SPEC: Spec = Spec {
        daemon: Daemon {
            name: "channeld",
            version: env!("CARGO_PKG_VERSION"),
        },
        config_anchor: CONFIG_ANCHOR,
    };
    const USAGE: Usage = Usage {
        about: "The Matrix channel: the owner's turns and approvals from their phone",
        serve: "Serve the owner's Matrix rooms, and channel.sock",
        check: "Load and check the configuration, the token file and the CA bundle; print what would be served",
    };
    type Config = Config;
    /// The token, the CA bundle and the homeserver's addresses, read; the client built.
    type Read = Prepared;
    type Prepared = Opened;
    type More = NoMore;

    fn read(cfg: &Config) -> Result<Prepared, StartError> {
        daemon::prepare(cfg)
    }

    fn serves(cfg: &Config, read: &Prepared) -> Vec<String> {
        vec![daemon::describe(cfg, read)]
    }

    fn prepare(s: &mut Start<Config>, read: Prepared) -> Result<Opened, StartError> {
        let dir = s.cfg().own_dir();
        s.own_dir(&dir)?;
        let state = State::load(&dir).map_err(|e| StartError::anchored(&e))?;
        let socket = s.listen(&s.cfg().sockets.channel.clone())?;
        Ok(Opened {
            read,
            state,
            socket,
        })
    }

    fn profile(s: &Start<Config>, _: &Opened) -> Profile {
        daemon::profile(s.cfg(), s.path())
    }

    fn serve(cfg: Config, o: Opened, running: &Running) -> Result<(), StartError> {
        let dir = cfg.own_dir();
        let ch = Arc::new(Channel::new(cfg, o.read.client, dir, o.state));
        let served = Arc::clone(&ch);
        running.serve(o.socket, move |stream, id, req| {
            channeld::owner::handle(stream, id, req, &served)
        })?;
        running.thread("sync", move || channeld::channel::run(&ch))
    }

    fn more(command: NoMore) -> ExitCode {
        match command {}
    }
}

fn main() -> ExitCode {
    bxharden::daemon::main::<Channeld>()
}
