//! The Matrix channel end to end: the real daemons of a dev box with channeld, against a real
//! Synapse on loopback (`.ci/synapse-up`: `SYNAPSE_URL`, `SYNAPSE_SHARED_SECRET`,
//! `SYNAPSE_REGISTER`, `SYNAPSE_VENV`; a skip without them, which fails under CI=true).
//!
//! Every test registers users of its own (the owner, a stranger, the bot) with the shared
//! secret, so one server serves every test at once.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use boxmaker_e2e::{DevBox, said};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);

/// The server the tests register their users on.
#[derive(Debug, Clone)]
struct Synapse {
    url: String,
    secret: String,
    register: String,
}

fn synapse() -> Option<Synapse> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (
        get("SYNAPSE_URL"),
        get("SYNAPSE_SHARED_SECRET"),
        get("SYNAPSE_REGISTER"),
    ) {
        (Some(url), Some(secret), Some(register)) => Some(Synapse {
            url,
            secret,
            register,
        }),
        _ => {
            bxtest::skip(
                "SYNAPSE_URL is not set: run `eval \"$(.ci/synapse-up)\"` for a Synapse on loopback",
            );
            None
        }
    }
}

/// One account on the server.
#[derive(Debug, Clone)]
struct User {
    id: String,
    token: String,
    url: String,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .new_agent()
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl Synapse {
    /// A new user `name-<unique>`, registered with the shared secret, and logged in.
    fn user(&self, name: &str) -> User {
        let local = bxtest::unique_name(name).to_lowercase().replace('_', "-");
        let password = format!("pw-{local}");
        let out = bxtest::run(
            Command::new(&self.register).args([
                "-u",
                &local,
                "-p",
                &password,
                "--no-admin",
                "-k",
                &self.secret,
                &self.url,
            ]),
            "register_new_matrix_user",
            WAIT,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "register {local}: {}", said(&out));
        let body = json!({
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": local},
            "password": password,
        });
        let mut resp = agent()
            .post(format!("{}/_matrix/client/v3/login", self.url))
            .header("content-type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap();
        // bounded: the agent's global timeout (60 s) ends the request and its body.
        let text = resp.body_mut().read_to_string().unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        User {
            id: v["user_id"].as_str().unwrap().to_string(),
            token: v["access_token"].as_str().unwrap().to_string(),
            url: self.url.clone(),
        }
    }
}

impl User {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/_matrix/client/v3{path}", self.url);
        let auth = format!("Bearer {}", self.token);
        let bytes = body.unwrap_or(json!({})).to_string();
        let resp = match method {
            "GET" => agent().get(&url).header("authorization", &auth).call(),
            "PUT" => agent()
                .put(&url)
                .header("authorization", &auth)
                .header("content-type", "application/json")
                .send(bytes.as_bytes()),
            _ => agent()
                .post(&url)
                .header("authorization", &auth)
                .header("content-type", "application/json")
                .send(bytes.as_bytes()),
        };
        let mut resp = resp.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        // bounded: an HTTP status, not a child's; the agent's global timeout ends the request.
        let status = resp.status().as_u16();
        // bounded: the agent's global timeout (60 s) ends the body's read too.
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert!(status < 300, "{method} {path}: HTTP {status}: {v}");
        v
    }

    fn create_room(&self, invite: &[&User]) -> String {
        let ids: Vec<&str> = invite.iter().map(|u| u.id.as_str()).collect();
        let v = self.call(
            "POST",
            "/createRoom",
            Some(json!({"preset": "private_chat", "invite": ids})),
        );
        v["room_id"].as_str().unwrap().to_string()
    }

    fn join(&self, room: &str) {
        self.call("POST", &format!("/join/{}", enc(room)), None);
    }

    fn send(&self, room: &str, content: Value) -> String {
        let txn = bxtest::unique_name("t");
        let v = self.call(
            "PUT",
            &format!(
                "/rooms/{}/send/{}/{txn}",
                enc(room),
                if content.get("m.relates_to").and_then(|r| r.get("rel_type"))
                    == Some(&json!("m.annotation"))
                {
                    "m.reaction"
                } else {
                    "m.room.message"
                }
            ),
            Some(content),
        );
        v["event_id"].as_str().unwrap().to_string()
    }

    fn say(&self, room: &str, text: &str) -> String {
        self.send(room, json!({"msgtype": "m.text", "body": text}))
    }

    fn react(&self, room: &str, event: &str, key: &str) -> String {
        self.send(
            room,
            json!({"m.relates_to": {"rel_type": "m.annotation", "event_id": event, "key": key}}),
        )
    }

    /// The room's events, oldest first (the last 200).
    fn events(&self, room: &str) -> Vec<Value> {
        let v = self.call(
            "GET",
            &format!("/rooms/{}/messages?dir=b&limit=200", enc(room)),
            None,
        );
        let mut e: Vec<Value> = v["chunk"].as_array().cloned().unwrap_or_default();
        e.reverse();
        e
    }

    fn membership(&self, room: &str, user: &str) -> Option<String> {
        let v = self.call("GET", &format!("/rooms/{}/members", enc(room)), None);
        v["chunk"]
            .as_array()?
            .iter()
            .find(|e| e["state_key"] == user)
            .and_then(|e| e["content"]["membership"].as_str().map(str::to_string))
    }
}

/// The messages `from` sent in `room` that are not edits.
fn messages_of(events: &[Value], from: &str) -> Vec<Value> {
    events
        .iter()
        .filter(|e| {
            e["sender"] == from
                && e["type"] == "m.room.message"
                && e["content"]["m.relates_to"]["rel_type"] != "m.replace"
        })
        .cloned()
        .collect()
}

/// The text `event` shows now: its last edit's, or its own.
fn shown_now(events: &[Value], event: &Value) -> String {
    let id = &event["event_id"];
    events
        .iter()
        .rev()
        .find(|e| {
            e["content"]["m.relates_to"]["rel_type"] == "m.replace"
                && e["content"]["m.relates_to"]["event_id"] == *id
        })
        .map(|e| e["content"]["m.new_content"]["body"].clone())
        .unwrap_or_else(|| event["content"]["body"].clone())
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn edits_of(events: &[Value], event: &Value) -> usize {
    events
        .iter()
        .filter(|e| {
            e["content"]["m.relates_to"]["rel_type"] == "m.replace"
                && e["content"]["m.relates_to"]["event_id"] == event["event_id"]
        })
        .count()
}

/// A box with channeld: the bot's token in a 0600 file beside the home, `[matrix]` naming the
/// owner and `rooms`, the model's `script`.
struct Channel {
    dev: DevBox,
    bot: User,
    owner: User,
}

fn channel_box(
    hs: &str,
    bot: User,
    owner: User,
    rooms: &[&str],
    script: &str,
    brokerd_extra: Option<&str>,
) -> Channel {
    let dev = DevBox::new();
    let token = dev.beside("matrix-token");
    fs::write(&token, format!("{}\n", bot.token)).unwrap();
    fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
    let script_file = dev.beside("script.toml");
    fs::write(&script_file, script).unwrap();
    let matrix = dev.beside("matrix.toml");
    let rooms: Vec<String> = rooms.iter().map(|r| format!("{r:?}")).collect();
    fs::write(
        &matrix,
        format!(
            "[matrix]\nhomeserver = {hs:?}\nuser = {:?}\ntoken_file = {:?}\nowners = [{:?}]\n\
             rooms = [{}]\n[limits]\nedit_interval_ms = 100\nmax_backoff_ms = 2000\n\
             sync_timeout_ms = 2000\n",
            bot.id,
            token.display().to_string(),
            owner.id,
            rooms.join(", ")
        ),
    )
    .unwrap();
    let script_arg = script_file.display().to_string();
    let matrix_arg = matrix.display().to_string();
    if let Some(extra) = brokerd_extra {
        // Made, stopped, the broker's config added to, and up again as it was made.
        dev.up(&["--script", &script_arg, "--matrix", &matrix_arg]);
        let out = dev.down();
        assert!(out.status.success(), "{}", said(&out));
        let cfg = dev.home().join("etc/brokerd.toml");
        let mut text = fs::read_to_string(&cfg).unwrap();
        text.push_str(extra);
        fs::write(&cfg, text).unwrap();
        dev.up(&[]);
    } else {
        dev.up(&["--script", &script_arg, "--matrix", &matrix_arg]);
    }
    Channel { dev, bot, owner }
}

impl Channel {
    fn log(&self, daemon: &str) -> String {
        fs::read_to_string(self.dev.home().join(format!("logs/{daemon}.log"))).unwrap_or_default()
    }

    /// Wait for the bot to be in `room`.
    fn wait_joined(&self, room: &str) {
        bxtest::wait_for("the bot to join the room", WAIT, || {
            self.owner.membership(room, &self.bot.id).as_deref() == Some("join")
        });
    }

    /// Pair the owner in `room` through `bxctl channel pair`.
    fn pair(&self, room: &str) {
        let out = self
            .dev
            .bxctl(&["channel", "pair", "--room", room, "--json"]);
        assert!(out.status.success(), "pair: {}", said(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let code = v["code"].as_str().unwrap().to_string();
        assert!(code.starts_with("pair-"), "{v}");
        self.owner.say(room, &code);
        bxtest::wait_for("the pairing to be confirmed", WAIT, || {
            messages_of(&self.owner.events(room), &self.bot.id)
                .iter()
                .any(|m| {
                    m["content"]["body"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with("Paired:")
                })
        });
    }

    /// The session log of `room`'s session.
    fn session_log(&self, room: &str) -> String {
        let session = session_of(room);
        fs::read_to_string(
            self.dev
                .home()
                .join(format!("loop/sessions/{session}.jsonl")),
        )
        .unwrap_or_default()
    }

    /// How many turns the owner's text `text` made in `room`'s session.
    fn turns_of(&self, room: &str, text: &str) -> usize {
        self.session_log(room)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["type"] == "user" && r["text"] == text)
            .count()
    }
}

/// channeld's name for the session of `room`.
fn session_of(room: &str) -> String {
    use std::fmt::Write;
    let digest = sha256(room.as_bytes());
    let mut s = String::from("matrix-");
    for b in &digest[..8] {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn sha256(b: &[u8]) -> Vec<u8> {
    // The session's name only; sha2 is in the tree through bxcore's canonical digests.
    let hex = bxcore::canonical::sha256_hex(b);
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// A box answering with [`ANSWER_SCRIPT`], its bot joined to a room of the owner's (not yet
/// paired).
fn answering_box(hs: &Synapse) -> (Channel, String) {
    let (bot, owner) = (hs.user("bot"), hs.user("owner"));
    let room = owner.create_room(&[&bot]);
    let c = channel_box(&hs.url, bot, owner, &[&room], ANSWER_SCRIPT, None);
    c.wait_joined(&room);
    (c, room)
}

const ANSWER_SCRIPT: &str = r#"
[[rule]]
after = "user"
text = "Here is **your** answer, streamed word by word, with @room and <b>no HTML</b> and [a link](https://example.org/x) in it."
"#;

#[test]
fn the_owners_message_is_a_turn_answered_in_place_and_a_strangers_message_and_invite_do_nothing() {
    let Some(hs) = synapse() else { return };
    let (bot, owner, stranger) = (hs.user("bot"), hs.user("owner"), hs.user("stranger"));
    let room = owner.create_room(&[&bot, &stranger]);
    stranger.join(&room);
    let c = channel_box(
        &hs.url,
        bot.clone(),
        owner.clone(),
        &[&room],
        ANSWER_SCRIPT,
        None,
    );
    c.wait_joined(&room);

    // Before pairing, even the configured owner's message is not a turn.
    owner.say(&room, "before pairing");
    c.pair(&room);
    stranger.say(&room, "a stranger says hello");
    owner.say(&room, "what do you say?");
    bxtest::wait_for("the answer, edited in place to its end", WAIT, || {
        let events = owner.events(&room);
        messages_of(&events, &bot.id)
            .iter()
            .any(|m| shown_now(&events, m).contains("in it."))
    });
    let events = owner.events(&room);
    let answer = messages_of(&events, &bot.id)
        .into_iter()
        .find(|m| shown_now(&events, m).contains("in it."))
        .unwrap();
    assert!(
        edits_of(&events, &answer) >= 1,
        "the answer was never edited"
    );
    let text = shown_now(&events, &answer);
    assert!(text.contains("a link (https://example.org/x)"), "{text}");
    assert!(!text.contains("@room"), "{text}");
    let last = events
        .iter()
        .rev()
        .find(|e| e["content"]["m.relates_to"]["event_id"] == answer["event_id"])
        .unwrap();
    let html = last["content"]["m.new_content"]["formatted_body"]
        .as_str()
        .unwrap();
    assert!(html.contains("&lt;b&gt;no HTML&lt;/b&gt;"), "{html}");
    assert!(!html.contains("<a"), "{html}");
    assert_eq!(last["content"]["m.new_content"]["m.mentions"], json!({}));

    // One turn only: the owner's; neither the stranger's message nor the one before pairing.
    assert_eq!(
        c.turns_of(&room, "what do you say?"),
        1,
        "{}",
        c.session_log(&room)
    );
    assert_eq!(c.turns_of(&room, "a stranger says hello"), 0);
    assert_eq!(c.turns_of(&room, "before pairing"), 0);
    assert!(
        c.log("channeld").contains("channel-stranger-ignored"),
        "{}",
        c.log("channeld")
    );

    // A stranger's invite to a room of their own is refused.
    let theirs = stranger.create_room(&[&bot]);
    bxtest::wait_for("the stranger's invite to be refused", WAIT, || {
        stranger.membership(&theirs, &bot.id).as_deref() == Some("leave")
    });
    assert!(c.log("channeld").contains("channel-invite-refused"));

    // The token is in no log, no command line and no environment.
    assert_no_token(&c);
    let status = c.dev.bxctl(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("channel: Matrix"), "{text}");
    assert!(!text.contains(&bot.token));
}

fn assert_no_token(c: &Channel) {
    let pid = c.dev.pid("channeld").expect("channeld runs");
    for what in ["cmdline", "environ"] {
        let bytes = fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&c.bot.token),
            "the token is in channeld's {what}"
        );
    }
    for entry in fs::read_dir(c.dev.home().join("logs")).unwrap() {
        let p = entry.unwrap().path();
        let text = fs::read_to_string(&p).unwrap_or_default();
        assert!(
            !text.contains(&c.bot.token),
            "the token is in {}",
            p.display()
        );
    }
    for entry in fs::read_dir(c.dev.home().join("etc")).unwrap() {
        let p = entry.unwrap().path();
        let text = fs::read_to_string(&p).unwrap_or_default();
        assert!(
            !text.contains(&c.bot.token),
            "the token is in {}",
            p.display()
        );
    }
}

/// The session reads untrusted mail, then writes a note: the broker asks the owner. Then the
/// write's result (or the next message) is answered, and any later text.
const APPROVAL_SCRIPT: &str = r#"
[[step]]
after = "user"
text = "Let me read the mail first."
tool_calls = [{ tool = "workspace_read", args = { path = "@WORKSPACE@/inbox/meeting.txt" } }]

[[step]]
after = "tool"
text = "Now I write the note."
tool_calls = [{ tool = "workspace_write", args = { path = "@WORKSPACE@/notes/friday.txt", content = "the meeting is on Friday" } }]

[[step]]
text = "Finished: {last_tool}"

[[rule]]
text = "Hello back."
"#;

fn approval_script() -> String {
    APPROVAL_SCRIPT.to_string()
}

/// What the owner asks for in the approval tests.
const NOTE: &str = "please write a note about the meeting";

/// A box on `hs` with its owner paired in a room of their own, whose turn for [`NOTE`] waits for
/// the owner's approval: the box, the room, and the message that asks.
fn turn_waiting_for_approval(
    hs: &Synapse,
    brokerd_extra: Option<&str>,
) -> (Channel, String, Value) {
    let (bot, owner) = (hs.user("bot"), hs.user("owner"));
    let room = owner.create_room(&[&bot]);
    let c = channel_box(
        &hs.url,
        bot.clone(),
        owner.clone(),
        &[&room],
        &approval_script(),
        brokerd_extra,
    );
    c.wait_joined(&room);
    c.pair(&room);
    owner.say(&room, NOTE);
    let asked = approval_message(&owner, &bot, &room, 0);
    (c, room, asked)
}

/// The approval message the bot posted in `room`, once there.
fn approval_message(owner: &User, bot: &User, room: &str, nth: usize) -> Value {
    let mut found = None;
    bxtest::wait_for("the approval to be asked in the room", WAIT, || {
        let asked: Vec<Value> = messages_of(&owner.events(room), &bot.id)
            .into_iter()
            .filter(|m| {
                m["content"]["body"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("Approval needed")
            })
            .collect();
        found = asked.get(nth).cloned();
        found.is_some()
    });
    found.unwrap()
}

fn notices_with(owner: &User, bot: &User, room: &str, text: &str) -> usize {
    messages_of(&owner.events(room), &bot.id)
        .iter()
        .filter(|m| m["content"]["body"].as_str().unwrap_or("").contains(text))
        .count()
}

#[test]
fn an_approval_is_asked_in_its_room_only_and_answered_by_the_owners_reaction_alone_once() {
    let Some(hs) = synapse() else { return };
    let (bot, owner, stranger) = (hs.user("bot"), hs.user("owner"), hs.user("stranger"));
    let room = owner.create_room(&[&bot, &stranger]);
    let other = owner.create_room(&[&bot]);
    stranger.join(&room);
    let c = channel_box(
        &hs.url,
        bot.clone(),
        owner.clone(),
        &[&room, &other],
        &approval_script(),
        None,
    );
    c.wait_joined(&room);
    c.wait_joined(&other);
    c.pair(&room);
    owner.say(&room, NOTE);
    let asked = approval_message(&owner, &bot, &room, 0);
    let body = asked["content"]["body"].as_str().unwrap();
    assert!(body.contains("Tool: workspace_write"), "{body}");
    assert!(body.contains("friday.txt"), "{body}");
    assert!(body.contains("Expires:"), "{body}");
    assert!(body.contains(&session_of(&room)), "{body}");
    assert_eq!(asked["content"]["m.mentions"], json!({}));
    let id = asked["event_id"].as_str().unwrap();

    // A stranger's ✅ decides nothing: the owner's answer is what the chain records.
    stranger.react(&room, id, "✅");
    owner.react(&room, id, "✅");
    bxtest::wait_for("the owner's approval to be acknowledged", WAIT, || {
        notices_with(&owner, &bot, &room, &format!("by {}", owner.id)) == 1
    });
    assert_eq!(notices_with(&owner, &bot, &room, &stranger.id), 0);
    bxtest::wait_for("the turn to finish after the write", WAIT, || {
        let events = owner.events(&room);
        messages_of(&events, &bot.id)
            .iter()
            .any(|m| shown_now(&events, m).contains("Finished:"))
    });
    let written = fs::read_to_string(c.dev.home().join("workspace/notes/friday.txt")).unwrap();
    assert_eq!(written, "the meeting is on Friday");
    let chain = audit_chain(&c);
    assert!(
        chain.contains(&format!("\"approver\":\"{}\"", owner.id)),
        "the chain does not name the approver: {chain}"
    );
    assert!(!chain.contains(&stranger.id));

    // Asked in its room only.
    assert_eq!(notices_with(&owner, &bot, &other, "Approval needed"), 0);

    // The same answer again, or the other answer, is refused: the approval was taken once.
    owner.react(&room, id, "❌");
    bxtest::wait_for("the second answer to be refused", WAIT, || {
        notices_with(
            &owner,
            &bot,
            &room,
            "Refused: that approval was answered already",
        ) == 1
    });
    assert_eq!(notices_with(&owner, &bot, &room, "Denied ["), 0);
}

fn audit_chain(c: &Channel) -> String {
    let dir = c.dev.home().join("broker/audit");
    let mut all = String::new();
    for e in fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            all.push_str(&fs::read_to_string(&p).unwrap_or_default());
        }
    }
    all
}

#[test]
fn an_answer_after_the_approval_expired_is_refused_and_nothing_runs() {
    let Some(hs) = synapse() else { return };
    let (c, room, asked) = turn_waiting_for_approval(&hs, Some("\n[approvals]\nttl_ms = 3000\n"));
    let (bot, owner) = (&c.bot, &c.owner);
    // Past its expiry (3 s), seen in the turn's answer: the call was denied by then.
    let start = Instant::now();
    bxtest::wait_for("the approval to expire", WAIT, || {
        let events = owner.events(&room);
        start.elapsed() > Duration::from_secs(3)
            && messages_of(&events, &bot.id)
                .iter()
                .any(|m| shown_now(&events, m).contains("denied"))
    });
    owner.react(&room, asked["event_id"].as_str().unwrap(), "✅");
    bxtest::wait_for("the late answer to be refused", WAIT, || {
        notices_with(owner, bot, &room, "expired before this answer") == 1
    });
    assert!(!c.dev.home().join("workspace/notes/friday.txt").exists());
    assert!(!audit_chain(&c).contains("\"approver\""));
}

#[test]
fn killing_channeld_mid_turn_loses_and_repeats_nothing() {
    let Some(hs) = synapse() else { return };
    // Mid-turn: the turn waits for the owner.
    let (c, room, _) = turn_waiting_for_approval(&hs, None);
    let (bot, owner, text) = (&c.bot, &c.owner, NOTE);
    let pid = c.dev.pid("channeld").unwrap();
    kill9(pid);
    let up = c.dev.up(&[]);
    assert!(up.status.success(), "{}", said(&up));
    bxtest::wait_for("the cut-short note after the restart", WAIT, || {
        notices_with(owner, bot, &room, "was cut short") == 1
    });
    // The message was a turn once, and is not again after the restart.
    owner.say(&room, "hello again");
    bxtest::wait_for("the next turn", WAIT, || {
        c.turns_of(&room, "hello again") == 1
    });
    assert_eq!(c.turns_of(&room, text), 1, "{}", c.session_log(&room));
    assert_no_token(&c);
}

#[test]
fn a_message_handed_off_just_before_channeld_stopped_runs_once_and_the_room_is_told() {
    let Some(hs) = synapse() else { return };
    let (c, room) = answering_box(&hs);
    c.pair(&room);
    bxtest::wait_for("the pairing to be kept", WAIT, || {
        fs::read_to_string(c.dev.home().join("channel/state.json"))
            .is_ok_and(|s| s.contains(&c.owner.id))
    });
    // The window: channeld wrote the message's frame to loopd and stopped before it kept the
    // event as seen. Replayed exactly: channeld is stopped before it sees the message, the frame
    // it would have written is written for it (as its user, on its socket), and the turn runs.
    kill9(c.dev.pid("channeld").unwrap());
    let text = "handed off once";
    let event = c.owner.say(&room, text);
    let bridge = bxcore::layout::BRIDGE.path(c.dev.home());
    let frames = c.dev.as_client(&bxcore::layout::BRIDGE, || {
        let msg = bxcore::Message::ChannelTurn(bxcore::ChannelTurn {
            session: bxcore::SessionId::new(session_of(&room)).unwrap(),
            resume: false,
            text: text.to_string(),
            key: bxcore::TurnKey::new(event.clone()).unwrap(),
        });
        let mut ex = bxcore::client::Exchange::start(&bridge, WAIT, 1, msg).unwrap();
        let mut frames = Vec::new();
        loop {
            let env = ex.next_frame().unwrap();
            let last = env.last;
            frames.push(env);
            if last {
                return frames;
            }
        }
    });
    assert!(
        matches!(frames.last().unwrap().msg, bxcore::Message::TurnDone(_)),
        "{frames:?}"
    );
    assert_eq!(c.turns_of(&room, text), 1);
    // Started again, channeld finds the message not seen and hands it off again: loopd knows its
    // key, runs nothing, and the room is told why.
    let up = c.dev.up(&[]);
    assert!(up.status.success(), "{}", said(&up));
    bxtest::wait_for(
        "the note that the message ran before the restart",
        WAIT,
        || {
            let events = c.owner.events(&room);
            messages_of(&events, &c.bot.id)
                .iter()
                .any(|m| shown_now(&events, m).contains("does not run again"))
        },
    );
    assert_eq!(c.turns_of(&room, text), 1, "{}", c.session_log(&room));
    assert!(
        c.log("loopd")
            .contains("see docs/runbook.md#channel-turn-repeated"),
        "{}",
        c.log("loopd")
    );
    // The room's next message is a turn as ever.
    c.owner.say(&room, "and the next one");
    bxtest::wait_for("the next turn", WAIT, || {
        c.turns_of(&room, "and the next one") == 1
    });
}

fn kill9(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    bxtest::wait_for("the killed process to end", WAIT, || {
        fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    });
}

/// A Synapse of this test's own, from the same virtualenv, in a state directory of its own: it
/// is killed and started again while a turn waits, and the shared one is never touched.
struct OwnSynapse {
    state: tempfile::TempDir,
    up: PathBuf,
}

impl OwnSynapse {
    fn start() -> Option<(OwnSynapse, Synapse)> {
        if std::env::var_os("SYNAPSE_VENV").is_none() {
            bxtest::skip("SYNAPSE_VENV is not set: run `eval \"$(.ci/synapse-up)\"`");
            return None;
        }
        let state = tempfile::Builder::new()
            .prefix("bx-synapse-")
            .tempdir()
            .unwrap();
        let up = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/synapse-up");
        let s = OwnSynapse { state, up };
        let env = s.run_up();
        Some((s, env))
    }

    fn run_up(&self) -> Synapse {
        let out = bxtest::run(
            Command::new("bash")
                .arg(&self.up)
                .env("SYNAPSE_STATE", self.state.path()),
            "synapse-up",
            WAIT,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "synapse-up: {}", said(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("export {k}=")))
                .unwrap()
                .to_string()
        };
        Synapse {
            url: get("SYNAPSE_URL"),
            secret: get("SYNAPSE_SHARED_SECRET"),
            register: get("SYNAPSE_REGISTER"),
        }
    }

    fn pid(&self) -> Option<u32> {
        fs::read_to_string(self.state.path().join("synapse.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn kill(&self) {
        if let Some(pid) = self.pid() {
            kill9(pid);
            let _ = fs::remove_file(self.state.path().join("synapse.pid"));
        }
    }
}

impl Drop for OwnSynapse {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn killing_synapse_mid_turn_loses_and_repeats_nothing_and_status_says_why() {
    let Some((own, hs)) = OwnSynapse::start() else {
        return;
    };
    let (c, room, asked) = turn_waiting_for_approval(&hs, None);
    let (bot, owner, text) = (&c.bot, &c.owner, NOTE);
    own.kill();
    bxtest::wait_for("the status to say the homeserver is down", WAIT, || {
        let out = c.dev.bxctl(&["channel", "status"]);
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        !out.status.success() && s.contains("see docs/runbook.md#matrix-unreachable")
    });
    assert!(c.log("channeld").contains("runbook.md#matrix-unreachable"));
    own.run_up();
    owner.react(&room, asked["event_id"].as_str().unwrap(), "✅");
    bxtest::wait_for(
        "the turn to finish once the homeserver is back",
        WAIT,
        || {
            let events = owner.events(&room);
            messages_of(&events, &bot.id)
                .iter()
                .any(|m| shown_now(&events, m).contains("Finished:"))
        },
    );
    let events = owner.events(&room);
    let answers = messages_of(&events, &bot.id)
        .iter()
        .filter(|m| m["content"]["msgtype"] == "m.text")
        .count();
    assert_eq!(answers, 1, "one answer, never a second: {events:?}");
    assert_eq!(c.turns_of(&room, text), 1, "{}", c.session_log(&room));
    assert_eq!(notices_with(owner, bot, &room, "Approval needed"), 1);
}

#[test]
fn a_token_the_homeserver_refuses_is_logged_with_its_pointer_and_shown_nowhere() {
    let Some(hs) = synapse() else { return };
    let (bot, owner) = (hs.user("bot"), hs.user("owner"));
    let room = owner.create_room(&[&bot]);
    let mut revoked = bot.clone();
    revoked.token = "syt_Ym90_revokedrevokedrevoked_0a1b2c".to_string();
    let c = channel_box(&hs.url, revoked, owner, &[&room], ANSWER_SCRIPT, None);
    bxtest::wait_for("the refusal with its pointer", WAIT, || {
        c.log("channeld")
            .contains("see docs/runbook.md#matrix-auth-refused")
    });
    // The bot never joined, and the refused token is in no log, command line or environment.
    assert_ne!(c.owner.membership(&room, &bot.id).as_deref(), Some("join"));
    assert_no_token(&c);
}

#[test]
fn a_damaged_channel_state_stops_channeld_with_its_pointer_and_is_left_as_it_was() {
    let Some(hs) = synapse() else { return };
    let (c, _room) = answering_box(&hs);
    let down = c.dev.down();
    assert!(down.status.success(), "{}", said(&down));
    let state = c.dev.home().join("channel/state.json");
    let damaged = b"{\"since\":\"s1_2_3\",\"rooms\":{";
    fs::write(&state, damaged).unwrap();
    let up = c.dev.try_up(&[]);
    let told = format!("{}{}", said(&up), c.log("channeld"));
    assert!(
        told.contains("see docs/runbook.md#channel-state-damaged"),
        "{told}"
    );
    assert_eq!(fs::read(&state).unwrap(), damaged);
}

#[test]
fn a_message_while_loopd_is_down_waits_with_its_pointer_and_is_one_turn_when_it_is_back() {
    let Some(hs) = synapse() else { return };
    let (c, room) = answering_box(&hs);
    c.pair(&room);
    kill9(c.dev.pid("loopd").unwrap());
    c.owner.say(&room, "while the loop is down");
    bxtest::wait_for("the outage line with its pointer", WAIT, || {
        c.log("channeld")
            .contains("see docs/runbook.md#channel-loopd-unavailable")
    });
    let up = c.dev.up(&[]);
    assert!(up.status.success(), "{}", said(&up));
    bxtest::wait_for("the waiting message to be one turn", WAIT, || {
        c.turns_of(&room, "while the loop is down") == 1
    });
}

#[test]
fn a_decision_brokerd_cannot_take_is_logged_with_its_pointer_and_the_owner_told_where_to_decide() {
    let Some(hs) = synapse() else { return };
    let (c, room, asked) = turn_waiting_for_approval(&hs, None);
    kill9(c.dev.pid("brokerd").unwrap());
    c.owner
        .react(&room, asked["event_id"].as_str().unwrap(), "✅");
    bxtest::wait_for("the owner to be told where to decide", WAIT, || {
        notices_with(&c.owner, &c.bot, &room, "decide it with bxctl approvals") == 1
    });
    assert!(
        c.log("channeld")
            .contains("see docs/runbook.md#channel-approval-failed"),
        "{}",
        c.log("channeld")
    );
    assert!(!c.dev.home().join("workspace/notes/friday.txt").exists());
}
