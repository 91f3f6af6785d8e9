//! The client against a real Honcho v3 server (`$HONCHO_URL`; `.ci/run` brings one up). Each
//! test works in a workspace of its own, so tests run in parallel and leave nothing another
//! test could see.

use honcho::{
    BaseUrl, Client, Deletion, Error, Id, MAX_BATCH, MAX_CONTENT_CHARS, MessageKey, NewMessage,
    Options, PeerConfig, Session, split_content,
};
use serde_json::{Map, Value, json};

fn client() -> Option<Client> {
    let url = bxtest::honcho_url()?;
    let base = BaseUrl::parse(&url).expect("HONCHO_URL is a base URL");
    Some(Client::new(base, None, Options::default()))
}

fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

/// A fresh workspace for one test.
fn workspace(c: &Client, test: &str) -> Id {
    let w = id(&bxtest::unique_name(test));
    c.workspace(&w, Map::new()).expect("the workspace is made");
    w
}

fn meta(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

const QUIET: PeerConfig = PeerConfig {
    observe_me: false,
    observe_others: false,
};

fn session(c: &Client, w: &Id, s: &str) -> Session {
    c.create_session(
        w,
        &id(s),
        meta(json!({"box_session": s, "route": "main"})),
        &[(id("owner"), QUIET), (id("box"), QUIET)],
    )
    .expect("the session is made")
}

fn msg(turn: u64, part: u32, peer: &str, text: &str) -> NewMessage {
    NewMessage {
        peer: id(peer),
        content: text.into(),
        key: MessageKey { turn, part },
        metadata: meta(json!({"box_session": "s", "class": "private"})),
    }
}

fn texts(c: &Client, s: &Session) -> Vec<String> {
    c.messages(s, None)
        .unwrap()
        .into_iter()
        .map(|m| m.content)
        .collect()
}

#[test]
fn the_server_answers_its_health_check() {
    let Some(c) = client() else { return };
    c.health().unwrap();
}

#[test]
fn a_workspace_is_made_once_and_found_again_with_its_metadata() {
    let Some(c) = client() else { return };
    let w = id(&bxtest::unique_name("ws"));
    let made = c.workspace(&w, meta(json!({"box": "dev"}))).unwrap();
    assert_eq!(made.id, w);
    assert_eq!(made.metadata["box"], "dev");
    let again = c.workspace(&w, Map::new()).unwrap();
    assert_eq!(again.id, w);
}

#[test]
fn a_session_is_created_explicitly_with_its_metadata_and_found_by_it() {
    let Some(c) = client() else { return };
    let w = workspace(&c, "session");
    let s = session(&c, &w, "s1");
    assert_eq!(s.id().as_str(), "s1");
    assert_eq!(s.metadata()["route"], "main");
    c.create_session(&w, &id("s2"), meta(json!({"route": "other"})), &[])
        .unwrap();
    let found = c
        .sessions(&w, Some(json!({"metadata": {"route": "main"}})))
        .unwrap();
    assert_eq!(
        found.iter().map(|s| s.id().as_str()).collect::<Vec<_>>(),
        ["s1"]
    );
}

#[test]
fn messages_carry_their_turn_part_and_metadata_and_read_back_in_order() {
    let Some(c) = client() else { return };
    let w = workspace(&c, "order");
    let s = session(&c, &w, "s");
    let batch = [
        msg(1, 0, "owner", "when is the dentist?"),
        msg(1, 1, "box", "Tuesday at nine"),
    ];
    let r = c.add_messages(&s, &batch).unwrap();
    assert_eq!((r.added, r.present), (2, 0));
    let back = c.messages(&s, None).unwrap();
    assert_eq!(back.len(), 2);
    assert_eq!(back[0].content, "when is the dentist?");
    assert_eq!(back[0].peer_id, "owner");
    assert_eq!(back[1].peer_id, "box");
    assert_eq!(back[1].key(), Some(MessageKey { turn: 1, part: 1 }));
    assert_eq!(back[1].metadata["class"], "private");
    assert_eq!(back[1].metadata["box_session"], "s");
}

#[test]
fn a_batch_retried_after_it_was_filed_is_not_filed_twice() {
    let Some(c) = client() else { return };
    let w = workspace(&c, "retry");
    let s = session(&c, &w, "s");
    let batch = [msg(1, 0, "owner", "a"), msg(1, 1, "box", "b")];
    c.add_messages(&s, &batch).unwrap();
    let again = c.add_messages(&s, &batch).unwrap();
    assert_eq!((again.added, again.present), (0, 2));
    assert_eq!(texts(&c, &s), ["a", "b"]);
}

#[test]
fn a_half_filed_batch_is_completed_without_duplicates() {
    let Some(c) = client() else { return };
    let w = workspace(&c, "half");
    let s = session(&c, &w, "s");
    let batch = [
        msg(1, 0, "owner", "one"),
        msg(1, 1, "box", "two"),
        msg(2, 0, "owner", "three"),
        msg(2, 1, "box", "four"),
    ];
    c.add_messages(&s, &batch[..1]).unwrap();
    let r = c.add_messages(&s, &batch).unwrap();
    assert_eq!((r.added, r.present), (3, 1));
    assert_eq!(texts(&c, &s), ["one", "two", "three", "four"]);
}

#[test]
fn a_batch_over_the_servers_limit_is_sent_in_pieces_in_order() {
    let Some(c) = client() else { return };
    let w = workspace(&c, "big");
    let s = session(&c, &w, "s");
    let n = MAX_BATCH * 2 + 30;
    let batch: Vec<NewMessage> = (0..n)
        .map(|i| msg(i as u64 / 2 + 1, (i % 2) as u32, "owner", &format!("m{i}")))
        .collect();
    let r = c.add_messages(&s, &batch).unwrap();
    assert_eq!(r.added, n);
    let back = texts(&c, &s);
    assert_eq!(back.len(), n);
    assert_eq!(back, (0..n).map(|i| format!("m{i}")).collect::<Vec<_>>());
    let again = c.add_messages(&s, &batch).unwrap();
    assert_eq!((again.added, again.present), (0, n));
}

#[test]
fn a_text_longer_than_honcho_takes_is_filed_in_parts_and_reads_back_whole() {
    let Some(c) = client() else { return };
    let w = workspace(&c, "long");
    let s = session(&c, &w, "s");
    let text = "ab€".repeat(MAX_CONTENT_CHARS / 2);
    let batch: Vec<NewMessage> = split_content(&text)
        .into_iter()
        .enumerate()
        .map(|(i, p)| msg(1, i as u32, "box", &p))
        .collect();
    assert_eq!(batch.len(), 2);
    c.add_messages(&s, &batch).unwrap();
    assert_eq!(texts(&c, &s).concat(), text);
}

#[test]
fn a_message_over_the_limit_is_refused_before_anything_is_sent() {
    let Some(c) = client() else { return };
    let w = workspace(&c, "over");
    let s = session(&c, &w, "s");
    let too_long = "x".repeat(MAX_CONTENT_CHARS + 1);
    let e = c
        .add_messages(
            &s,
            &[msg(1, 0, "owner", "fine"), msg(1, 1, "box", &too_long)],
        )
        .unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("split_content"), "{e}");
    assert!(texts(&c, &s).is_empty());
    let e = c
        .add_messages(&s, &[msg(1, 0, "owner", "a"), msg(1, 0, "owner", "b")])
        .unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");
    assert!(texts(&c, &s).is_empty());
}

#[test]
fn context_brings_the_newest_messages_that_fit_oldest_first() {
    let Some(c) = client() else { return };
    let w = workspace(&c, "context");
    let s = session(&c, &w, "s");
    let batch: Vec<NewMessage> = (1..=20)
        .map(|t| {
            msg(
                t,
                0,
                "owner",
                &format!("turn {t} says something about the garden"),
            )
        })
        .collect();
    c.add_messages(&s, &batch).unwrap();
    let all = c.context(&w, s.id(), 100_000).unwrap();
    assert_eq!(all.messages.len(), 20);
    let some = c.context(&w, s.id(), 30).unwrap();
    assert!(
        !some.messages.is_empty() && some.messages.len() < 20,
        "{}",
        some.messages.len()
    );
    assert_eq!(
        some.messages.last().unwrap().content,
        "turn 20 says something about the garden"
    );
    let turns: Vec<u64> = some
        .messages
        .iter()
        .map(|m| m.key().unwrap().turn)
        .collect();
    assert!(turns.windows(2).all(|p| p[0] < p[1]), "{turns:?}");
}

#[test]
fn search_finds_a_message_in_its_workspace_and_never_in_another() {
    let Some(c) = client() else { return };
    let main = workspace(&c, "main");
    let quarantine = workspace(&c, "quarantine");
    let s = session(&c, &main, "s");
    let q = session(&c, &quarantine, "s");
    c.add_messages(&s, &[msg(1, 0, "owner", "my dentist is Dr Okafor")])
        .unwrap();
    c.add_messages(&q, &[msg(1, 0, "owner", "the dentist page says call 555")])
        .unwrap();
    let found = c.search(&main, "dentist", 10, None).unwrap();
    assert_eq!(
        found.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(),
        ["my dentist is Dr Okafor"]
    );
    let in_session = c.search_session(&main, s.id(), "Okafor", 5).unwrap();
    assert_eq!(in_session.len(), 1);
    let none = c
        .search(
            &main,
            "dentist",
            10,
            Some(json!({"NOT": [{"session_id": {"in": ["s"]}}]})),
        )
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
}

#[test]
fn a_deleted_session_is_queued_takes_no_more_messages_and_is_not_made_again() {
    let Some(c) = client() else { return };
    let w = workspace(&c, "delete");
    let s = session(&c, &w, "s");
    c.add_messages(&s, &[msg(1, 0, "owner", "forget me")])
        .unwrap();
    assert_eq!(c.delete_session(&w, s.id()).unwrap(), Deletion::Queued);
    assert!(c.sessions(&w, None).unwrap().is_empty());
    let e = c
        .add_messages(&s, &[msg(2, 0, "owner", "again")])
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    let e = c.create_session(&w, s.id(), Map::new(), &[]).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    let again = c.delete_session(&w, s.id()).unwrap();
    assert!(
        matches!(again, Deletion::Queued | Deletion::AlreadyGone),
        "{again:?}"
    );
    assert_eq!(
        c.delete_session(&w, &id("never-was")).unwrap(),
        Deletion::AlreadyGone
    );
}

#[test]
fn a_name_honcho_would_answer_with_a_500_is_refused_before_it_is_sent() {
    assert!(Id::new("bad.name").is_err());
    let e: Error = Id::new("a/b").unwrap_err().into();
    assert_eq!(bxcore::runbook::Anchored::anchor(&e), "honcho-config");
}
