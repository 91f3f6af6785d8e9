//! The `run` tool's start-up overhead (quality.md: each benchmark measures its floor in the same
//! run): a program that does nothing (`/bin/true`), started
//!
//! - bare: `fork` + `execve` + `wait` (`std::process::Command`), the floor;
//! - by the `run` tool, as brokerd starts it: planned (the program resolved, the roots labelled),
//!   its Landlock ruleset built, supervisor and program forked, limits, the child sandbox,
//!   `execve`, the group ended and reaped, the output described;
//! - the same without the program's own user and network namespace, to show what that costs.
//!
//! Run: `cargo bench -p toolkit --bench run` (or `-- --quick`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bxcore::DataClass;
use bxcore::Label;
use bxharden::seccomp::Mismatch;
use bxharden::{ChildSandbox, Profile, SeccompProfile};
use serde_json::json;
use toolkit::run::Settings;
use toolkit::{Env, Registry, Root, Roots};

fn settings(own_network: bool) -> Settings {
    let mut child = Profile::new(SeccompProfile::RunChild);
    for p in toolkit::run::DEFAULT_SYSTEM_PATHS {
        if Path::new(p).exists() {
            child = child.read_only(p);
        }
    }
    Settings {
        path: toolkit::run::DEFAULT_PATH
            .iter()
            .map(PathBuf::from)
            .collect(),
        programs: None,
        memory_bytes: 1 << 30,
        file_bytes: 64 << 20,
        processes: 64,
        open_files: 256,
        max_output: 65536,
        own_network,
        sandbox: ChildSandbox::prepare(&child, Mismatch::KillProcess, true).unwrap(),
    }
}

fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * q) as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 50 } else { 300 };
    let home = tempfile::tempdir().unwrap();
    let notes = home.path().canonicalize().unwrap().join("notes");
    std::fs::create_dir(&notes).unwrap();
    let roots = Roots::new(vec![Root {
        path: notes.clone(),
        name: None,
        class: DataClass::Private,
        writable: true,
        untrusted: false,
    }])
    .unwrap();
    let reg = Registry::new(&BTreeMap::new()).unwrap();
    let run = reg.get("run").unwrap();
    let args = json!({"argv": ["/bin/true"], "cwd": notes.display().to_string()});

    let mut rows: Vec<(&str, Vec<Duration>)> = Vec::new();
    let mut bare = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let s = Command::new("/bin/true").status().unwrap();
        assert!(s.success());
        bare.push(t.elapsed());
    }
    rows.push(("bare fork+exec+wait", bare));
    for (name, own_network) in [
        ("run tool (with its own network namespace)", true),
        ("run tool (no namespace of its own)", false),
    ] {
        let env = Env {
            roots: roots.clone(),
            gateway: None,
            run: Some(Arc::new(settings(own_network))),
            servers: Default::default(),
        };
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let plan = run.plan_seen(&args, &env, Label::FRESH).unwrap();
            let out = run
                .run(&args, &plan, &env, &bxcore::SessionId::new("s").unwrap())
                .unwrap();
            assert!(out.content.starts_with("exit code 0"), "{}", out.content);
            times.push(t.elapsed());
        }
        rows.push((name, times));
    }
    let floor = {
        let mut v = rows[0].1.clone();
        quantile(&mut v, 0.5)
    };
    println!("run start-up overhead, {n} runs of /bin/true each");
    println!("| how | p50 (µs) | p90 (µs) | p50 / bare |");
    println!("| --- | --- | --- | --- |");
    for (name, mut v) in rows {
        let p50 = quantile(&mut v, 0.5);
        let p90 = quantile(&mut v, 0.9);
        println!(
            "| {name} | {:.0} | {:.0} | {:.2} |",
            us(p50),
            us(p90),
            p50.as_secs_f64() / floor.as_secs_f64()
        );
    }
}
