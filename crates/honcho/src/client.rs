//! The calls: one blocking HTTP request each (a listing: one per page, with a bound on the
//! pages), with the token when there is one, under one deadline, and its answer read up to a
//! byte limit. No proxy from the environment and no redirects: the client talks to the base
//! URL's host and port and nowhere else, which is what memoryd's sandbox allows.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use ureq::http::HeaderValue;

use crate::base_url::BaseUrl;
use crate::error::Error;
use crate::id::Id;
use crate::token::Token;
use crate::types::{
    Appended, Context, Deletion, Message, MessageKey, NewMessage, Page, PeerConfig, Session,
    SessionReply, Workspace,
};
use crate::{MAX_BATCH, MAX_CONTENT_CHARS, TURN_KEY};

/// Messages asked for per page of a listing. At most [`MAX_CONTENT_CHARS`] characters each, a
/// page stays well under the default response limit however its text is escaped.
const PAGE_SIZE: usize = 50;

/// The most characters of a server's error detail kept for the error's text.
const MAX_DETAIL: usize = 300;

/// The bounds of every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The whole request, from connect to the last byte of the answer.
    pub timeout: Duration,
    /// The most bytes of an answer read; a longer one is an error.
    pub max_response: u64,
    /// The most messages a listing reads before it gives up.
    pub max_listed: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            timeout: Duration::from_secs(10),
            max_response: 16 * 1024 * 1024,
            max_listed: 10_000,
        }
    }
}

/// A Honcho v3 server.
pub struct Client {
    base: BaseUrl,
    token: Option<Token>,
    options: Options,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base.to_string())
            .field("token", &self.token)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A request's method.
#[derive(Debug, Clone, Copy)]
enum Method {
    Get,
    Post,
    Delete,
}

impl Client {
    /// A client for the server at `base`, asking with `token` when given.
    pub fn new(base: BaseUrl, token: Option<Token>, options: Options) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .max_redirects(0)
            .https_only(base.tls())
            .timeout_global(Some(options.timeout))
            .user_agent(concat!("boxmaker-honcho/", env!("CARGO_PKG_VERSION")))
            .max_response_header_size(64 * 1024)
            .build()
            .new_agent();
        Client {
            base,
            token,
            options,
            agent,
        }
    }

    /// The server's base URL.
    pub fn base(&self) -> &BaseUrl {
        &self.base
    }

    /// `GET /health`: whether the server answers at all (no token needed).
    pub fn health(&self) -> Result<(), Error> {
        let url = self.base.unversioned("/health");
        self.request::<Value>(Method::Get, url, None, "the health check")
            .map(drop)
    }

    /// The workspace `id`, made if it does not exist (its metadata set when made).
    pub fn workspace(&self, id: &Id, metadata: Map<String, Value>) -> Result<Workspace, Error> {
        let body = json!({ "id": id, "metadata": metadata });
        self.v3(
            Method::Post,
            "/workspaces".into(),
            Some(body),
            &format!("making the workspace {id}"),
        )
    }

    /// The peer `id` in `workspace`, made if it does not exist.
    pub fn peer(&self, workspace: &Id, id: &Id, observe_me: bool) -> Result<(), Error> {
        let body =
            json!({ "id": id, "metadata": {}, "configuration": { "observe_me": observe_me } });
        self.v3::<Value>(
            Method::Post,
            format!("/workspaces/{workspace}/peers"),
            Some(body),
            &format!("making the peer {id} in {workspace}"),
        )
        .map(drop)
    }

    /// Make the session `id` in `workspace` with `metadata` and `peers`, or take it as it is
    /// when it exists (its metadata is then replaced by `metadata`). A session that was
    /// deleted is [`Error::NotFound`]: it is never brought back by a write.
    pub fn create_session(
        &self,
        workspace: &Id,
        id: &Id,
        metadata: Map<String, Value>,
        peers: &[(Id, PeerConfig)],
    ) -> Result<Session, Error> {
        let peers: Map<String, Value> = peers
            .iter()
            .map(|(p, c)| (p.to_string(), json!(c)))
            .collect();
        let body = json!({
            "id": id,
            "metadata": metadata,
            "peers": peers,
            // No summaries or reasoning over the box's turns: Honcho keeps what it is given.
            "configuration": { "reasoning": { "enabled": false }, "summary": { "enabled": false } },
        });
        let r: SessionReply = self.v3(
            Method::Post,
            format!("/workspaces/{workspace}/sessions"),
            Some(body),
            &format!("making the session {id} in {workspace}"),
        )?;
        if r.id != *id || r.workspace_id != *workspace || !r.is_active {
            return Err(Error::Malformed {
                what: format!("making the session {id} in {workspace}"),
                why: format!(
                    "it answered the session {} in {} (active: {})",
                    r.id, r.workspace_id, r.is_active
                ),
            });
        }
        Ok(Session {
            workspace: r.workspace_id,
            id: r.id,
            metadata: r.metadata,
        })
    }

    /// The active sessions of `workspace` that match `filters` (Honcho's filter language, e.g.
    /// `{"metadata": {"route": "main"}}`), at most `Options::max_listed`.
    pub fn sessions(&self, workspace: &Id, filters: Option<Value>) -> Result<Vec<Session>, Error> {
        let replies: Vec<SessionReply> = self.list(
            &format!("/workspaces/{workspace}/sessions/list"),
            filters,
            &format!("listing the sessions of {workspace}"),
        )?;
        Ok(replies
            .into_iter()
            .filter(|r| r.is_active)
            .map(|r| Session {
                workspace: r.workspace_id,
                id: r.id,
                metadata: r.metadata,
            })
            .collect())
    }

    /// Add `batch` to `session`, idempotently: messages whose key (turn and part) the session
    /// holds already are not added again, so a batch retried after a failure that left it
    /// filed, half filed or not filed at all ends filed exactly once. The rest is sent in order,
    /// [`MAX_BATCH`] at a time.
    ///
    /// The check and the write are two requests: this holds for one writer per session, which
    /// memoryd is (it files a session's turns one batch at a time).
    pub fn add_messages(&self, session: &Session, batch: &[NewMessage]) -> Result<Appended, Error> {
        if batch.is_empty() {
            return Ok(Appended::default());
        }
        let what = format!(
            "adding {} message(s) to the session {} in {}",
            batch.len(),
            session.id,
            session.workspace
        );
        let mut keys = HashSet::new();
        for m in batch {
            let n = m.content.chars().count();
            if n > MAX_CONTENT_CHARS {
                return Err(Error::Invalid {
                    what: format!("turn {} part {}", m.key.turn, m.key.part),
                    why: format!(
                        "{n} characters, over Honcho's {MAX_CONTENT_CHARS} (split it with split_content)"
                    ),
                });
            }
            if !keys.insert(m.key) {
                return Err(Error::Invalid {
                    what: what.clone(),
                    why: format!(
                        "turn {} part {} is in the batch twice",
                        m.key.turn, m.key.part
                    ),
                });
            }
        }
        let turns: BTreeSet<u64> = batch.iter().map(|m| m.key.turn).collect();
        let filters = json!({ "metadata": { TURN_KEY: { "in": turns } } });
        let present: HashSet<MessageKey> = self
            .messages(session, Some(filters))?
            .iter()
            .filter_map(Message::key)
            .collect();
        let missing: Vec<&NewMessage> =
            batch.iter().filter(|m| !present.contains(&m.key)).collect();
        let mut out = Appended {
            added: 0,
            present: batch.len() - missing.len(),
        };
        for chunk in missing.chunks(MAX_BATCH) {
            let body = json!({ "messages": chunk.iter().map(|m| m.wire()).collect::<Vec<_>>() });
            let filed: Vec<Message> = self.v3(
                Method::Post,
                format!(
                    "/workspaces/{}/sessions/{}/messages",
                    session.workspace, session.id
                ),
                Some(body),
                &what,
            )?;
            if filed.len() != chunk.len() {
                return Err(Error::Malformed {
                    what,
                    why: format!(
                        "it answered {} message(s) for {} sent",
                        filed.len(),
                        chunk.len()
                    ),
                });
            }
            out.added += filed.len();
        }
        Ok(out)
    }

    /// The messages of `session` that match `filters`, oldest first, at most
    /// `Options::max_listed`.
    pub fn messages(
        &self,
        session: &Session,
        filters: Option<Value>,
    ) -> Result<Vec<Message>, Error> {
        self.messages_of(&session.workspace, &session.id, filters)
    }

    /// [`Client::messages`] by name, for a session this process did not create (reading back
    /// what another filed; Honcho answers an empty list for a session it does not have).
    pub fn messages_of(
        &self,
        workspace: &Id,
        session: &Id,
        filters: Option<Value>,
    ) -> Result<Vec<Message>, Error> {
        self.list(
            &format!("/workspaces/{workspace}/sessions/{session}/messages/list"),
            filters,
            &format!("listing the messages of the session {session} in {workspace}"),
        )
    }

    /// The newest messages of a session that fit `tokens`, oldest first (no summary).
    pub fn context(&self, workspace: &Id, session: &Id, tokens: u32) -> Result<Context, Error> {
        self.v3(
            Method::Get,
            format!(
                "/workspaces/{workspace}/sessions/{session}/context?tokens={tokens}&summary=false"
            ),
            None,
            &format!("the context of the session {session} in {workspace}"),
        )
    }

    /// Messages of `workspace` that match `query` (and `filters`), at most `limit` (1 to 100).
    pub fn search(
        &self,
        workspace: &Id,
        query: &str,
        limit: u8,
        filters: Option<Value>,
    ) -> Result<Vec<Message>, Error> {
        self.v3(
            Method::Post,
            format!("/workspaces/{workspace}/search"),
            Some(search_body(query, limit, filters)),
            &format!("searching {workspace}"),
        )
    }

    /// Messages of one session that match `query`, at most `limit` (1 to 100).
    pub fn search_session(
        &self,
        workspace: &Id,
        session: &Id,
        query: &str,
        limit: u8,
    ) -> Result<Vec<Message>, Error> {
        self.v3(
            Method::Post,
            format!("/workspaces/{workspace}/sessions/{session}/search"),
            Some(search_body(query, limit, None)),
            &format!("searching the session {session} in {workspace}"),
        )
    }

    /// Delete a session and its messages. Honcho marks it inactive at once (no more writes,
    /// gone from session listings) and removes its messages later from its queue: until then
    /// its search and context still return them, so the caller hides the session itself.
    pub fn delete_session(&self, workspace: &Id, session: &Id) -> Result<Deletion, Error> {
        let what = format!("deleting the session {session} in {workspace}");
        match self.v3::<Value>(
            Method::Delete,
            format!("/workspaces/{workspace}/sessions/{session}"),
            None,
            &what,
        ) {
            Ok(_) => Ok(Deletion::Queued),
            Err(Error::NotFound { .. }) => Ok(Deletion::AlreadyGone),
            Err(e) => Err(e),
        }
    }

    /// Every page of a listing, up to `Options::max_listed` items.
    fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        filters: Option<Value>,
        what: &str,
    ) -> Result<Vec<T>, Error> {
        let body = match filters {
            Some(f) => json!({ "filters": f }),
            None => json!({}),
        };
        let mut out = Vec::new();
        for page in 1.. {
            let p: Page<T> = self.v3(
                Method::Post,
                format!("{path}?page={page}&size={PAGE_SIZE}"),
                Some(body.clone()),
                what,
            )?;
            let last = p.items.len() < PAGE_SIZE || page >= p.pages;
            out.extend(p.items);
            if out.len() > self.options.max_listed {
                return Err(Error::Malformed {
                    what: what.to_string(),
                    why: format!("more than {} items", self.options.max_listed),
                });
            }
            if last {
                break;
            }
        }
        Ok(out)
    }

    fn v3<T: DeserializeOwned>(
        &self,
        method: Method,
        path: String,
        body: Option<Value>,
        what: &str,
    ) -> Result<T, Error> {
        self.request(method, self.base.v3(&path), body, what)
    }

    /// One request and its answer, parsed.
    fn request<T: DeserializeOwned>(
        &self,
        method: Method,
        url: String,
        body: Option<Value>,
        what: &str,
    ) -> Result<T, Error> {
        let auth = match &self.token {
            Some(t) => {
                let mut v =
                    HeaderValue::from_str(&t.header_value()).map_err(|_| Error::Invalid {
                        what: "the token".into(),
                        why: "it cannot be a header value".into(),
                    })?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        let sent = match (method, body) {
            (Method::Get | Method::Delete, _) => {
                let mut rb = match method {
                    Method::Get => self.agent.get(&url),
                    _ => self.agent.delete(&url),
                };
                if let (Some(h), Some(v)) = (rb.headers_mut(), auth) {
                    h.insert("authorization", v);
                }
                rb.header("accept", "application/json").call()
            }
            (Method::Post, body) => {
                let mut rb = self.agent.post(&url);
                if let (Some(h), Some(v)) = (rb.headers_mut(), auth) {
                    h.insert("authorization", v);
                }
                let bytes = serde_json::to_vec(&body.unwrap_or_else(|| json!({})))
                    .expect("a JSON value serializes");
                rb.header("content-type", "application/json")
                    .header("accept", "application/json")
                    .send(&bytes[..])
            }
        };
        let resp = sent.map_err(|e| self.transport(e))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .into_with_config()
            .limit(self.options.max_response)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(n) => Error::Malformed {
                    what: what.to_string(),
                    why: format!("the answer is over {n} bytes"),
                },
                e => self.transport(e),
            })?;
        if !(200..300).contains(&status) {
            return Err(status_error(status, &bytes, what));
        }
        serde_json::from_slice(&bytes).map_err(|e| Error::Malformed {
            what: what.to_string(),
            why: format!("{status} with a body that is not what the API says: {e}"),
        })
    }

    fn transport(&self, e: ureq::Error) -> Error {
        let url = self.base.to_string();
        match e {
            ureq::Error::Timeout(_) => Error::Timeout {
                url,
                after: self.options.timeout,
            },
            ureq::Error::Io(ref io) if bxcore::deadline::is_timeout(io) => Error::Timeout {
                url,
                after: self.options.timeout,
            },
            e => Error::Unreachable {
                url,
                why: e.to_string(),
            },
        }
    }
}

fn search_body(query: &str, limit: u8, filters: Option<Value>) -> Value {
    let mut body = json!({ "query": query, "limit": limit.clamp(1, 100) });
    if let Some(f) = filters {
        body["filters"] = f;
    }
    body
}

/// The error a status that is not success means, with the server's `detail` (bounded, escaped).
fn status_error(status: u16, body: &[u8], what: &str) -> Error {
    let text = String::from_utf8_lossy(body);
    let detail = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(o)) => match o.get("detail") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => Value::Object(o).to_string(),
        },
        _ => text.into_owned(),
    };
    let mut detail: String = detail.chars().take(MAX_DETAIL).collect();
    if detail.is_empty() {
        detail = "no detail".into();
    }
    let detail = bxcore::visible::escape(&detail, bxcore::visible::Mode::Line).into_owned();
    let what = what.to_string();
    match status {
        401 | 403 => Error::Unauthorized {
            status,
            what,
            detail,
        },
        404 => Error::NotFound { what, detail },
        408 | 429 | 500..=599 => Error::Server {
            status,
            what,
            detail,
        },
        _ => Error::Refused {
            status,
            what,
            detail,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_names_its_error_and_keeps_the_detail_short_and_escaped() {
        let e = status_error(401, br#"{"detail":"No access token provided"}"#, "x");
        assert!(matches!(e, Error::Unauthorized { status: 401, .. }), "{e}");
        let e = status_error(503, b"<html>\x1b[2Jdown</html>", "x");
        assert!(e.retryable());
        assert!(e.to_string().contains("\\u{1b}"), "{e}");
        let long = format!(r#"{{"detail":"{}"}}"#, "a".repeat(5000));
        let e = status_error(422, long.as_bytes(), "x");
        assert!(!e.retryable());
        assert!(e.to_string().len() < MAX_DETAIL + 100, "{e}");
        assert!(matches!(
            status_error(404, b"", "x"),
            Error::NotFound { .. }
        ));
    }
}
