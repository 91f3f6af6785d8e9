//! The leak check's false-positive benchmark: after each kind of secret release, a corpus of
//! ordinary writes and fetches (code, logs, indented JSON, prose, URLs of popular hosts) must be
//! allowed. `cargo bench -p brokerd -- --leak` prints the rate per kind; the brokerd test
//! `false_positives` holds it at zero. Shared by both through `#[path]`.

#![allow(dead_code)]

use serde_json::{Value, json};

/// What a secret root released, by kind: the pieces that came from the root, and the roots'
/// paths that are cut out of them (`run pwd`).
#[derive(Debug)]
pub struct Release {
    pub kind: &'static str,
    pub parts: Vec<String>,
    pub cut: Vec<String>,
}

/// A secret root's path, as `run pwd` prints it.
pub const ROOT: &str = "/srv/box/home/vault";

pub fn releases() -> Vec<Release> {
    let one = |kind, text: &str| Release {
        kind,
        parts: vec![text.to_string()],
        cut: vec![ROOT.to_string()],
    };
    let mut key = String::from("-----BEGIN OPENSSH PRIVATE KEY-----\n");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20 {
        key.push_str(&noise(
            &mut x,
            64,
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
        ));
        key.push('\n');
    }
    key.push_str("-----END OPENSSH PRIVATE KEY-----\n");
    vec![
        one("a password file", "hunter2-Correct-Horse-Battery-Staple\n"),
        one("a PIN", "4711\n"),
        one(
            "an API key",
            "sk_live_51HcXyZaQ9vB2kLmN8pR4tUw7xYz0AbCdEf\n",
        ),
        one("an SSH private key", &key),
        one(
            "an indented JSON credentials file",
            "{\n    \"client_id\": \"8812-qpl2v9b0tj3.apps.example\",\n    \"client_secret\": \
             \"GOCSPX-7hQ2mZr5Kx0vB9nWcT4e\",\n    \"redirect_uris\": [\n        \
             \"http://localhost\"\n    ]\n}\n",
        ),
        one(
            "an env file",
            "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq3Nw8\nDB_PASSWORD=s3cr3t!pass-Qv8\n",
        ),
        one(
            "a file of spaces and zeros",
            &format!("{}\n{}\n", " ".repeat(64), "0".repeat(64)),
        ),
        Release {
            kind: "run pwd in the secret root",
            parts: vec![format!("{ROOT}\n"), String::new()],
            cut: vec![ROOT.to_string()],
        },
        Release {
            kind: "run ls in the secret root",
            parts: vec!["bank.txt\nkeys/\npin.txt\n".to_string(), String::new()],
            cut: vec![ROOT.to_string()],
        },
        one("a file named after a host, listed", "en.wikipedia.org"),
    ]
}

fn noise(x: &mut u64, len: usize, alphabet: &[u8]) -> String {
    (0..len)
        .map(|_| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            alphabet[(*x % alphabet.len() as u64) as usize] as char
        })
        .collect()
}

const CODE: &[&str] = &[
    "fn main() {\n    let args: Vec<String> = std::env::args().collect();\n    for (i, a) in args.iter().enumerate() {\n        println!(\"{i}: {a}\");\n    }\n}\n",
    "def fetch(url, timeout=10):\n    with urllib.request.urlopen(url, timeout=timeout) as r:\n        return r.read().decode('utf-8')\n\n\nif __name__ == '__main__':\n    print(fetch('https://example.org/'))\n",
    "export async function load({ params, fetch }) {\n  const res = await fetch(`/api/items/${params.id}`);\n  if (!res.ok) throw error(404, 'not found');\n  return { item: await res.json() };\n}\n",
    "#include <stdio.h>\n\nint main(void) {\n    for (int i = 0; i < 16; i++) {\n        printf(\"%02x\\n\", i * 17);\n    }\n    return 0;\n}\n",
    "SELECT u.id, u.name, count(o.id) AS orders\n  FROM users u\n  LEFT JOIN orders o ON o.user_id = u.id\n WHERE u.created_at > '2024-01-01'\n GROUP BY u.id, u.name\n ORDER BY orders DESC\n LIMIT 50;\n",
    "[package]\nname = \"notes\"\nversion = \"0.3.1\"\nedition = \"2021\"\n\n[dependencies]\nserde = { version = \"1\", features = [\"derive\"] }\nserde_json = \"1\"\n",
    "server {\n    listen 443 ssl;\n    server_name example.org www.example.org;\n    location / {\n        proxy_pass http://127.0.0.1:8080;\n    }\n}\n",
    "                if (value === undefined || value === null) {\n                    return defaultValue;\n                }\n",
];

const PROSE: &[&str] = &[
    "Buy milk, eggs and bread. Call the bank about the new card before Friday.",
    "Meeting notes: the release moves to next week; Anna takes the migration, Tom the docs.",
    "The train leaves at 07:42 from platform 4 and arrives at 11:15. Seat 47, coach 11.",
    "Recipe: 200 g flour, 2 eggs, 300 ml milk, a pinch of salt. Rest the batter for 30 minutes.",
    "Remember: passwords go in the vault, never in notes. Rotate the router's key in spring.",
];

const URLS: &[&str] = &[
    "https://en.wikipedia.org/wiki/Rust_(programming_language)",
    "https://en.wikipedia.org/wiki/Special:Search?search=hash+function",
    "https://github.com/rust-lang/rust/issues?q=is%3Aissue+is%3Aopen+label%3AC-bug",
    "https://docs.rs/serde_json/latest/serde_json/",
    "https://www.bbc.co.uk/news/technology",
    "https://news.ycombinator.com/item?id=38471822",
    "https://stackoverflow.com/questions/11227809/why-is-processing-a-sorted-array-faster",
    "https://www.google.com/search?q=weather+berlin+tomorrow",
    "https://api.github.com/repos/rust-lang/cargo/releases/latest",
    "https://www.youtube.com/watch?v=dQw4w9WgXcQ",
    "https://developer.mozilla.org/en-US/docs/Web/HTTP/Headers/Location",
    "https://crates.io/api/v1/crates?page=1&per_page=10&q=base64",
    "https://www.reddit.com/r/rust/comments/1b2c3d/",
    "https://duckduckgo.com/?q=%22correct+horse%22+xkcd",
    "https://maps.example.org/?lat=52.5200&lon=13.4050&zoom=14",
];

/// `len` bytes of the corpus's code, over and over: an ordinary large write.
pub fn code(len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        for c in CODE {
            out.push_str(c);
        }
    }
    out.truncate(len);
    out
}

fn logs() -> String {
    let mut out = String::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..120u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let level = ["INFO", "WARN", "DEBUG", "ERROR"][(x % 4) as usize];
        out.push_str(&format!(
            "2024-05-{:02}T{:02}:{:02}:{:02}Z {level} worker[{}] request {} took {} ms\n",
            1 + i % 28,
            (x >> 8) % 24,
            (x >> 16) % 60,
            (x >> 24) % 60,
            1000 + (x >> 32) % 9000,
            noise(&mut x, 8, b"0123456789abcdef"),
            (x >> 40) % 900,
        ));
    }
    out
}

fn indented_json() -> String {
    let v = json!({
        "name": "notes",
        "items": (0..40).map(|i| json!({
            "id": i,
            "title": format!("item number {i}"),
            "tags": ["home", "todo"],
            "done": i % 3 == 0,
            "nested": { "depth": { "more": { "value": null } } },
        })).collect::<Vec<_>>(),
    });
    serde_json::to_string_pretty(&v).unwrap()
}

/// The ordinary calls: each as the leak check reads its arguments (a fetch's URL without the
/// allow-listed part of its host, as `web_fetch` hands it over).
pub fn corpus(view: impl Fn(&str) -> String) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let write = |name: String, content: String| {
        (
            name,
            json!({ "path": "/srv/box/home/notes/out.txt", "content": content }),
        )
    };
    for (i, c) in CODE.iter().enumerate() {
        out.push(write(format!("code {i}"), c.to_string()));
    }
    for (i, p) in PROSE.iter().enumerate() {
        out.push(write(format!("prose {i}"), p.to_string()));
    }
    out.push(write("logs".into(), logs()));
    out.push(write("indented JSON".into(), indented_json()));
    out.push(write(
        "indented text".into(),
        format!("{}x\n", " ".repeat(32)),
    ));
    out.push(write(
        "a write confirmation".into(),
        "wrote 42 bytes to /srv/box/home/vault/pin.txt".into(),
    ));
    out.push(write(
        "run framing".into(),
        "exit code 0\n--- stdout ---\n/srv/box/home/vault\n\n--- stderr ---\n".into(),
    ));
    for u in URLS {
        out.push((format!("fetch {u}"), json!({ "url": view(u) })));
    }
    out
}
