//! `bxctl audit verify` (brokerd verifies its chain and reports) and `bxctl audit tail` (the last
//! records, read from the chain file: reading needs brokerd's user or root on the device).

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use bxcore::client::{self, ClientError};
use bxcore::visible::{Mode, Shown, escape};
use bxcore::{AuditHead, Message};
use serde_json::{Value, json};

use crate::context::Context;
use crate::done::{Done, Ended, Failure};
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
pub fn verify(ctx: &Context, head: Option<&str>) -> Ended {
    let msg = match head.map(|h| (h, parse_head(h))) {
        None => Message::AuditVerify {},
        Some((_, Some(h))) => Message::AuditVerifyHead(h),
        Some((h, None)) => {
            return Err(Failure::failed(format!(
                "bxctl: --head {} is not SEQ:HASH (a record number, a colon, 64 lowercase hex \
                 digits), as the journal's `audit chain head` line gives it",
                Shown(h, Mode::Line)
            )));
        }
    };
    let what = "cannot verify the audit chain";
    match client::call(&ctx.admin, ctx.timeout, 1, msg, |_| {}) {
        Ok(Message::AuditReport(r)) => {
            if ctx.json {
                json_line(&r);
            } else {
                println!("records: {}", r.records);
                println!("head: {}", r.head);
                println!("{}", Shown(&r.detail, Mode::Line));
            }
            // The report says how the chain is broken; nothing more to say.
            if r.ok { Ok(Done) } else { Err(Failure::said()) }
        }
        Ok(other) => Err(failed(ctx, what, &ClientError::Unexpected(other.kind()))),
        Err(e) => Err(failed(ctx, what, &e)),
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

/// A record's `time` (Unix milliseconds) as RFC 3339 in UTC; anything else as it is.
fn time(v: &Value) -> String {
    match v["time"].as_u64() {
        Some(ms) => bxcore::Timestamp(ms).utc_text(),
        None => field(v, "time"),
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
        time(v),
        field(v, "event"),
        field(v, "session"),
        field(v, "call"),
        field(v, "tool"),
        detail
    );
    escape(&line, Mode::Line).into_owned()
}

/// How often `audit tail -f` looks for new records.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

fn print_record(ctx: &Context, l: &str) {
    match serde_json::from_str::<Value>(l) {
        Ok(v) if ctx.json => json_line(&v),
        Ok(v) => println!("{}", show(&v)),
        Err(_) if ctx.json => json_line(&json!({"unparsed": l})),
        Err(_) => println!(
            "(a line that does not parse: run bxctl audit verify) {}",
            Shown(l, Mode::Line)
        ),
    }
}

/// Print every whole record appended to `path` after byte `from`, for ever (until Ctrl-C). A
/// chain file that is replaced or cut shorter is read again from its start.
fn follow(ctx: &Context, path: &Path, mut from: u64) -> Ended {
    use std::os::unix::fs::MetadataExt;
    let mut inode = std::fs::metadata(path).map(|m| m.ino()).ok();
    let mut partial = Vec::new();
    loop {
        std::thread::sleep(FOLLOW_EVERY);
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        if Some(meta.ino()) != inode || meta.len() < from {
            inode = Some(meta.ino());
            from = 0;
            partial.clear();
        }
        if meta.len() == from {
            continue;
        }
        let Ok(mut f) = std::fs::File::open(path) else {
            continue;
        };
        if f.seek(SeekFrom::Start(from)).is_err() {
            continue;
        }
        let mut more = Vec::new();
        if f.read_to_end(&mut more).is_err() {
            continue;
        }
        from += more.len() as u64;
        partial.extend_from_slice(&more);
        // Only whole lines are records; a tail without its newline waits for the rest.
        while let Some(i) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=i).collect();
            print_record(ctx, String::from_utf8_lossy(&line).trim_end());
        }
        use std::io::Write as _;
        if std::io::stdout().flush().is_err() {
            return Ok(Done);
        }
    }
}

/// `bxctl audit tail [-n N] [-f]`.
pub fn tail(ctx: &Context, n: usize, chain: Option<&Path>, follow_on: bool) -> Ended {
    let path = chain
        .map(Path::to_path_buf)
        .unwrap_or_else(|| ctx.home.join("broker/audit/chain.jsonl"));
    let lines = last_lines(&path, n).map_err(|e| {
        Failure::failed(format!(
            "bxctl: cannot read the audit chain {}: {e} (on the device it is brokerd's: use sudo)",
            path.display()
        ))
        .json_if(
            ctx.json,
            json!({"error": {"code": "failed", "detail": format!("{}: {e}", path.display())}}),
        )
    })?;
    for l in &lines {
        print_record(ctx, l);
    }
    if follow_on {
        // From the end as it is now (brokerd appends whole records, one write each).
        let end = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        return follow(ctx, &path, end);
    }
    Ok(Done)
}
