//! `[[routes]]`: where a turn is filed, decided by its session's state as brokerd holds it.
//!
//! ```toml
//! [[routes]]
//! class = "secret"        # absent: any class
//! to = "local"
//! [[routes]]
//! untrusted = true        # absent: either
//! to = "quarantine"
//! [[routes]]
//! to = "main"
//! ```
//!
//! The first route that matches wins. The table is checked whole when the configuration loads,
//! over every state a session can be in: each must reach a route, a `secret` session only
//! `local` (no secret text ever leaves the device, so secret wins over untrusted), and an
//! untrusted one never `main` (recall would bring third-party text back into context as the
//! owner's own). So a route can only be made stricter than the defaults, never looser.

use bxcore::{DataClass, Label, MemoryRoute};
use serde::Deserialize;

/// One `[[routes]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The session's class; absent: any.
    #[serde(default)]
    pub class: Option<DataClass>,
    /// Whether the session has read untrusted content; absent: either.
    #[serde(default)]
    pub untrusted: Option<bool>,
    /// Where a matching turn is filed.
    pub to: MemoryRoute,
}

impl Route {
    fn matches(&self, state: Label) -> bool {
        self.class.is_none_or(|c| c == state.class)
            && self.untrusted.is_none_or(|u| u == state.untrusted)
    }
}

/// The whole table, in order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Routes(pub Vec<Route>);

/// Every state a session can be in.
const STATES: [Label; 6] = [
    state(DataClass::Public, false),
    state(DataClass::Public, true),
    state(DataClass::Private, false),
    state(DataClass::Private, true),
    state(DataClass::Secret, false),
    state(DataClass::Secret, true),
];

const fn state(class: DataClass, untrusted: bool) -> Label {
    Label { class, untrusted }
}

impl Routes {
    /// The design's defaults: secret (trusted or not) → local; untrusted → quarantine; the
    /// rest (public or private, trusted) → main.
    pub fn defaults() -> Routes {
        Routes(vec![
            Route {
                class: Some(DataClass::Secret),
                untrusted: None,
                to: MemoryRoute::Local,
            },
            Route {
                class: None,
                untrusted: Some(true),
                to: MemoryRoute::Quarantine,
            },
            Route {
                class: None,
                untrusted: None,
                to: MemoryRoute::Main,
            },
        ])
    }

    /// The route of a session in `state`. Total over every state for a checked table; an
    /// unchecked table that leaves a state without a route keeps the turn on the device.
    pub fn route(&self, state: Label) -> MemoryRoute {
        let chosen = self
            .0
            .iter()
            .find(|r| r.matches(state))
            .map_or(MemoryRoute::Local, |r| r.to);
        // The two rules no table can loosen, held here too.
        match (state.class, state.untrusted, chosen) {
            (DataClass::Secret, _, _) => MemoryRoute::Local,
            (_, true, MemoryRoute::Main) => MemoryRoute::Quarantine,
            _ => chosen,
        }
    }

    /// The table is whole and safe: `Err` names the first state it gets wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.0.is_empty() {
            return Err("[[routes]] is empty: leave it out for the defaults".to_string());
        }
        for s in STATES {
            let what = format!(
                "a {} {} session",
                s.class,
                if s.untrusted { "untrusted" } else { "trusted" }
            );
            match self.0.iter().find(|r| r.matches(s)).map(|r| r.to) {
                None => return Err(format!("[[routes]] has no route for {what}")),
                Some(to) if s.class == DataClass::Secret && to != MemoryRoute::Local => {
                    return Err(format!(
                        "[[routes]] sends {what} to {to}: secret turns are kept local only"
                    ));
                }
                Some(MemoryRoute::Main) if s.untrusted => {
                    return Err(format!(
                        "[[routes]] sends {what} to main: untrusted turns are never read back into context"
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}
