//! What the client sends and what it reads back: only the fields memoryd uses, each checked
//! where it is read (unknown fields are ignored, so a newer server still answers).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::id::Id;
use crate::{MAX_CONTENT_CHARS, PART_KEY, TURN_KEY};

/// A workspace, as Honcho keeps it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Workspace {
    pub id: Id,
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

/// A session that was created on purpose ([`crate::Client::create_session`]): the only thing
/// messages can be added to, so no write ever makes Honcho create one silently.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub(crate) workspace: Id,
    pub(crate) id: Id,
    pub(crate) metadata: Map<String, Value>,
}

impl Session {
    pub fn workspace(&self) -> &Id {
        &self.workspace
    }

    pub fn id(&self) -> &Id {
        &self.id
    }

    /// Its metadata, as the server answered it.
    pub fn metadata(&self) -> &Map<String, Value> {
        &self.metadata
    }
}

/// What a session's answer holds that the client reads.
#[derive(Debug, Deserialize)]
pub(crate) struct SessionReply {
    pub id: Id,
    pub workspace_id: Id,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    #[serde(default = "yes")]
    pub is_active: bool,
}

fn yes() -> bool {
    true
}

/// How Honcho treats a peer in a session: whether it forms a representation of the peer
/// (`observe_me`) and whether the peer forms one of the others (`observe_others`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PeerConfig {
    pub observe_me: bool,
    pub observe_others: bool,
}

/// Which message of a session this is: its turn, and its place within the turn (a long text is
/// several parts). Stamped into the message's metadata, it is how a retried batch finds what
/// the first attempt already filed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageKey {
    pub turn: u64,
    pub part: u32,
}

/// A message to add.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    pub peer: Id,
    pub content: String,
    pub key: MessageKey,
    /// More metadata (the box session, the class); [`TURN_KEY`] and [`PART_KEY`] are the
    /// client's and are set from `key`.
    pub metadata: Map<String, Value>,
}

impl NewMessage {
    /// The body Honcho takes for it.
    pub(crate) fn wire(&self) -> Value {
        let mut metadata = self.metadata.clone();
        metadata.insert(TURN_KEY.into(), self.key.turn.into());
        metadata.insert(PART_KEY.into(), self.key.part.into());
        serde_json::json!({
            "peer_id": self.peer,
            "content": self.content,
            "metadata": metadata,
        })
    }
}

/// A message, as Honcho keeps it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Message {
    pub id: String,
    pub content: String,
    pub peer_id: String,
    pub session_id: String,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    #[serde(default)]
    pub created_at: String,
    #[serde(default)]
    pub token_count: u64,
}

impl Message {
    /// Its key, when it carries one (a message the client added).
    pub fn key(&self) -> Option<MessageKey> {
        let turn = self.metadata.get(TURN_KEY)?.as_u64()?;
        let part = u32::try_from(self.metadata.get(PART_KEY)?.as_u64()?).ok()?;
        Some(MessageKey { turn, part })
    }
}

/// One page of a listing.
#[derive(Debug, Deserialize)]
pub(crate) struct Page<T> {
    pub items: Vec<T>,
    #[serde(default)]
    pub pages: u64,
}

/// A session's context: its newest messages that fit the token budget, oldest first.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Context {
    pub messages: Vec<Message>,
}

/// What adding a batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Appended {
    /// Messages written now.
    pub added: usize,
    /// Messages an earlier attempt had filed already, not written again.
    pub present: usize,
}

/// What deleting a session did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// Honcho accepted it (202): the session is inactive now, but its messages are removed by
    /// Honcho's queue later, and until then its search still finds them. Whoever deleted it
    /// hides it from what it shows.
    Queued,
    /// Honcho has no such session (404), or it was deleted before.
    AlreadyGone,
}

/// `text` cut into pieces Honcho takes ([`MAX_CONTENT_CHARS`] characters each), at character
/// boundaries, in order. An empty text is one empty piece.
pub fn split_content(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut piece = String::new();
    let mut n = 0;
    for c in text.chars() {
        if n == MAX_CONTENT_CHARS {
            out.push(std::mem::take(&mut piece));
            n = 0;
        }
        piece.push(c);
        n += 1;
    }
    out.push(piece);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_is_split_at_characters_and_nothing_is_lost() {
        let text = "é".repeat(MAX_CONTENT_CHARS * 2 + 3);
        let parts = split_content(&text);
        assert_eq!(
            parts.iter().map(|p| p.chars().count()).collect::<Vec<_>>(),
            [MAX_CONTENT_CHARS, MAX_CONTENT_CHARS, 3]
        );
        assert_eq!(parts.concat(), text);
        assert_eq!(split_content(""), [""]);
        assert_eq!(split_content(&"a".repeat(MAX_CONTENT_CHARS)).len(), 1);
    }

    #[test]
    fn the_key_is_stamped_over_whatever_metadata_says() {
        let mut metadata = Map::new();
        metadata.insert(TURN_KEY.into(), "forged".into());
        metadata.insert("class".into(), "private".into());
        let m = NewMessage {
            peer: Id::new("owner").unwrap(),
            content: "hi".into(),
            key: MessageKey { turn: 7, part: 2 },
            metadata,
        };
        let w = m.wire();
        assert_eq!(w["metadata"]["turn"], 7);
        assert_eq!(w["metadata"]["part"], 2);
        assert_eq!(w["metadata"]["class"], "private");
    }
}
