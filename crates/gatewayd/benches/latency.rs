//! `cargo bench -p gatewayd`: what gatewayd adds to a fetch, and its resident memory.
//!
//! A real `gatewayd serve` (release build) and an HTTPS origin with the test CA on loopback,
//! with a name server on loopback answering for the origin's name. The floor, in the same run
//! and interleaved, is a direct fetch of the same page with the same HTTP client and TLS stack
//! (ureq, rustls) on a fresh connection, as gatewayd makes one per fetch; gatewayd's added time
//! is the median of the paired differences: its socket round trip, the lookup over TCP, the
//! checks, the HTML reduction. Then its `VmRSS` idle at start, and idle again after the run.
//! No forbidden address is named: the configuration lists the origin's name alone.

#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Gatewayd, NameServer, Origin, fixture, loopback};

const ROUNDS: usize = 300;

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn pct(mut v: Vec<Duration>, p: usize) -> Duration {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let origin = Origin::start();
    let dns = NameServer::start(&[("origin.test", vec![loopback()])]);
    let config = format!(
        r#"
[paths]
home = "{{home}}"

[dns]
servers = ["{dns}"]

[tls]
ca_file = "{ca}"

[sandbox]
require = false

[[hosts]]
name = "origin.test"
ports = [{port}]
addresses = ["127.0.0.1"]
"#,
        dns = dns.addr,
        ca = fixture("ca.pem").display(),
        port = origin.port
    );
    let g = Gatewayd::start(&config, &[]).expect("gatewayd starts");
    let pid = g.pid();
    // Idle: started, nothing asked yet.
    std::thread::sleep(Duration::from_millis(500));
    let idle = rss_kb(pid);

    let pem = std::fs::read(fixture("ca.pem")).unwrap();
    let roots: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    let direct = ureq::Agent::config_builder()
        .max_idle_connections(0)
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(Arc::new(roots)))
                .build(),
        )
        .build()
        .new_agent();
    let direct_url = format!("https://127.0.0.1:{}/page", origin.port);
    let gw_url = format!("https://origin.test:{}/page", origin.port);

    let (mut floor, mut through, mut added) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let body = direct
            .get(&direct_url)
            .call()
            .unwrap()
            .into_body()
            .read_to_string()
            .unwrap();
        assert!(body.contains("Exchange rates"));
        let f = t.elapsed();
        let t = Instant::now();
        let r = g.get(&gw_url).expect("fetched");
        assert!(r.body.contains("Exchange rates"));
        let d = t.elapsed();
        floor.push(f);
        through.push(d);
        added.push(d.saturating_sub(f));
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kb(pid);

    println!("gatewayd: {ROUNDS} fetches of a small HTML page over HTTPS on loopback");
    println!("| | p50 | p90 |");
    println!("| --- | --- | --- |");
    println!(
        "| direct (ureq, fresh connection) | {} | {} |",
        ms(median(floor.clone())),
        ms(pct(floor, 90))
    );
    println!(
        "| through gatewayd | {} | {} |",
        ms(median(through.clone())),
        ms(pct(through, 90))
    );
    println!(
        "| added by gatewayd (paired) | {} | {} |",
        ms(median(added.clone())),
        ms(pct(added, 90))
    );
    println!();
    println!("| gatewayd VmRSS | idle at start | idle after {ROUNDS} fetches | target |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| | {idle} kB | {after} kB | <= 5 MB idle: {} |",
        if idle <= 5 * 1024 { "met" } else { "missed" }
    );
}
