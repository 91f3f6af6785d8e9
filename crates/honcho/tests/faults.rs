//! What a real Honcho cannot be made to do on demand, against a test double on loopback: answer
//! 500 in the middle of a batch, hang, answer too much, redirect, refuse the token, or not be
//! there at all. The double speaks just enough HTTP/1.1 for one request per connection.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bxcore::runbook::Anchored;
use honcho::{BaseUrl, Client, Error, Id, MessageKey, NewMessage, Options, Token};
use serde_json::{Map, Value, json};

/// One request the double saw.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the double does with a request.
enum Reply {
    Answer(u16, String),
    Raw(String),
    /// Hold the connection open without answering (until the double is dropped, at most a
    /// minute).
    Hang,
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

struct Double {
    port: u16,
    seen: Arc<Mutex<Vec<Request>>>,
    /// Accepts until the double is dropped (each connection's reads bounded by bxtest's
    /// deadline).
    _server: bxtest::Server,
    /// Dropped with the double: every hanging connection lets go.
    _release: mpsc::Sender<()>,
}

impl Double {
    fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Double {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let handler: Arc<Handler> = Arc::new(handler);
        let s = seen.clone();
        let server = bxtest::Server::each(listener, move |conn: TcpStream| {
            serve(conn, &*handler, &s, &released)
        });
        Double {
            port,
            seen,
            _server: server,
            _release: release,
        }
    }

    fn client(&self, options: Options, token: Option<Token>) -> Client {
        let base = BaseUrl::parse(&format!("http://127.0.0.1:{}", self.port)).unwrap();
        Client::new(base, token, options)
    }

    fn seen(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

/// One request on `conn` (its reads bounded: bxtest::Server set them to its deadline).
fn serve(
    conn: TcpStream,
    handler: &Handler,
    seen: &Mutex<Vec<Request>>,
    released: &Mutex<mpsc::Receiver<()>>,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    // bounded: bxtest::Server gave the connection a read timeout.
    let Ok(Some(http)) = bxtest::read_http_request(&mut reader) else {
        return;
    };
    let req = Request {
        method: http.method,
        path: http.path,
        headers: http.headers,
        body: serde_json::from_slice(&http.body).unwrap_or(Value::Null),
    };
    seen.lock().unwrap().push(req.clone());
    let mut conn = conn;
    match handler(&req) {
        Reply::Answer(status, body) => {
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
        }
        Reply::Raw(text) => {
            let _ = conn.write_all(text.as_bytes());
        }
        Reply::Hang => {
            // Until the double is dropped (the sender goes away), at most a minute.
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60));
        }
    }
}

fn quick() -> Options {
    Options {
        timeout: Duration::from_millis(500),
        ..Options::default()
    }
}

fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

fn session_reply(req: &Request) -> Reply {
    Reply::Answer(
        201,
        json!({"id": req.body["id"], "workspace_id": "w", "is_active": true,
               "metadata": req.body["metadata"]})
        .to_string(),
    )
}

/// A Honcho double that keeps the messages it took, answers listings filtered by turn from
/// them, and fails the `n`th message batch with a 500 after keeping nothing of it.
fn honcho_failing_batch(n: usize) -> Double {
    let kept: Arc<Mutex<Vec<Value>>> = Arc::new(Mutex::new(Vec::new()));
    let batches = Arc::new(Mutex::new(0usize));
    Double::start(move |req| {
        if req.path.ends_with("/sessions") {
            return session_reply(req);
        }
        if req.path.contains("/messages/list") {
            let kept = kept.lock().unwrap();
            let turns = req.body["filters"]["metadata"]["turn"]["in"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let items: Vec<Value> = kept
                .iter()
                .filter(|m| turns.contains(&m["metadata"]["turn"]))
                .cloned()
                .collect();
            let body = json!({"items": items, "total": items.len(), "page": 1,
                              "size": items.len().max(1), "pages": 1});
            return Reply::Answer(200, body.to_string());
        }
        if req.path.ends_with("/messages") {
            let mut b = batches.lock().unwrap();
            *b += 1;
            if *b == n {
                return Reply::Answer(500, r#"{"detail":"database is restarting"}"#.into());
            }
            let mut kept = kept.lock().unwrap();
            let mut out = Vec::new();
            for m in req.body["messages"].as_array().unwrap() {
                let mut m = m.clone();
                m["id"] = json!(format!("m{}", kept.len()));
                m["session_id"] = json!("s");
                kept.push(m.clone());
                out.push(m);
            }
            return Reply::Answer(201, Value::Array(out).to_string());
        }
        Reply::Answer(404, r#"{"detail":"no route"}"#.into())
    })
}

fn batch(n: usize) -> Vec<NewMessage> {
    (0..n)
        .map(|i| NewMessage {
            peer: id("owner"),
            content: format!("m{i}"),
            key: MessageKey {
                turn: i as u64 + 1,
                part: 0,
            },
            metadata: Map::new(),
        })
        .collect()
}

#[test]
fn a_500_in_the_middle_of_a_batch_is_retryable_and_the_retry_files_only_what_is_missing() {
    let d = honcho_failing_batch(2);
    let c = d.client(quick(), None);
    let s = c
        .create_session(&id("w"), &id("s"), Map::new(), &[])
        .unwrap();
    let all = batch(250);
    let e = c.add_messages(&s, &all).unwrap_err();
    assert!(matches!(e, Error::Server { status: 500, .. }), "{e}");
    assert!(e.retryable());
    assert_eq!(e.anchor(), "honcho-unavailable");
    assert!(e.to_string().contains("database is restarting"), "{e}");
    let r = c.add_messages(&s, &all).unwrap();
    assert_eq!((r.added, r.present), (150, 100));
    let again = c.add_messages(&s, &all).unwrap();
    assert_eq!((again.added, again.present), (0, 250));
}

#[test]
fn a_server_that_hangs_is_a_timeout_within_the_deadline() {
    let d = Double::start(|_| Reply::Hang);
    let c = d.client(quick(), None);
    let e = c.health().unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(e.retryable());
    assert!(e.to_string().contains("did not answer within 0.5s"), "{e}");
}

#[test]
fn a_server_that_is_not_there_is_unreachable_and_retryable() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let base = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let c = Client::new(base, None, quick());
    let e = c.health().unwrap_err();
    assert!(matches!(e, Error::Unreachable { .. }), "{e}");
    assert!(e.retryable());
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
}

#[test]
fn an_answer_over_the_size_limit_is_refused_not_read_whole() {
    let d = Double::start(|_| Reply::Answer(200, format!("\"{}\"", "x".repeat(100_000))));
    let c = d.client(
        Options {
            max_response: 10_000,
            ..quick()
        },
        None,
    );
    let e = c.health().unwrap_err();
    assert!(matches!(e, Error::Malformed { .. }), "{e}");
    assert!(e.to_string().contains("over 10000 bytes"), "{e}");
    assert!(!e.retryable());
}

#[test]
fn a_redirect_is_not_followed() {
    let d = Double::start(|_| {
        Reply::Raw(
            "HTTP/1.1 307 X\r\nlocation: http://127.0.0.1:1/health\r\ncontent-length: 0\r\n\
             connection: close\r\n\r\n"
                .into(),
        )
    });
    let c = d.client(quick(), None);
    let e = c.health().unwrap_err();
    assert!(matches!(e, Error::Refused { status: 307, .. }), "{e}");
    assert_eq!(d.seen().len(), 1);
}

#[test]
fn an_answer_that_is_not_the_apis_shape_is_malformed_not_a_panic() {
    let d = Double::start(|req| {
        if req.path.ends_with("/sessions") {
            Reply::Answer(201, r#"{"id":"other","workspace_id":"w"}"#.into())
        } else {
            Reply::Answer(200, "not json".into())
        }
    });
    let c = d.client(quick(), None);
    let e = c
        .create_session(&id("w"), &id("s"), Map::new(), &[])
        .unwrap_err();
    assert!(e.to_string().contains("answered the session other"), "{e}");
    let e = c.search(&id("w"), "q", 5, None).unwrap_err();
    assert!(matches!(e, Error::Malformed { .. }), "{e}");
}

#[test]
fn the_token_is_sent_as_a_bearer_header_and_a_refused_one_is_named_without_showing_it() {
    let d = Double::start(|req| match req.header("authorization") {
        Some("Bearer good-token") => Reply::Answer(200, "{}".into()),
        _ => Reply::Answer(401, r#"{"detail":"Invalid access token"}"#.into()),
    });
    let dir = tempfile::tempdir().unwrap();
    let key = |text: &str| {
        let p = dir.path().join("k");
        bxtest::write_private(&p, text);
        Token::read(&p).unwrap()
    };
    let c = d.client(quick(), Some(key("good-token\n")));
    c.workspace(&id("w"), Map::new()).unwrap_or_else(|e| {
        // The double answers {} to a workspace call: only the header matters here.
        assert!(matches!(e, Error::Malformed { .. }), "{e}");
        honcho::Workspace {
            id: id("w"),
            metadata: Map::new(),
        }
    });
    assert_eq!(
        d.seen()[0].header("authorization"),
        Some("Bearer good-token")
    );
    let c = d.client(quick(), Some(key("bad-token")));
    let e = c.search(&id("w"), "q", 5, None).unwrap_err();
    assert!(matches!(e, Error::Unauthorized { status: 401, .. }), "{e}");
    assert_eq!(e.anchor(), "honcho-auth");
    assert!(!e.retryable());
    assert!(!e.to_string().contains("bad-token"), "{e}");
    assert!(!format!("{c:?}").contains("bad-token"));
    let c = d.client(quick(), None);
    let _ = c.search(&id("w"), "q", 5, None).unwrap_err();
    assert_eq!(d.seen().last().unwrap().header("authorization"), None);
}

#[test]
fn every_request_goes_under_v3_of_the_base() {
    let d = Double::start(|_| Reply::Answer(200, "[]".into()));
    let c = d.client(quick(), None);
    c.search(&id("w"), "q", 5, None).unwrap();
    let seen = d.seen();
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].path, "/v3/workspaces/w/search");
    assert_eq!(seen[0].body["query"], "q");
}
