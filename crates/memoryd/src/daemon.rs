//! What memoryd's table (`main.rs`) is made of: its stores, its outbox and filer, what it says it
//! serves, its sandbox, and the handlers of its two sockets: memory.sock (loopd: `turn_record`, `memory_recall`) and memories.sock (the
//! owner: `memory_recent`, `memory_search`, `memory_forget`, `memory_status`).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use bxcore::layout::{MemoriesRequest, MemoryRequest};
use bxcore::runbook::Anchored;
use bxcore::{
    ChatMessage, Envelope, ErrorCode, Memories, Memory, MemoryForgotten, MemoryRecall,
    MemoryReport, Message, TurnFiled, TurnRecord,
};
use bxharden::daemon::StartError;
use bxharden::{Profile, SeccompProfile, serve};

use crate::config::Config;
use crate::filer::{Filer, ask_state};
use crate::forgotten::Forgotten;
use crate::outbox::Outbox;
use crate::store::{HonchoStore, LocalStore, Store, Stores, within_tokens, words};

/// The most turns one `memory_recent` or `memory_search` may ask for.
pub const MAX_LIST: u32 = 1_000;
/// The most text one answer carries (bytes), so it always fits in a frame.
pub const MAX_ANSWER_BYTES: usize = bxcore::MAX_FRAME / 2;
/// The longest a recall waits for brokerd's state before it asks the local store only.
pub const RECALL_STATE_TIMEOUT: Duration = Duration::from_secs(2);

/// The remote store `[honcho]` names, if any: its client, with its token read now (the sandbox
/// closes the token's file after). Makes nothing and asks nothing of the server.
pub fn read_remote(cfg: &Config) -> Result<Option<HonchoStore>, StartError> {
    cfg.honcho.as_ref().map(open_honcho).transpose()
}

/// The stores: the embedded one, opened (made) in its directory, and the remote one read.
pub fn open_stores(cfg: &Config, remote: Option<HonchoStore>) -> Result<Stores, StartError> {
    let l = &cfg.limits;
    let bounds = crate::store::Bounds {
        max_bytes: l.max_store_bytes,
        max_session_bytes: l.session_bytes(),
        keep_ms: (l.keep_days > 0).then(|| l.keep_days * crate::store::local::DAY_MS),
    };
    let local = LocalStore::open(&cfg.local_dir(), bounds).map_err(|e| StartError::anchored(&e))?;
    Ok(match remote {
        None => Stores::local(Box::new(local)),
        Some(remote) => Stores::with_remote(Box::new(local), Box::new(remote)),
    })
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
    if token.is_some() && base.plain_beyond_loopback() {
        return Err(config(format!(
            "[honcho] url = {:?} is plain http to a host beyond this machine, and a bearer \
             token is set: anyone on the path would read it. Give an https:// URL (or a \
             Honcho on loopback)",
            h.url
        )));
    }
    let options = ::honcho::Options {
        timeout: Duration::from_millis(h.timeout_ms),
        ..::honcho::Options::default()
    };
    let client = ::honcho::Client::new(base, token, options);
    Ok(HonchoStore::new(client, main, quarantine))
}

/// What memoryd serves, for `check` and the start-up notices: its sockets, its stores, its
/// routes. Never the token.
pub fn describe(cfg: &Config, remote: Option<&HonchoStore>) -> Vec<String> {
    let mut lines = vec![format!(
        "turns on {} and the owner's view on {}, asking {} for session state; filing into {}the \
         embedded store in {}; outbox {}",
        cfg.sockets.memory.display(),
        cfg.sockets.memories.display(),
        cfg.sockets.state.display(),
        remote.map_or(String::new(), |r| format!("{} and ", r.describe())),
        cfg.local_dir().display(),
        cfg.outbox_dir().display()
    )];
    for r in &cfg.routes().0 {
        lines.push(format!(
            "route: class {} untrusted {} -> {}",
            r.class.map_or("any".to_string(), |c| c.to_string()),
            r.untrusted.map_or("any".to_string(), |u| u.to_string()),
            r.to
        ));
    }
    let l = &cfg.limits;
    lines.push(format!(
        "embedded store bounds: {} bytes in all, {} a session, turns of at most {} bytes, {}",
        l.max_store_bytes,
        l.session_bytes(),
        l.max_turn_bytes,
        match l.keep_days {
            0 => "every turn kept until forgotten".to_string(),
            n => format!("turns older than {n} days pruned"),
        }
    ));
    lines
}

/// The outbox in its directory, opened (made).
pub fn open_outbox(cfg: &Config) -> Result<Outbox, StartError> {
    Outbox::open(&cfg.outbox_dir(), cfg.limits.max_outbox).map_err(|e| {
        StartError::own(
            crate::outbox::UNWRITABLE_ANCHOR,
            format!(
                "{}: cannot open the outbox: {e}",
                cfg.outbox_dir().display()
            ),
        )
    })
}

/// The list of forgotten sessions in memoryd's directory, read.
pub fn open_forgotten(cfg: &Config) -> Result<Forgotten, StartError> {
    Forgotten::open(&cfg.own_dir()).map_err(|e| StartError::anchored(&e))
}

/// The filer: the outbox, the stores and the routes, shared by both sockets and its thread.
pub fn filer(cfg: &Config, outbox: Outbox, stores: Stores, forgotten: Forgotten) -> Filer {
    Filer {
        outbox,
        stores,
        forgotten,
        routes: cfg.routes(),
        state_socket: cfg.sockets.state.clone(),
        state_timeout: cfg.state_timeout(),
        filing: Mutex::new(()),
        waiting: Mutex::new(None),
    }
}

/// What memoryd may touch: its own directory read-write, the directory of brokerd's state
/// socket (when it exists), its configuration read-only. No network, unless `[honcho]` names a
/// server: then TCP connect to its port alone (and the resolver's files, for a host name).
pub fn profile(cfg: &Config, config: &Path) -> Profile {
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
pub fn handle_memory(
    mut stream: UnixStream,
    id: u64,
    request: MemoryRequest,
    filer: &Filer,
    cfg: &Config,
) {
    match request {
        MemoryRequest::TurnRecord(record) => {
            if let Err(why) = check_record(&record) {
                return refuse(&mut stream, id, ErrorCode::BadMessage, why);
            }
            let record = crate::intake::taken(&record, cfg.limits.max_turn_bytes);
            let filed = Message::TurnFiled(TurnFiled {
                session: record.session.clone(),
                turn: record.turn,
            });
            match filer
                .forgotten
                .unless_forgotten(&record.session, || filer.outbox.put(&record))
            {
                Some(Ok(())) => answer(&mut stream, id, filed),
                Some(Err(e)) => fail(&mut stream, id, &e),
                // Answered as filed, so the sender lets go of it: the owner forgot its session.
                None => {
                    bxharden::log::notice(&format!(
                        "turn {} of session {} filed nowhere: the owner forgot the session",
                        record.turn, record.session
                    ));
                    answer(&mut stream, id, filed)
                }
            }
        }
        MemoryRequest::MemoryRecall(q) => recall(&mut stream, id, filer, cfg, &q),
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
pub fn handle_owner(mut stream: UnixStream, id: u64, request: MemoriesRequest, filer: &Filer) {
    let s = &mut stream;
    match request {
        MemoriesRequest::MemoryRecent(q) => {
            if list(s, id, q.limit, "memory_recent") {
                memories(s, id, filer.stores.recent(q.route, q.limit as usize));
            }
        }
        MemoriesRequest::MemorySearch(q) => {
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
        MemoriesRequest::MemoryForget(q) => match filer.forget(&q.session) {
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
        MemoriesRequest::MemoryStatus => {
            let outbox = filer.outbox.depth() as u64;
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
    }
}
