//! A faulty path to the real Honcho: an HTTP proxy on loopback that passes each request to the
//! real server (`$HONCHO_URL`) unless the test's rule says otherwise: answer 500 instead, hang,
//! pass the request on and cut the connection before the answer comes back (Honcho filed it, the
//! client never hears so), or be down. It is how a test makes the faults a real server cannot
//! be made to produce on demand, in front of the real server, and it records every request, so a
//! test can show what was and was not sent.

#![allow(dead_code)]

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// What the proxy does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// To Honcho and back.
    Pass,
    /// Answer 500 without passing it on.
    Status500,
    /// Hold the connection, answer nothing (until the proxy is dropped, at most a minute).
    Hang,
    /// Pass it on, let Honcho answer, and close the client's connection without the answer.
    CutAfterHoncho,
    /// Close the connection at once, as a server that is down.
    Down,
}

/// One request the proxy saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub body: String,
    pub fault: Fault,
}

type Rule = dyn FnMut(&str, &str) -> Fault + Send;

pub struct Proxy {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    rule: Arc<Mutex<Box<Rule>>>,
    _server: bxtest::Server,
    _release: mpsc::Sender<()>,
}

impl Proxy {
    /// A proxy to the Honcho at `upstream` (`http://host:port`), passing everything.
    pub fn start(upstream: &str) -> Proxy {
        let up = upstream
            .trim_end_matches('/')
            .strip_prefix("http://")
            .expect("HONCHO_URL is http://host:port")
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let rule: Arc<Mutex<Box<Rule>>> = Arc::new(Mutex::new(Box::new(|_, _| Fault::Pass)));
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let (s, r) = (seen.clone(), rule.clone());
        let server = bxtest::Server::each(listener, move |conn: TcpStream| {
            serve(conn, &up, &s, &r, &released)
        });
        Proxy {
            port,
            seen,
            rule,
            _server: server,
            _release: release,
        }
    }

    /// The base URL memoryd is given.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// From now on, `rule(method, path)` decides each request.
    pub fn set(&self, rule: impl FnMut(&str, &str) -> Fault + Send + 'static) {
        *self.rule.lock().unwrap() = Box::new(rule);
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(
    conn: TcpStream,
    upstream: &str,
    seen: &Mutex<Vec<Seen>>,
    rule: &Mutex<Box<Rule>>,
    released: &Mutex<mpsc::Receiver<()>>,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    // bounded: bxtest::Server gave the connection a read timeout.
    let Ok(Some(bxtest::HttpRequest {
        method,
        path,
        headers,
        body,
    })) = bxtest::read_http_request(&mut reader)
    else {
        return;
    };
    // What is passed on to Honcho: the token and the body's type.
    let headers: Vec<String> = headers
        .into_iter()
        .filter(|(n, _)| n == "authorization" || n == "content-type")
        .map(|(n, v)| format!("{n}: {v}"))
        .collect();
    let fault = (rule.lock().unwrap())(&method, &path);
    seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        body: String::from_utf8_lossy(&body).into_owned(),
        fault,
    });
    let mut conn = conn;
    match fault {
        Fault::Down => {}
        Fault::Hang => {
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60));
        }
        Fault::Status500 => {
            let b = r#"{"detail":"injected by the test's proxy"}"#;
            let _ = write!(
                conn,
                "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{b}",
                b.len()
            );
        }
        Fault::Pass | Fault::CutAfterHoncho => {
            let Some(answer) = upstream_answer(upstream, &method, &path, &headers, &body) else {
                return;
            };
            if fault == Fault::Pass {
                let _ = conn.write_all(&answer);
            }
        }
    }
}

/// The request sent to Honcho on a connection of its own, and Honcho's whole answer.
fn upstream_answer(
    upstream: &str,
    method: &str,
    path: &str,
    headers: &[String],
    body: &[u8],
) -> Option<Vec<u8>> {
    let mut up = TcpStream::connect(upstream).ok()?;
    up.set_read_timeout(Some(bxtest::DEADLINE)).ok()?;
    up.set_write_timeout(Some(bxtest::DEADLINE)).ok()?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {upstream}\r\nconnection: close\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    up.write_all(head.as_bytes()).ok()?;
    up.write_all(body).ok()?;
    let mut answer = Vec::new();
    // bounded: the upstream connection has a read timeout, and Honcho closes it after answering.
    up.read_to_end(&mut answer).ok()?;
    Some(answer)
}
