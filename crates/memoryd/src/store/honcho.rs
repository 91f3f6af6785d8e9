//! The remote store: a Honcho v3 server (`[honcho]`), spoken to through `crates/honcho`.
//!
//! Where each turn lands, so that no query of main memory can ever return a quarantined turn:
//! main memory is the workspace `[honcho] workspace`, quarantine a workspace of its own
//! (`<workspace>-quarantine` unless named), and each box session is one Honcho session of the
//! same name in the workspace of its route. The owner's text is the peer `owner`, the box's the
//! peer `box`, and every message carries its box session, turn, part, class, untrusted flag and
//! filing time in metadata, so a retried filing is recognised and never filed twice
//! ([`::honcho::Client::add_messages`]). A secret turn, or one routed `local`, is refused here as
//! well as by [`super::Stores`]: no secret text is ever sent.
//!
//! `forget` deletes the box session's Honcho sessions through the API. Honcho marks them
//! inactive at once and removes their messages later from its queue; until then its search still
//! returns them, so every answer here keeps only messages of sessions Honcho lists as active, and
//! a forgotten session takes no more turns (Honcho refuses to make it again).
//!
//! Honcho's full-text search looks for all of a query's words at once, which a question seldom
//! matches; recall and search ask for each of the query's telling words apart and rank a turn by
//! how many of them found it and how high (reciprocal rank fusion).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ::honcho::{Client, Id, MessageKey, NewMessage, PeerConfig};
use bxcore::{ChatMessage, DataClass, Memory, MemoryRoute, SessionId, Timestamp};
use serde_json::{Map, Value, json};

use super::{Filing, Forgotten, Store, StoreError, words};

/// What this store is called in errors.
const NAME: &str = "Honcho";

/// The peers: the owner's text and the box's.
const OWNER: &str = "owner";
const BOX: &str = "box";

/// The words of a query asked for, at most.
const QUERY_WORDS: usize = 5;
/// Messages asked for per word.
const HITS_PER_WORD: u8 = 20;
/// Turns a recall brings, at most.
const RECALL_TURNS: usize = 8;
/// The whole of one recall or search, however many requests it takes: past it, what was found
/// so far is not worth waiting for.
const ANSWER_BUDGET: Duration = Duration::from_secs(5);
/// Sessions remembered as made in this run (beyond it the memory starts again: making a
/// session twice is harmless).
const MAX_MADE: usize = 4096;

/// Words too common to tell one turn from another.
const STOPWORDS: &[&str] = &[
    "the", "and", "for", "are", "but", "not", "you", "your", "all", "any", "can", "had", "her",
    "was", "one", "our", "out", "has", "him", "his", "how", "its", "may", "who", "did", "get",
    "she", "too", "use", "what", "when", "where", "which", "with", "this", "that", "there",
    "their", "them", "then", "they", "from", "have", "will", "would", "could", "should", "about",
    "into", "than", "some", "does", "just", "been", "were", "also", "more", "very", "tell",
];

/// The Honcho store.
pub struct HonchoStore {
    client: Client,
    main: Id,
    quarantine: Id,
    /// `(workspace, session)` made in this run.
    made: Mutex<HashSet<(Id, Id)>>,
}

impl std::fmt::Debug for HonchoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HonchoStore")
            .field("client", &self.client)
            .field("main", &self.main)
            .field("quarantine", &self.quarantine)
            .finish_non_exhaustive()
    }
}

impl HonchoStore {
    /// The store on `client`, main memory in the workspace `main`, quarantine in `quarantine`
    /// (two different workspaces; the configuration checks it). Nothing is asked of the server
    /// yet: an outage at start is an outage of filing, not a refusal to start.
    pub fn new(client: Client, main: Id, quarantine: Id) -> HonchoStore {
        HonchoStore {
            client,
            main,
            quarantine,
            made: Mutex::new(HashSet::new()),
        }
    }

    fn workspace(&self, route: MemoryRoute) -> Option<&Id> {
        match route {
            MemoryRoute::Main => Some(&self.main),
            MemoryRoute::Quarantine => Some(&self.quarantine),
            MemoryRoute::Local => None,
        }
    }

    /// The session `session` in `workspace`, made (with the workspace) unless made in this run.
    fn session(
        &self,
        workspace: &Id,
        route: MemoryRoute,
        session: &SessionId,
    ) -> Result<::honcho::Session, ::honcho::Error> {
        let id = Id::from(session);
        let quiet = PeerConfig {
            observe_me: false,
            observe_others: false,
        };
        let key = (workspace.clone(), id.clone());
        let first = !self
            .made
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&key);
        if first {
            self.client.workspace(workspace, Map::new())?;
        }
        let metadata = meta(json!({ "box_session": session.as_str(), "route": route.name() }));
        let s = self.client.create_session(
            workspace,
            &id,
            metadata,
            &[(peer(OWNER), quiet), (peer(BOX), quiet)],
        )?;
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if made.len() >= MAX_MADE {
            made.clear();
        }
        made.insert(key);
        Ok(s)
    }

    /// The messages of one turn's record, with their keys and metadata.
    fn messages(filing: &Filing<'_>) -> Vec<NewMessage> {
        let r = filing.record;
        let mut out = Vec::new();
        let mut part = 0u32;
        for (i, m) in r.messages.iter().enumerate() {
            let (role, who, text) = match m {
                ChatMessage::User { text } => ("user", OWNER, text),
                ChatMessage::Assistant { text, .. } => ("assistant", BOX, text),
                _ => continue,
            };
            if text.is_empty() {
                continue;
            }
            for piece in ::honcho::split_content(text) {
                out.push(NewMessage {
                    peer: peer(who),
                    content: piece,
                    key: MessageKey { turn: r.turn, part },
                    metadata: meta(json!({
                        "box_session": r.session.as_str(),
                        "msg": i,
                        "role": role,
                        "route": filing.route.name(),
                        "class": filing.state.class.as_str(),
                        "untrusted": filing.state.untrusted,
                        "filed": filing.received.unix_millis(),
                    })),
                });
                part += 1;
            }
        }
        out
    }

    /// The turns `(session, turn)` of `workspace`, whole, in the order given, only of sessions
    /// Honcho still lists as active (a forgotten session's messages linger until Honcho's queue
    /// removes them).
    fn turns(
        &self,
        workspace: &Id,
        route: MemoryRoute,
        keys: &[(String, u64)],
        until: Instant,
    ) -> Result<Vec<Memory>, ::honcho::Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut by_session: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (s, t) in keys {
            by_session.entry(s.as_str()).or_default().push(*t);
        }
        let names: Vec<&str> = by_session.keys().copied().collect();
        let active: HashSet<String> = self
            .client
            .sessions(workspace, Some(json!({ "id": { "in": names } })))?
            .into_iter()
            .map(|s| s.id().to_string())
            .collect();
        let mut found: HashMap<(String, u64), Memory> = HashMap::new();
        for (session, turns) in by_session {
            if !active.contains(session) {
                continue;
            }
            if Instant::now() >= until {
                return Err(budget_spent(workspace));
            }
            let Ok(id) = Id::new(session) else { continue };
            let messages = self.client.messages_of(
                workspace,
                &id,
                Some(json!({ "metadata": { (::honcho::TURN_KEY): { "in": turns } } })),
            )?;
            for m in assemble(messages, route) {
                found.insert((m.session.as_str().to_string(), m.turn), m);
            }
        }
        Ok(keys.iter().filter_map(|k| found.remove(k)).collect())
    }

    /// The turns of `workspace` that match `query`'s telling words, best first, at most `limit`.
    fn find(
        &self,
        workspace: &Id,
        route: MemoryRoute,
        query: &str,
        limit: usize,
        until: Instant,
    ) -> Result<Vec<(f64, Memory)>, ::honcho::Error> {
        let words = telling_words(query);
        let mut score: HashMap<(String, u64), f64> = HashMap::new();
        for w in &words {
            if Instant::now() >= until {
                return Err(budget_spent(workspace));
            }
            let hits = self.client.search(workspace, w, HITS_PER_WORD, None)?;
            let mut seen = HashSet::new();
            for (rank, m) in hits.iter().enumerate() {
                let Some(key) = turn_key(m) else { continue };
                if seen.insert(key.clone()) {
                    *score.entry(key).or_default() += 1.0 / (60.0 + rank as f64);
                }
            }
        }
        let mut ranked: Vec<((String, u64), f64)> = score.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        ranked.truncate(limit);
        let keys: Vec<(String, u64)> = ranked.iter().map(|(k, _)| k.clone()).collect();
        let scores: HashMap<(String, u64), f64> = ranked.into_iter().collect();
        Ok(self
            .turns(workspace, route, &keys, until)?
            .into_iter()
            .map(|m| {
                let s = scores[&(m.session.as_str().to_string(), m.turn)];
                (s, m)
            })
            .collect())
    }

    /// The latest turns of `workspace`, newest first, at most `limit` (Honcho answers at most
    /// 100 messages to one search, so at most that many turns).
    fn latest(
        &self,
        workspace: &Id,
        route: MemoryRoute,
        limit: usize,
        until: Instant,
    ) -> Result<Vec<Memory>, ::honcho::Error> {
        // An empty query matches every message, newest first.
        let hits = self.client.search(workspace, "", 100, None)?;
        let mut keys: Vec<(String, u64)> = Vec::new();
        for m in &hits {
            if let Some(k) = turn_key(m) {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        keys.truncate(limit);
        let mut out = self.turns(workspace, route, &keys, until)?;
        out.sort_by(|a, b| b.filed.cmp(&a.filed).then(b.turn.cmp(&a.turn)));
        Ok(out)
    }
}

impl Store for HonchoStore {
    fn probe(&self) -> Result<String, StoreError> {
        self.client.health()?;
        Ok(format!("Honcho at {}", self.client.base()))
    }

    fn describe(&self) -> String {
        format!(
            "Honcho at {} (main memory in the workspace {}, quarantine in {})",
            self.client.base(),
            self.main,
            self.quarantine
        )
    }

    fn file(&self, filing: &Filing<'_>) -> Result<(), StoreError> {
        let r = filing.record;
        // Held here as well as in Stores: nothing secret, nothing routed local, leaves.
        let workspace = match (filing.state.class, self.workspace(filing.route)) {
            (DataClass::Secret, _) | (_, None) => {
                return Err(StoreError::Failed {
                    store: NAME,
                    why: format!(
                        "turn {} of {} is {} and routed {}: it is kept on the device, never sent \
                         to Honcho",
                        r.turn,
                        r.session.as_str(),
                        filing.state.class.as_str(),
                        filing.route
                    ),
                });
            }
            (_, Some(w)) => w,
        };
        let messages = Self::messages(filing);
        if messages.is_empty() {
            return Ok(());
        }
        let session = match self.session(workspace, filing.route, &r.session) {
            Ok(s) => s,
            Err(::honcho::Error::NotFound { .. }) => {
                // The owner forgot this session: Honcho takes no more turns into it, and none
                // is kept elsewhere against the owner's word.
                bxharden::log::notice(&format!(
                    "turn {} of {} is not filed: the session was forgotten, and Honcho takes no \
                     more turns into it",
                    r.turn,
                    r.session.as_str()
                ));
                return Ok(());
            }
            Err(e) => return Err(store_error(e)),
        };
        self.client
            .add_messages(&session, &messages)
            .map(drop)
            .map_err(store_error)
    }

    fn recall(&self, query: &str, _max_tokens: u32) -> Result<Vec<Memory>, StoreError> {
        let until = Instant::now() + ANSWER_BUDGET;
        let found = self
            .find(&self.main, MemoryRoute::Main, query, RECALL_TURNS, until)
            .map_err(store_error)?;
        Ok(found.into_iter().map(|(_, m)| m).collect())
    }

    fn recent(&self, route: Option<MemoryRoute>, limit: usize) -> Result<Vec<Memory>, StoreError> {
        let until = Instant::now() + ANSWER_BUDGET;
        let routes: Vec<MemoryRoute> = match route {
            Some(r) => vec![r],
            None => vec![MemoryRoute::Main, MemoryRoute::Quarantine],
        };
        let mut out = Vec::new();
        for r in routes {
            if let Some(w) = self.workspace(r) {
                out.extend(self.latest(w, r, limit, until).map_err(store_error)?);
            }
        }
        out.sort_by(|a, b| b.filed.cmp(&a.filed).then(b.turn.cmp(&a.turn)));
        out.truncate(limit);
        Ok(out)
    }

    fn search(&self, query: &str, limit: usize) -> Result<Vec<Memory>, StoreError> {
        let until = Instant::now() + ANSWER_BUDGET;
        let mut all = Vec::new();
        for r in [MemoryRoute::Main, MemoryRoute::Quarantine] {
            if let Some(w) = self.workspace(r) {
                all.extend(self.find(w, r, query, limit, until).map_err(store_error)?);
            }
        }
        all.sort_by(|a, b| b.0.total_cmp(&a.0));
        all.truncate(limit);
        Ok(all.into_iter().map(|(_, m)| m).collect())
    }

    fn forget(&self, session: &SessionId) -> Result<Forgotten, StoreError> {
        let id = Id::from(session);
        let mut done = Forgotten::default();
        for w in [&self.main, &self.quarantine] {
            let active = self
                .client
                .sessions(w, Some(json!({ "id": { "in": [id.as_str()] } })))
                .map_err(store_error)?;
            if active.is_empty() {
                continue;
            }
            let turns: HashSet<u64> = self
                .client
                .messages_of(w, &id, None)
                .map_err(store_error)?
                .iter()
                .filter_map(|m| m.key().map(|k| k.turn))
                .collect();
            if self.client.delete_session(w, &id).map_err(store_error)?
                == ::honcho::Deletion::Queued
            {
                done.queued = true;
                done.turns += turns.len() as u64;
            }
            self.made
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(w.clone(), id.clone()));
        }
        Ok(done)
    }
}

/// A store error for a client error: an outage is `Unavailable` (the turn waits and is retried),
/// the rest `Failed`; either keeps the client's words.
fn store_error(e: ::honcho::Error) -> StoreError {
    StoreError::Honcho(e)
}

fn budget_spent(workspace: &Id) -> ::honcho::Error {
    ::honcho::Error::Timeout {
        url: format!("the workspace {workspace}"),
        after: ANSWER_BUDGET,
    }
}

fn peer(name: &str) -> Id {
    Id::new(name).expect("a constant peer name is valid")
}

fn meta(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The `(box session, turn)` a message belongs to, when it is one this store filed.
fn turn_key(m: &::honcho::Message) -> Option<(String, u64)> {
    let s = m.metadata.get("box_session")?.as_str()?;
    Some((s.to_string(), m.key()?.turn))
}

/// The words of `query` worth asking for: at least three characters, not a common word, the
/// longest first, at most [`QUERY_WORDS`].
fn telling_words(query: &str) -> Vec<String> {
    let mut w: Vec<String> = words(query, 64)
        .into_iter()
        .filter(|w| w.chars().count() >= 3 && !STOPWORDS.contains(&w.as_str()))
        .collect();
    w.sort_by_key(|w| std::cmp::Reverse(w.chars().count()));
    w.truncate(QUERY_WORDS);
    w
}

/// Messages of one or more turns put back together as the turns' memories: each turn's
/// messages in order (parts of one message joined), `user: …` and `assistant: …` lines, as the
/// local store keeps a turn's text. Messages this store did not file are left out.
fn assemble(messages: Vec<::honcho::Message>, route: MemoryRoute) -> Vec<Memory> {
    struct Piece {
        part: u32,
        msg: u64,
        role: String,
        text: String,
    }
    struct Turn {
        session: SessionId,
        class: DataClass,
        untrusted: bool,
        filed: u64,
        pieces: Vec<Piece>,
    }
    let mut turns: BTreeMap<(String, u64), Turn> = BTreeMap::new();
    for m in messages {
        let (Some(key), Some(session)) = (m.key(), m.metadata.get("box_session")) else {
            continue;
        };
        let Some(session) = session.as_str().and_then(|s| SessionId::new(s).ok()) else {
            continue;
        };
        let md = &m.metadata;
        let class = md
            .get("class")
            .and_then(|c| serde_json::from_value::<DataClass>(c.clone()).ok());
        let Some(class) = class else { continue };
        let entry = turns
            .entry((session.as_str().to_string(), key.turn))
            .or_insert_with(|| Turn {
                session,
                class,
                untrusted: md.get("untrusted").and_then(Value::as_bool).unwrap_or(true),
                filed: md.get("filed").and_then(Value::as_u64).unwrap_or(0),
                pieces: Vec::new(),
            });
        entry.pieces.push(Piece {
            part: key.part,
            msg: md.get("msg").and_then(Value::as_u64).unwrap_or(0),
            role: md
                .get("role")
                .and_then(Value::as_str)
                .unwrap_or("user")
                .to_string(),
            text: m.content,
        });
    }
    turns
        .into_iter()
        .map(|((_, turn), mut t)| {
            t.pieces.sort_by_key(|p| p.part);
            let mut text = String::new();
            let mut last_msg = None;
            for p in &t.pieces {
                if last_msg != Some(p.msg) {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    let role = if p.role == "assistant" {
                        "assistant"
                    } else {
                        "user"
                    };
                    text.push_str(role);
                    text.push_str(": ");
                    last_msg = Some(p.msg);
                }
                text.push_str(&p.text);
            }
            Memory {
                session: t.session,
                turn,
                route,
                class: t.class,
                untrusted: t.untrusted,
                filed: Timestamp(t.filed),
                text,
            }
        })
        .collect()
}
