//! The label: what a session, a tool's result or a place carries. Its class is the highest
//! class of what it holds (`public` < `private` < `secret`), and `untrusted` says whether any of
//! it was written by a third party. Labels form a lattice: [`Label::join`] is its least upper
//! bound, and everything that carries a label only ever rises ([`Label::raise`]), so nothing a
//! session read is forgotten by reading more.
//!
//! One type for one thing: the broker's session state, what a call carried, what a workspace
//! place holds, what memoryd files a turn by, and the wire's `session_state_reply` are all this.

use serde::{Deserialize, Serialize};

use crate::DataClass;

/// `{class, untrusted}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Label {
    pub class: DataClass,
    pub untrusted: bool,
}

impl Label {
    /// Nothing at all: public, trusted. The lattice's bottom: joining it changes nothing.
    pub const BOTTOM: Label = Label {
        class: DataClass::Public,
        untrusted: false,
    };

    /// A session that has read nothing yet: the owner's own words, private and trusted.
    pub const FRESH: Label = Label {
        class: DataClass::Private,
        untrusted: false,
    };

    /// A label of `class`, trusted or not.
    pub const fn new(class: DataClass, untrusted: bool) -> Label {
        Label { class, untrusted }
    }

    /// Both at once: the higher class, untrusted if either is.
    #[must_use]
    pub fn join(self, other: Label) -> Label {
        Label {
            class: self.class.max(other.class),
            untrusted: self.untrusted || other.untrusted,
        }
    }

    /// Rise by `other`: `self` becomes `self.join(other)`. True when it changed.
    pub fn raise(&mut self, other: Label) -> bool {
        let raised = self.join(other);
        let changed = raised != *self;
        *self = raised;
        changed
    }

    /// Whether `self` may flow where `other` is: no higher class, and untrusted only into
    /// untrusted. The lattice's order: `a.flows_to(a.join(b))` always holds.
    pub fn flows_to(self, other: Label) -> bool {
        self.class <= other.class && (!self.untrusted || other.untrusted)
    }
}
