//! `memoryd serve` and `memoryd check`: the start-up every daemon runs (`bxharden::daemon`), and
//! the two sockets: memory.sock (loopd: `turn_record`, `memory_recall`) and memories.sock (the
//! owner: `memory_recent`, `memory_search`, `memory_forget`, `memory_status`).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bxcore::layout;
use bxcore::runbook::Anchored;
use bxcore::{
    ChatMessage, Envelope, ErrorCode, Memories, Memory, MemoryForgotten, MemoryRecall,
    MemoryReport, Message, TurnFiled, TurnRecord,
};
use bxharden::daemon::{self, Cli, Command, NoMore, Spec, Start, StartError, Usage};
use bxharden::{Daemon, Profile, SeccompProfile, serve};

use crate::config::{CONFIG_ANCHOR, Config};
use crate::filer::{Filer, ask_state};
use crate::outbox::Outbox;
use crate::store::{HonchoStore, LocalStore, Stores, within_tokens, words};

/// memoryd, for the start-up every daemon runs.
pub const SPEC: Spec = Spec {
    daemon: Daemon {
        name: "memoryd",
        version: env!("CARGO_PKG_VERSION"),
    },
    config_anchor: CONFIG_ANCHOR,
};

/// The most turns one `memory_recent` or `memory_search` may ask for.
pub const MAX_LIST: u32 = 1_000;
/// The most text one answer carries (bytes), so it always fits in a frame.
pub const MAX_ANSWER_BYTES: usize = bxcore::MAX_FRAME / 2;
/// The longest a recall waits for brokerd's state before it asks the local store only.
pub const RECALL_STATE_TIMEOUT: Duration = Duration::from_secs(2);

/// The stores the configuration names, opened while the whole filesystem is there (the Honcho
/// token is read now: the sandbox closes its file after).
pub fn open_stores(cfg: &Config) -> Result<Stores, StartError> {
    let local = LocalStore::open(&cfg.local_dir()).map_err(|e| StartError::anchored(&e))?;
    let Some(h) = &cfg.honcho else {
        return Ok(Stores::local(Box::new(local)));
    };
    let remote = open_honcho(h)?;
    Ok(Stores::with_remote(Box::new(local), Box::new(remote)))
}

/// The Honcho store of `[honcho]`: its client, with the token from `key_file` or the systemd
/// credential `honcho_key` when there is one.
fn open_honcho(h: &crate::config::Honcho) -> Result<HonchoStore, StartError> {
    let config = |e: String| StartError::own(::honcho::CONFIG_ANCHOR, e);
    let base = h.base().map_err(|e| config(e.to_string()))?;
    let (main, quarantine) = h.workspaces().map_err(config)?;
    let creds = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    let token = match ::honcho::Token::source(h.key_file.as_deref(), creds.as_deref()) {
        Some(path) => Some(::honcho::Token::read(&path).map_err(|e| StartError::anchored(&e))?),
        None => None,
    };
    let options = ::honcho::Options {
        timeout: Duration::from_millis(h.timeout_ms),
        ..::honcho::Options::default()
    };
    let client = ::honcho::Client::new(base, token, options);
    Ok(HonchoStore::new(client, main, quarantine))
}

/// What memoryd serves, for `check` and the start-up notice.
fn describe(cfg: &Config, stores: &Stores) -> String {
    format!(
        "turns on {}, the owner's view on {}, session state from {}; filing into {}; outbox {}",
        cfg.sockets.memory.display(),
        cfg.sockets.memories.display(),
        cfg.sockets.state.display(),
        stores.describe(),
        cfg.outbox_dir().display()
    )
}

/// `memoryd check --config FILE`: load and check the configuration, print what would be served.
/// It opens nothing: a store is made by `serve`, as memoryd's own user.
pub fn check(config: &Path) -> ExitCode {
    daemon::check(SPEC, config, |cfg: Config| {
        {
            println!("memoryd: configuration ok");
            println!(
                "memoryd: would serve turns on {} and the owner's view on {}, ask {} for session state, file into the embedded store in {}",
                cfg.sockets.memory.display(),
                cfg.sockets.memories.display(),
                cfg.sockets.state.display(),
                cfg.local_dir().display()
            );
            if let (Some(h), Ok((main, quarantine))) = (
                &cfg.honcho,
                cfg.honcho
                    .as_ref()
                    .map_or(Err(String::new()), |h| h.workspaces()),
            ) {
                println!(
                    "memoryd: would file main memory into Honcho at {} (workspace {main}) and \
                     quarantine into its workspace {quarantine}; local turns stay in the embedded store",
                    h.base().map_or_else(|_| h.url.clone(), |b| b.to_string()),
                );
            }
            for r in &cfg.routes().0 {
                println!(
                    "memoryd: route: class {} untrusted {} -> {}",
                    r.class.map_or("any".to_string(), |c| c.to_string()),
                    r.untrusted.map_or("any".to_string(), |u| u.to_string()),
                    r.to
                );
            }
        }
        Ok(())
    })
}

/// `memoryd serve --config FILE`.
pub fn serve(config: &Path) -> ExitCode {
    daemon::run(SPEC, || start(config))
}

fn start(config: &Path) -> Result<std::convert::Infallible, StartError> {
    let mut s = Start::<Config>::load(SPEC, config)?;
    let own = s.cfg().own_dir();
    for dir in [own.clone(), s.cfg().outbox_dir(), s.cfg().local_dir()] {
        s.own_dir(&dir)?;
    }
    let outbox = Outbox::open(&s.cfg().outbox_dir(), s.cfg().limits.max_outbox).map_err(|e| {
        StartError::own(
            crate::outbox::UNWRITABLE_ANCHOR,
            format!(
                "{}: cannot open the outbox: {e}",
                s.cfg().outbox_dir().display()
            ),
        )
    })?;
    let stores = open_stores(s.cfg())?;
    let memory_path = s.cfg().sockets.memory.clone();
    let memory = s.listen(layout::MEMORY, &memory_path)?;
    let memories_path = s.cfg().sockets.memories.clone();
    let memories = s.listen(layout::MEMORIES, &memories_path)?;

    let profile = profile(s.cfg(), config);
    let (cfg, running) = s.sandbox(&profile)?;

    serve::set_timeouts(serve::Timeouts {
        first_frame_ms: cfg.limits.first_frame_ms,
        write_ms: cfg.limits.write_ms,
    });
    let what = describe(&cfg, &stores);
    let filer = Arc::new(Filer {
        outbox,
        stores,
        routes: cfg.routes(),
        state_socket: cfg.sockets.state.clone(),
        state_timeout: cfg.state_timeout(),
        filing: Mutex::new(()),
        waiting: Mutex::new(None),
    });
    let (first, max) = cfg.backoff();
    let f = Arc::clone(&filer);
    std::thread::Builder::new()
        .name("filer".to_owned())
        .spawn(move || f.run(first, max))
        .map_err(|error| StartError::Thread {
            socket: "the filer".to_owned(),
            error,
        })?;
    let cfg = Arc::new(cfg);
    let (f, c) = (Arc::clone(&filer), Arc::clone(&cfg));
    running.serve(memory, move |stream, env| {
        handle_memory(stream, env, &f, &c)
    })?;
    let f = Arc::clone(&filer);
    running.serve(memories, move |stream, env| handle_owner(stream, env, &f))?;
    bxharden::log::notice(&format!("serving {what}"));
    running.ready()
}

/// What memoryd may touch: its own directory read-write, the directory of brokerd's state
/// socket (when it exists), its configuration read-only. No network, unless `[honcho]` names a
/// server: then TCP connect to its port alone (and the resolver's files, for a host name).
fn profile(cfg: &Config, config: &Path) -> Profile {
    let remote = cfg.honcho.as_ref().and_then(|h| h.base().ok());
    let mut p = Profile::new(SeccompProfile::Memoryd {
        remote: remote.is_some(),
    })
    .read_write(cfg.own_dir());
    if let Some(base) = remote {
        p = p.resolver_and_ca().connect_tcp(base.port());
    }
    if let Some(dir) = cfg.sockets.state.parent() {
        if dir.is_dir() {
            p = p.read_write(dir.to_path_buf());
        }
    }
    let config: PathBuf = std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf());
    p.read_only(config)
}

fn answer(stream: &mut UnixStream, id: u64, msg: Message) {
    let _ = serve::send(stream, id, true, msg);
}

fn refuse(stream: &mut UnixStream, id: u64, code: ErrorCode, detail: String) {
    let _ = bxcore::write_frame(stream, &Envelope::error(id, code, detail));
}

/// Log an error that knows its runbook entry, and answer it with its code and pointer.
fn fail(stream: &mut UnixStream, id: u64, e: &dyn Anchored) {
    bxharden::log::fail(e);
    refuse(
        stream,
        id,
        e.code(),
        bxcore::runbook::Pointed(e).to_string(),
    );
}

/// What is wrong with a turn record, if anything: numbered from 1, user text first.
pub fn check_record(r: &TurnRecord) -> Result<(), String> {
    if r.turn == 0 {
        return Err("turn_record.turn is 0: turns are numbered from 1".to_string());
    }
    match r.messages.first() {
        Some(ChatMessage::User { .. }) => Ok(()),
        Some(_) => Err("turn_record.messages does not start with the user's text".to_string()),
        None => Err("turn_record.messages is empty".to_string()),
    }
}

/// memory.sock: one `turn_record` or `memory_recall` from loopd.
pub fn handle_memory(mut stream: UnixStream, env: Envelope, filer: &Filer, cfg: &Config) {
    let id = env.id;
    match env.msg {
        Message::TurnRecord(record) => {
            if let Err(why) = check_record(&record) {
                return refuse(&mut stream, id, ErrorCode::BadMessage, why);
            }
            match filer.outbox.put(&record) {
                Ok(()) => answer(
                    &mut stream,
                    id,
                    Message::TurnFiled(TurnFiled {
                        session: record.session,
                        turn: record.turn,
                    }),
                ),
                Err(e) => fail(&mut stream, id, &e),
            }
        }
        Message::MemoryRecall(q) => recall(&mut stream, id, filer, cfg, &q),
        other => serve::unhandled(&mut stream, id, &other),
    }
}

fn recall(stream: &mut UnixStream, id: u64, filer: &Filer, cfg: &Config, q: &MemoryRecall) {
    let cap = cfg.limits.max_recall_tokens;
    if q.max_tokens == 0 || q.max_tokens > cap {
        return refuse(
            stream,
            id,
            ErrorCode::BadMessage,
            format!(
                "memory_recall.max_tokens = {} is not between 1 and {cap} ([limits] max_recall_tokens)",
                q.max_tokens
            ),
        );
    }
    // Unknown state: asked as a secret session's, of the local store only.
    let state = ask_state(
        &filer.state_socket,
        filer.state_timeout.min(RECALL_STATE_TIMEOUT),
        &q.session,
    )
    .ok();
    match filer
        .stores
        .recall(&q.session, state, &q.query, q.max_tokens)
    {
        Ok(memories) => answer(stream, id, Message::Memories(Memories { memories })),
        Err(e) => fail(stream, id, &e),
    }
}

fn list(stream: &mut UnixStream, id: u64, limit: u32, what: &str) -> bool {
    if limit == 0 || limit > MAX_LIST {
        refuse(
            stream,
            id,
            ErrorCode::BadMessage,
            format!("{what}.limit = {limit} is not between 1 and {MAX_LIST}"),
        );
        return false;
    }
    true
}

fn memories(stream: &mut UnixStream, id: u64, got: Result<Vec<Memory>, crate::store::StoreError>) {
    match got {
        Ok(m) => answer(
            stream,
            id,
            Message::Memories(Memories {
                memories: within_tokens(m, (MAX_ANSWER_BYTES / 4) as u32),
            }),
        ),
        Err(e) => fail(stream, id, &e),
    }
}

/// memories.sock: the owner's view.
pub fn handle_owner(mut stream: UnixStream, env: Envelope, filer: &Filer) {
    let id = env.id;
    let s = &mut stream;
    match env.msg {
        Message::MemoryRecent(q) => {
            if list(s, id, q.limit, "memory_recent") {
                memories(s, id, filer.stores.recent(q.route, q.limit as usize));
            }
        }
        Message::MemorySearch(q) => {
            if words(&q.query, 1).is_empty() {
                return refuse(
                    s,
                    id,
                    ErrorCode::BadMessage,
                    "memory_search.query has no words to search for".to_string(),
                );
            }
            if list(s, id, q.limit, "memory_search") {
                memories(s, id, filer.stores.search(&q.query, q.limit as usize));
            }
        }
        Message::MemoryForget(q) => match filer.forget(&q.session) {
            Ok(done) => {
                bxharden::log::notice(&format!(
                    "the owner forgot session {}: {} turns {}",
                    q.session,
                    done.turns,
                    if done.queued {
                        "hidden, their deletion queued"
                    } else {
                        "deleted"
                    }
                ));
                answer(
                    s,
                    id,
                    Message::MemoryForgotten(MemoryForgotten {
                        session: q.session,
                        turns: done.turns,
                        queued: done.queued,
                    }),
                )
            }
            Err(e) => fail(s, id, &e),
        },
        Message::MemoryStatus {} => {
            let outbox = filer.outbox.depth().unwrap_or(0) as u64;
            let waiting = filer
                .waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            answer(
                s,
                id,
                Message::MemoryReport(MemoryReport {
                    store: filer.stores.describe(),
                    outbox,
                    waiting,
                    remote: filer.stores.probe_remote(),
                }),
            )
        }
        other => serve::unhandled(s, id, &other),
    }
}

/// The command line's words: `serve` or `check`, each with `--config FILE`.
pub const USAGE: Usage = Usage {
    about: "Files each finished turn by its session's class, and recalls the owner's memory",
    serve: "Serve memory.sock and memories.sock, and file the outbox",
    check: "Load and check the configuration, print what would be served",
};

/// The whole program.
pub fn main() -> ExitCode {
    match Cli::<NoMore>::parse(SPEC.daemon, &USAGE) {
        Command::Serve { config } => serve(&config),
        Command::Check { config } => check(&config),
        Command::More(no) => match no {},
    }
}
