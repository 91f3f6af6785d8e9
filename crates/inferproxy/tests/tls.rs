//! HTTPS to the provider: a TLS server on loopback (a test CA and a certificate for `localhost`
//! and 127.0.0.1, in `tests/tls/`), reached by the real daemon inside its sandbox through name
//! resolution, the CA bundle read at start, and rustls; and refused when the CA is not trusted.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bxcore::{ChatMessage, InferRequest, Message};
use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls")
        .join(name)
}

/// An HTTPS provider answering every request with one streamed text reply; it counts the
/// connections it accepted (before their handshake, so a client that saw the certificate has
/// been counted) and the requests that got through the handshake.
struct TlsProvider {
    port: u16,
    requests: Arc<Mutex<usize>>,
    connections: Arc<Mutex<usize>>,
    _server: bxtest::Server,
}

fn start() -> TlsProvider {
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
    let requests = Arc::new(Mutex::new(0));
    let connections = Arc::new(Mutex::new(0));
    let (r, c) = (requests.clone(), connections.clone());
    let server = bxtest::Server::in_turn(listener, move |tcp| {
        *c.lock().unwrap() += 1;
        let config = config.clone();
        let r = r.clone();
        std::thread::spawn(move || {
            let conn = rustls::ServerConnection::new(config).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut reader = BufReader::new(&mut tls);
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                // bounded: bxtest::Server's read timeout
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            *r.lock().unwrap() += 1;
            let chunks = [
                    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "over "}, "finish_reason": null}]}).to_string(),
                    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "TLS"}, "finish_reason": "stop"}]}).to_string(),
                ];
            let events: String =
                openai_events(&chunks.iter().map(String::as_str).collect::<Vec<_>>()).concat();
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{events}",
                events.len()
            );
            tls.write_all(reply.as_bytes()).unwrap();
            tls.flush().unwrap();
            tls.conn.send_close_notify();
            let _ = tls.flush();
        });
    });
    TlsProvider {
        port,
        requests,
        connections,
        _server: server,
    }
}

fn config(port: u16, ca: &Path) -> String {
    format!(
        r#"
[paths]
home = "{{home}}"

[provider]
kind = "openai"
base_url = "https://localhost:{port}/v1"
api_key_file = "{{home}}/key"
ca_file = "{}"

[slots.main]
model = "gpt-test"
max_tokens = 100
context_tokens = 100000

[limits]
backoff_ms = 10

[sandbox]
require = false
"#,
        ca.display()
    )
}

fn ask(d: &Daemon) -> Vec<bxcore::Envelope> {
    d.ask(
        1,
        Message::InferRequest(InferRequest {
            slot: "main".into(),
            messages: vec![ChatMessage::User { text: "hi".into() }],
            tools: vec![],
            first_call: bxcore::CallId(1),
        }),
    )
}

#[test]
fn https_with_the_configured_ca_works_inside_the_sandbox() {
    let p = start();
    let d = Daemon::start_with(&config(p.port, &fixture("ca.pem")), &[("key", KEY)]).unwrap();
    let frames = ask(&d);
    let Message::InferReply(r) = &frames.last().unwrap().msg else {
        panic!("{frames:?}\n{}", d.log_text())
    };
    assert_eq!(
        r.message,
        ChatMessage::Assistant {
            text: "over TLS".into(),
            tool_calls: vec![]
        }
    );
    assert_eq!(*p.requests.lock().unwrap(), 1);
}

#[test]
fn a_provider_whose_ca_is_not_trusted_is_unreachable_and_not_retried() {
    let p = start();
    let d = Daemon::start_with(&config(p.port, &fixture("other-ca.pem")), &[("key", KEY)]).unwrap();
    let frames = ask(&d);
    let Message::Error(e) = &frames.last().unwrap().msg else {
        panic!("{frames:?}")
    };
    assert_eq!(e.code, bxcore::ErrorCode::Inference);
    assert!(
        e.detail.contains("the provider cannot be reached"),
        "{}",
        e.detail
    );
    assert!(
        e.detail.to_lowercase().contains("certificate"),
        "{}",
        e.detail
    );
    assert!(
        e.detail
            .ends_with("see docs/runbook.md#inference-unreachable")
    );
    let (requests, connections) = (*p.requests.lock().unwrap(), *p.connections.lock().unwrap());
    assert_eq!(requests, 0, "no request crossed an untrusted connection");
    assert_eq!(connections, 1, "a TLS failure is not retried: {}", e.detail);
}

#[test]
fn a_ca_file_without_certificates_refuses_to_start() {
    let home = tempfile::tempdir().unwrap();
    let empty = home.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let e = match Daemon::start_with(&config(1, &empty), &[("key", KEY)]) {
        Ok(_) => panic!("it started"),
        Err(e) => e,
    };
    assert!(
        e.contains("holds no certificate; see docs/runbook.md#inferproxy-config-invalid"),
        "{e}"
    );
}
