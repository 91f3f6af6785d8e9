//! What gatewayd's tests stand on: a network namespace of the test's own with only loopback up
//! (every test that names a forbidden address runs in one, so no packet can reach a real
//! metadata service or private network), an HTTPS origin on loopback with its own test CA
//! (`tests/tls/`), a name server over TCP on loopback whose answers the test scripts (DNS
//! rebinding included), and the real daemon.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bxcore::{FetchRequest, Header, Message, WireError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The variable that tells a re-executed test binary it runs inside its own namespace.
const IN_NETNS: &str = "GATEWAYD_TEST_NETNS";

/// Run the test `name` in a network namespace of its own with only loopback up: outside one,
/// re-execute this test alone under `unshare --net` and return `false` (the caller returns; the
/// child's result is asserted here); inside, bring loopback up and return `true`.
pub fn in_own_netns(name: &str) -> bool {
    if std::env::var(IN_NETNS).as_deref() == Ok(name) {
        let up = bxtest::run(
            Command::new("ip").args(["link", "set", "lo", "up"]),
            "ip link set lo up",
            bxtest::DEADLINE,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            up.status.success(),
            "cannot bring loopback up in the namespace"
        );
        return true;
    }
    let probe = bxtest::run(
        Command::new("unshare").args(["--net", "true"]),
        "unshare --net true",
        bxtest::DEADLINE,
    );
    match probe {
        Ok(o) if o.status.success() => {}
        _ => {
            bxtest::skip(
                "cannot make a network namespace (unshare --net needs root or user namespaces)",
            );
            return false;
        }
    }
    let exe = std::env::current_exe().unwrap();
    let out = bxtest::run(
        Command::new("unshare")
            .arg("--net")
            .arg("--")
            .arg(exe)
            .args(["--exact", name, "--nocapture", "--test-threads", "1"])
            .env(IN_NETNS, name),
        name,
        Duration::from_secs(300),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let said = bxtest::said(&out);
    assert!(
        out.status.success(),
        "{name} in its own network namespace failed:\n{said}"
    );
    assert!(
        said.contains("1 passed"),
        "{name} did not run in its namespace:\n{said}"
    );
    false
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls")
        .join(name)
}

/// One request as the origin saw it.
pub type Seen = bxtest::HttpRequest;

/// An HTTPS origin on 127.0.0.1 (a certificate for `origin.test`, `other.test`,
/// `*.rebind.test`, 127.0.0.1, 169.254.169.254 and ::ffff:127.0.0.1 from the test CA),
/// answering by path:
///
/// - `/page`: a small HTML page, with a `Set-Cookie`;
/// - `/echo`: the request's headers as plain text;
/// - `/echo-forms`: the `authorization` header's value reversed, in base64, base32 and hex, a
///   line each (a host that echoes its credential encoded);
/// - `/deep`: HTML nested too deeply to lay out, with a script inside;
/// - `/to?URL`: `302` to URL;
/// - `/loop`: `302` to `/loop`;
/// - `/huge`: `200` with a `Content-Length` of 10 GiB, written until the client goes away;
/// - `/drip`: `200`, then one byte every 100 ms until the client goes away (or two minutes).
pub struct Origin {
    pub port: u16,
    _server: bxtest::Server,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Bytes of body `/huge` and `/drip` wrote before the client went away.
    pub written: Arc<AtomicU64>,
    /// How many `/huge` and `/drip` answers have ended.
    pub ended: Arc<AtomicU64>,
}

impl Origin {
    pub fn start() -> Origin {
        let certs = CertificateDer::pem_file_iter(fixture("server.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(fixture("server.key")).unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(AtomicU64::new(0));
        let ended = Arc::new(AtomicU64::new(0));
        let (s, w, e) = (seen.clone(), written.clone(), ended.clone());
        let server = bxtest::Server::each(listener, move |tcp| {
            serve_one(tcp, config.clone(), &s, &w, &e)
        });
        Origin {
            port,
            _server: server,
            seen,
            written,
            ended,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn paths(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.path).collect()
    }
}

fn serve_one(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    seen: &Mutex<Vec<Seen>>,
    written: &AtomicU64,
    ended: &AtomicU64,
) {
    // The server bounded the connection's reads and writes (bxtest::Server).
    let conn = rustls::ServerConnection::new(config).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut reader = BufReader::new(&mut tls);
    // bounded: the connection has read and write timeouts (bxtest::Server)
    let Ok(Some(request)) = bxtest::read_http_request(&mut reader) else {
        return;
    };
    seen.lock().unwrap().push(request.clone());
    let Seen { path, headers, .. } = request;
    let whole = |status: &str, extra: &str, ctype: &str, body: &str| {
        format!(
            "HTTP/1.1 {status}\r\n{extra}content-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let reply = if path == "/page" {
        whole(
            "200 OK",
            "set-cookie: session=abc; Secure\r\n",
            "text/html; charset=utf-8",
            "<!DOCTYPE html><html><head><title>Rates</title><script>x()</script></head>\
             <body><h1>Exchange rates</h1><p>One <b>euro</b> is 1.08 dollars.</p></body></html>",
        )
    } else if path == "/echo" {
        let text: String = headers.iter().map(|(n, v)| format!("{n}: {v}\n")).collect();
        whole("200 OK", "", "text/plain", &text)
    } else if path == "/echo-forms" {
        use base64::Engine;
        let v = headers
            .iter()
            .find(|(n, _)| n == "authorization")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let text = format!(
            "reversed {}\nbase64 {}\nbase32 {}\nhex {}\n",
            v.chars().rev().collect::<String>(),
            base64::engine::general_purpose::STANDARD.encode(&v),
            base32(v.as_bytes()),
            v.bytes().map(|b| format!("{b:02x}")).collect::<String>(),
        );
        whole("200 OK", "", "text/plain", &text)
    } else if path == "/deep" {
        let page = format!(
            "<html><body>{}<script>steal()</script>hidden words{}</body></html>",
            "<blockquote>".repeat(200),
            "</blockquote>".repeat(200)
        );
        whole("200 OK", "", "text/html", &page)
    } else if let Some(to) = path.strip_prefix("/to?") {
        whole(
            "302 Found",
            &format!("location: {to}\r\n"),
            "text/plain",
            "",
        )
    } else if path == "/controls" {
        // Text of control characters: each is six bytes once escaped in a frame.
        whole("200 OK", "", "text/plain", &"\u{1}".repeat(256 * 1024))
    } else if path.starts_with("/broken") {
        // A head that promises more than the body sends, then the connection ends.
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 1000\r\n\r\nshort";
        let _ = tls.write_all(head.as_bytes());
        let _ = tls.flush();
        tls.conn.send_close_notify();
        let _ = tls.flush();
        return;
    } else if path == "/loop" {
        whole("302 Found", "location: /loop\r\n", "text/plain", "")
    } else if path == "/huge" || path == "/drip" {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 10737418240\r\n\r\n";
        if tls.write_all(head.as_bytes()).is_err() {
            return;
        }
        let until = Instant::now() + Duration::from_secs(120);
        let chunk = vec![b'a'; if path == "/huge" { 64 * 1024 } else { 1 }];
        while Instant::now() < until {
            if tls.write_all(&chunk).and_then(|_| tls.flush()).is_err() {
                break;
            }
            written.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            if path == "/drip" {
                thread::sleep(Duration::from_millis(100));
            }
        }
        ended.fetch_add(1, Ordering::SeqCst);
        return;
    } else {
        whole("404 Not Found", "", "text/plain", "no such page")
    };
    let _ = tls.write_all(reply.as_bytes());
    let _ = tls.flush();
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

/// RFC 4648 base32 without padding, as a server might echo a header in it.
pub fn base32(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    for c in bytes.chunks(5) {
        let mut block = [0u8; 5];
        block[..c.len()].copy_from_slice(c);
        let n = block.iter().fold(0u64, |a, &b| a << 8 | u64::from(b));
        for i in 0..(c.len() * 8).div_ceil(5) {
            out.push(A[(n >> (35 - 5 * i) & 31) as usize] as char);
        }
    }
    out
}

/// A name server over TCP on 127.0.0.1: for each name, the answers to give in turn (the last
/// one again once they run out); an unknown name does not exist. It counts the lookups of each
/// name (one per connection: `A` and `AAAA` together).
pub struct NameServer {
    pub addr: SocketAddr,
    _server: bxtest::Server,
    pub lookups: Arc<Mutex<HashMap<String, usize>>>,
}

impl NameServer {
    pub fn start(answers: &[(&str, Vec<Vec<IpAddr>>)]) -> NameServer {
        let answers: HashMap<String, Vec<Vec<IpAddr>>> = answers
            .iter()
            .map(|(n, a)| (n.to_string(), a.clone()))
            .collect();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let lookups = Arc::new(Mutex::new(HashMap::new()));
        let l = lookups.clone();
        let server = bxtest::Server::each(listener, move |mut tcp: TcpStream| {
            let mut counted = false;
            // A and AAAA on one connection.
            for _ in 0..2 {
                let mut len = [0u8; 2];
                if tcp.read_exact(&mut len).is_err() {
                    break;
                }
                let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
                if tcp.read_exact(&mut msg).is_err() {
                    break;
                }
                let reply = answer(&msg, &answers, &l, &mut counted);
                let mut out = (reply.len() as u16).to_be_bytes().to_vec();
                out.extend(reply);
                if tcp.write_all(&out).is_err() {
                    break;
                }
            }
        });
        NameServer {
            addr,
            _server: server,
            lookups,
        }
    }

    pub fn lookups(&self, name: &str) -> usize {
        self.lookups.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

fn answer(
    msg: &[u8],
    answers: &HashMap<String, Vec<Vec<IpAddr>>>,
    lookups: &Mutex<HashMap<String, usize>>,
    counted: &mut bool,
) -> Vec<u8> {
    use simple_dns::rdata::{A, AAAA, RData};
    use simple_dns::{CLASS, Packet, QTYPE, RCODE, ResourceRecord, TYPE};
    let q = Packet::parse(msg).unwrap();
    let question = q.questions[0].clone();
    let name = question.qname.to_string();
    let mut reply = Packet::new_reply(q.id());
    reply.questions.push(question.clone());
    let mut l = lookups.lock().unwrap();
    let n = l.entry(name.clone()).or_insert(0);
    if !*counted {
        *n += 1;
        *counted = true;
    }
    let nth = *n;
    drop(l);
    match answers.get(&name) {
        None => *reply.rcode_mut() = RCODE::NameError,
        Some(seq) => {
            let addrs = &seq[(nth - 1).min(seq.len() - 1)];
            for ip in addrs {
                let rdata = match (ip, question.qtype) {
                    (IpAddr::V4(v4), QTYPE::TYPE(TYPE::A)) => RData::A(A::from(*v4)),
                    (IpAddr::V6(v6), QTYPE::TYPE(TYPE::AAAA)) => RData::AAAA(AAAA::from(*v6)),
                    _ => continue,
                };
                reply.answers.push(ResourceRecord::new(
                    question.qname.clone(),
                    CLASS::IN,
                    0,
                    rdata,
                ));
            }
        }
    }
    reply.build_bytes_vec().unwrap()
}

/// The real gatewayd, serving a fresh home.
pub struct Gatewayd {
    pub home: tempfile::TempDir,
    pub socket: PathBuf,
    pub log: PathBuf,
    daemon: bxtest::Daemon,
}

impl Gatewayd {
    /// Write `config` (`{home}` replaced) and `files` into a fresh home and start the daemon.
    pub fn start(config: &str, files: &[(&str, &str)]) -> Result<Gatewayd, String> {
        let home = tempfile::tempdir().unwrap();
        // Every file a test hands over is a secret file, its owner's alone.
        for (name, text) in files {
            bxtest::write_private(&home.path().join(name), text);
        }
        let text = config.replace("{home}", &home.path().display().to_string());
        let cfg = home.path().join("gatewayd.toml");
        std::fs::write(&cfg, text).unwrap();
        let log = home.path().join("gatewayd.log");
        let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gatewayd"));
        let mut daemon = bxtest::Daemon::spawn(bin, "serve", &cfg, &log);
        let socket = home.path().join("run/broker-gateway/gateway.sock");
        daemon.wait_ready("ping", || {
            bxcore::client::ping(&socket, Duration::from_secs(5)).is_ok()
        })?;
        Ok(Gatewayd {
            home,
            socket,
            log,
            daemon,
        })
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    pub fn log_text(&self) -> String {
        self.daemon.log_text()
    }

    /// Ask for `url` (GET), with `headers` and `body`.
    pub fn ask(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
        max: u64,
    ) -> Result<bxcore::FetchReply, WireError> {
        match self.answer(method, url, headers, body, max) {
            Message::FetchReply(r) => Ok(r),
            Message::FetchFailed(w) | Message::Error(w) => Err(w),
            other => panic!("an unexpected answer: {other:?}"),
        }
    }

    /// The message gatewayd answers a fetch with: `fetch_reply`, `fetch_failed` (refused after
    /// the web answered) or `error` (refused before).
    pub fn answer(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
        max: u64,
    ) -> Message {
        let req = Message::FetchRequest(FetchRequest {
            url: url.to_string(),
            method: method.to_string(),
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            body: body.to_string(),
            max_bytes: max,
        });
        match bxcore::client::call(&self.socket, bxtest::DEADLINE, 1, req, |_| {}) {
            Ok(m) => m,
            Err(bxcore::client::ClientError::Remote(w)) => Message::Error(w),
            Err(e) => panic!("gatewayd did not answer: {e}"),
        }
    }

    pub fn get(&self, url: &str) -> Result<bxcore::FetchReply, WireError> {
        self.ask("GET", url, &[], "", 0)
    }

    /// Wait until the log holds `needle`.
    pub fn wait_log(&self, needle: &str) -> String {
        self.daemon.wait_log(needle)
    }
}

/// What most tests serve: `origin.test` and `other.test` on the origin (loopback, allowed by
/// their entries), `origin.test` with a credential, `*.rebind.test` and the literal addresses
/// 127.0.0.1, 169.254.169.254 and ::ffff:127.0.0.1 on the allow-list without any internal
/// address allowed, so only the address check stands between them and the origin.
pub fn config(origin: &Origin, dns: &NameServer, extra: &str) -> String {
    let port = origin.port;
    format!(
        r#"
[paths]
home = "{{home}}"

[dns]
servers = ["{dns}"]

[tls]
ca_file = "{ca}"

[sandbox]
require = false

{extra}

[[hosts]]
name = "origin.test"
ports = [{port}]
addresses = ["127.0.0.1"]
header = "authorization"
prefix = "Bearer "
secret_file = "{{home}}/origin-token"

[[hosts]]
name = "other.test"
ports = [{port}]
addresses = ["127.0.0.1"]

[[hosts]]
name = "*.rebind.test"
ports = [{port}]

[[hosts]]
name = "127.0.0.1"
ports = [{port}]

[[hosts]]
name = "169.254.169.254"
ports = [{port}]
http = true

[[hosts]]
name = "::ffff:127.0.0.1"
ports = [{port}]
"#,
        dns = dns.addr,
        ca = fixture("ca.pem").display(),
    )
}

/// The credential of `origin.test` in the tests.
pub const TOKEN: &str = "tok-3f9a8c1d2e7b6a5f";

pub fn loopback() -> Vec<IpAddr> {
    vec!["127.0.0.1".parse().unwrap()]
}

/// A fresh origin, name server and daemon with [`config`] and `extra` configuration.
pub fn world(extra: &str, names: &[(&str, Vec<Vec<IpAddr>>)]) -> (Origin, NameServer, Gatewayd) {
    let origin = Origin::start();
    let mut all: Vec<(&str, Vec<Vec<IpAddr>>)> = vec![
        ("origin.test", vec![loopback()]),
        ("other.test", vec![loopback()]),
    ];
    all.extend(names.iter().cloned());
    let dns = NameServer::start(&all);
    let g = Gatewayd::start(
        &config(&origin, &dns, extra),
        &[("origin-token", &format!("{TOKEN}\n"))],
    )
    .unwrap_or_else(|e| panic!("gatewayd did not start: {e}"));
    (origin, dns, g)
}
