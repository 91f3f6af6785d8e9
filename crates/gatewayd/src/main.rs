//! gatewayd, as its table: `gatewayd serve --config FILE` and `gatewayd check --config FILE`.

use std::process::ExitCode;
use std::sync::Arc;

use bxcore::layout::GatewayRequest;
use bxharden::daemon::{NoMore, Running, Spec, Start, StartError, Table, Usage};
use bxharden::serve::Socket;
use bxharden::{Daemon, Profile};
use gatewayd::config::{CONFIG_ANCHOR, Config};
use gatewayd::daemon::{self, Prepared};

struct Gatewayd;

impl Table for Gatewayd {
    const SPEC: Spec = Spec {
        daemon: Daemon {
            name: "gatewayd",
            version: env!("CARGO_PKG_VERSION"),
        },
        config_anchor: CONFIG_ANCHOR,
    };
    const USAGE: Usage = Usage {
        about: "The tools' only door to the network: allow-list, checked addresses, limits, credentials",
        serve: "Serve gateway.sock",
        check: "Load and check the configuration and the files it names, print what would be served",
    };
    type Config = Config;
    /// The secrets, the CA bundle and the name servers, read.
    type Read = Prepared;
    type Prepared = (Prepared, Socket<GatewayRequest>);
    type More = NoMore;

    fn read(cfg: &Config) -> Result<Prepared, StartError> {
        daemon::prepare(cfg)
    }

    fn serves(cfg: &Config, read: &Prepared) -> Vec<String> {
        vec![daemon::describe(cfg, read)]
    }

    fn prepare(s: &mut Start<Config>, read: Prepared) -> Result<Self::Prepared, StartError> {
        s.own_dir(&s.cfg().own_dir())?;
        let socket = s.listen(&s.cfg().gateway_socket())?;
        Ok((read, socket))
    }

    fn profile(s: &Start<Config>, (read, _): &Self::Prepared) -> Profile {
        daemon::profile(s.cfg(), read, s.path())
    }

    fn serve(
        _cfg: Config,
        (read, socket): Self::Prepared,
        running: &Running,
    ) -> Result<(), StartError> {
        let gateway = Arc::new(read.gateway);
        running.serve(socket, move |stream, id, req| {
            daemon::handle(stream, id, req, &gateway)
        })
    }

    fn more(command: NoMore) -> ExitCode {
        match command {}
    }
}

fn main() -> ExitCode {
    bxharden::daemon::main::<Gatewayd>()
}
