//! inferproxy, as its table: `inferproxy serve --config FILE` and `inferproxy check --config
//! FILE`.

use std::process::ExitCode;
use std::sync::Arc;

use bxcore::layout::InferRequests;
use bxharden::daemon::{NoMore, Running, Spec, Start, StartError, Table, Usage};
use bxharden::serve::Socket;
use bxharden::{Daemon, Profile};
use inferproxy::config::{CONFIG_ANCHOR, Config};
use inferproxy::daemon;
use inferproxy::provider::Inference;

struct Inferproxy;

impl Table for Inferproxy {
    const SPEC: Spec = Spec {
        daemon: Daemon {
            name: "inferproxy",
            version: env!("CARGO_PKG_VERSION"),
        },
        config_anchor: CONFIG_ANCHOR,
    };
    const USAGE: Usage = Usage {
        about: "The model's only door: the one holder of model API keys",
        serve: "Serve infer.sock",
        check: "Load and check the configuration and the files it names, print what would be served",
    };
    type Config = Config;
    /// The provider: its key, its CA bundle or its script, read.
    type Read = Inference;
    type Prepared = (Inference, Socket<InferRequests>);
    type More = NoMore;

    fn read(cfg: &Config) -> Result<Inference, StartError> {
        daemon::inference(cfg)
    }

    fn serves(cfg: &Config, inference: &Inference) -> Vec<String> {
        vec![daemon::describe(cfg, inference)]
    }

    fn prepare(s: &mut Start<Config>, inference: Inference) -> Result<Self::Prepared, StartError> {
        s.own_dir(&s.cfg().own_dir())?;
        let socket = s.listen(&s.cfg().infer_socket())?;
        Ok((inference, socket))
    }

    fn profile(s: &Start<Config>, (inference, _): &Self::Prepared) -> Profile {
        daemon::profile(s.cfg(), inference, s.path())
    }

    fn serve(
        _cfg: Config,
        (inference, socket): Self::Prepared,
        running: &Running,
    ) -> Result<(), StartError> {
        let inference = Arc::new(inference);
        running.serve(socket, move |stream, id, req| {
            daemon::handle(stream, id, req, &inference)
        })
    }

    fn more(command: NoMore) -> ExitCode {
        match command {}
    }
}

fn main() -> ExitCode {
    bxharden::daemon::main::<Inferproxy>()
}
