//! memoryd, as its table: `memoryd serve --config FILE` and `memoryd check --config FILE`.

use std::process::ExitCode;
use std::sync::Arc;

use bxcore::layout::{MemoriesRequest, MemoryRequest};
use bxharden::daemon::{NoMore, Running, Spec, Start, StartError, Table, Usage};
use bxharden::serve::Socket;
use bxharden::{Daemon, Profile};
use memoryd::config::{CONFIG_ANCHOR, Config};
use memoryd::daemon;
use memoryd::filer::Filer;
use memoryd::store::HonchoStore;

struct Memoryd;

/// What `serve` opens: the filer (outbox and stores) and the two sockets.
struct Prepared {
    filer: Filer,
    memory: Socket<MemoryRequest>,
    memories: Socket<MemoriesRequest>,
}

impl Table for Memoryd {
    const SPEC: Spec = Spec {
        daemon: Daemon {
            name: "memoryd",
            version: env!("CARGO_PKG_VERSION"),
        },
        config_anchor: CONFIG_ANCHOR,
    };
    const USAGE: Usage = Usage {
        about: "Files each finished turn by its session's class, and recalls the owner's memory",
        serve: "Serve memory.sock and memories.sock, and file the outbox",
        check: "Load and check the configuration, print what would be served",
    };
    type Config = Config;
    /// The remote store, its token read (the embedded store is made by `serve`, as memoryd's
    /// own user).
    type Read = Option<HonchoStore>;
    type Prepared = Prepared;
    type More = NoMore;

    fn read(cfg: &Config) -> Result<Option<HonchoStore>, StartError> {
        daemon::read_remote(cfg)
    }

    fn serves(cfg: &Config, remote: &Option<HonchoStore>) -> Vec<String> {
        daemon::describe(cfg, remote.as_ref())
    }

    fn prepare(s: &mut Start<Config>, remote: Option<HonchoStore>) -> Result<Prepared, StartError> {
        for dir in [s.cfg().own_dir(), s.cfg().outbox_dir(), s.cfg().local_dir()] {
            s.own_dir(&dir)?;
        }
        let outbox = daemon::open_outbox(s.cfg())?;
        let stores = daemon::open_stores(s.cfg(), remote)?;
        let forgotten = daemon::open_forgotten(s.cfg())?;
        let filer = daemon::filer(s.cfg(), outbox, stores, forgotten);
        let memory = s.listen(&s.cfg().sockets.memory.clone())?;
        let memories = s.listen(&s.cfg().sockets.memories.clone())?;
        Ok(Prepared {
            filer,
            memory,
            memories,
        })
    }

    fn profile(s: &Start<Config>, _: &Prepared) -> Profile {
        daemon::profile(s.cfg(), s.path())
    }

    fn serve(cfg: Config, p: Prepared, running: &Running) -> Result<(), StartError> {
        let filer = Arc::new(p.filer);
        let (first, max) = cfg.backoff();
        let f = Arc::clone(&filer);
        running.thread("filer", move || f.run(first, max))?;
        let cfg = Arc::new(cfg);
        let (f, c) = (Arc::clone(&filer), Arc::clone(&cfg));
        running.serve(p.memory, move |stream, id, req| {
            daemon::handle_memory(stream, id, req, &f, &c)
        })?;
        running.serve(p.memories, move |stream, id, req| {
            daemon::handle_owner(stream, id, req, &filer)
        })
    }

    fn more(command: NoMore) -> ExitCode {
        match command {}
    }
}

fn main() -> ExitCode {
    bxharden::daemon::main::<Memoryd>()
}

/// The C library's `log`, for SQLite: FTS5's ranking (`bm25`) is memoryd's only caller of the
/// math library, and loading libm for it kept about 300 kB of libm resident in every memoryd
/// (its start-up resolves its own functions for the CPU). Defined here, from the `libm` crate
/// (rust-lang's port of musl's), the linker needs no libm at all (docs/performance.md).
#[unsafe(no_mangle)]
pub extern "C" fn log(x: f64) -> f64 {
    libm::log(x)
}

#[cfg(test)]
mod tests {
    use super::log;

    #[test]
    fn log_agrees_with_the_standard_natural_logarithm_to_the_last_bit_or_one() {
        for x in [
            1e-300,
            1e-9,
            0.5,
            1.0,
            2.0,
            std::f64::consts::E,
            10.0,
            12_345.678,
            1e300,
        ] {
            let (ours, std) = (log(x), x.ln());
            assert!(
                (ours - std).abs() <= std.abs() * f64::EPSILON,
                "log({x}) = {ours}, std says {std}"
            );
        }
    }

    #[test]
    fn log_of_zero_is_minus_infinity_and_of_a_negative_number_not_a_number() {
        assert_eq!(log(0.0), f64::NEG_INFINITY);
        assert!(log(-1.0).is_nan());
        assert_eq!(log(1.0), 0.0);
    }
}
