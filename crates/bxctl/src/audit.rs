//! `bxctl audit verify` (brokerd verifies its chain and reports) and `bxctl audit tail` (the last
//! records, read from the chain file: reading needs brokerd's user or root on the device).

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use bxcore::client::{self, ClientError};
use bxcore::visible::{Mode, Shown, escape};
use bxcore::{AuditHead, Message};
use serde_json::{Value, json};

use crate::Outcome;
use crate::context::Context;
use crate::output::{failed, json_line};

/// `SEQ:HASH`, as the journal's `audit chain head` line gives it.
fn parse_head(text: &str) -> Option<AuditHead> {
    let (seq, hash) = text.split_once(':')?;
    let ok = hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    ok.then_some(AuditHead {
        seq: seq.parse().ok()?,
        hash: hash.to_string(),
    })
}

/// `bxctl audit verify [--head SEQ:HASH]`.
pub fn verify(ctx: &Context, head: Option<&str>) -> Outcome {
    let msg = match head.map(|h| (h, parse_head(h))) {
        None => Message::AuditVerify {},
        Some((_, Some(h))) => Message::AuditVerifyHead(h),
        Some((h, None)) => {
            eprintln!(
                "bxctl: --head {} is not SEQ:HASH (a record number, a colon, 64 lowercase hex \
                 digits), as the journal's `audit chain head` line gives it",
                Shown(h, Mode::Line)
            );
            return Outcome::Failed;
        }
    };
    match client::call(&ctx.admin, ctx.timeout, 1, msg, |_| {}) {
        Ok(Message::AuditReport(r)) => {
            if ctx.json {
                json_line(&r);
            } else {
                println!("records: {}", r.records);
                println!("head: {}", r.head);
                println!("{}", Shown(&r.detail, Mode::Line));
            }
            if r.ok { Outcome::Done } else { Outcome::Failed }
        }
        Ok(other) => failed(
            ctx,
            "cannot verify the audit chain",
            &ClientError::Unexpected(other.kind()),
        ),
        Err(e) => failed(ctx, "cannot verify the audit chain", &e),
    }
}

/// The last `n` whole lines of `path`, read from its end.
fn last_lines(path: &Path, n: usize) -> io::Result<Vec<String>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.seek(SeekFrom::End(0))?;
    let mut start = len;
    let mut buf = Vec::new();
    // Read backwards in blocks until n + 1 newlines are in hand (or the start of the file).
    while start > 0 {
        let step = (64 * 1024u64).min(start);
        start -= step;
        f.seek(SeekFrom::Start(start))?;
        let mut block = vec![0u8; (len - start) as usize - buf.len()];
        f.read_exact(&mut block)?;
        block.extend_from_slice(&buf);
        buf = block;
        if buf.iter().filter(|&&b| b == b'\n').count() > n {
            break;
        }
    }
    let text = String::from_utf8_lossy(&buf);
    // A last line with no newline is a write in progress or a torn tail: not a record yet.
    let whole = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    let mut lines: Vec<String> = whole.lines().map(str::to_string).collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    let skip = lines.len().saturating_sub(n);
    Ok(lines.split_off(skip))
}

fn field(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One record, for a person: `seq time event session/call tool detail`.
pub fn show(v: &Value) -> String {
    let detail = match &v["detail"] {
        Value::Object(m) if m.is_empty() => String::new(),
        Value::Null => String::new(),
        d => d.to_string(),
    };
    let line = format!(
        "{:>6} {} {:<9} {}/{} {} {}",
        field(v, "seq"),
        field(v, "time"),
        field(v, "event"),
        field(v, "session"),
        field(v, "call"),
        field(v, "tool"),
        detail
    );
    escape(&line, Mode::Line).into_owned()
}

/// `bxctl audit tail [-n N]`.
pub fn tail(ctx: &Context, n: usize, chain: Option<&Path>) -> Outcome {
    let path = chain
        .map(Path::to_path_buf)
        .unwrap_or_else(|| ctx.home.join("broker/audit/chain.jsonl"));
    let lines = match last_lines(&path, n) {
        Ok(l) => l,
        Err(e) => {
            if ctx.json {
                json_line(
                    &json!({"error": {"code": "failed", "detail": format!("{}: {e}", path.display())}}),
                );
            } else {
                eprintln!(
                    "bxctl: cannot read the audit chain {}: {e} (on the device it is brokerd's: use sudo)",
                    path.display()
                );
            }
            return Outcome::Failed;
        }
    };
    for l in lines {
        match serde_json::from_str::<Value>(&l) {
            Ok(v) if ctx.json => json_line(&v),
            Ok(v) => println!("{}", show(&v)),
            Err(_) if ctx.json => json_line(&json!({"unparsed": l})),
            Err(_) => println!(
                "(a line that does not parse: run bxctl audit verify) {}",
                Shown(&l, Mode::Line)
            ),
        }
    }
    Outcome::Done
}
