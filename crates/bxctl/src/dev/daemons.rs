//! The dev box's daemons, one row each: adding a daemon to the dev box is one row in [`ROWS`].
//! Everything else follows from `bxcore::layout` as on the device: the sockets it serves (bound
//! by `dev up` and handed over), each socket's one client in `[peers]` and as its owner, and as
//! root the daemon's own user (`user::name`).

use toml::Table;

use super::configs::{self, Choice};
use super::home::DevHome;

/// One daemon of the dev box.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// Its name in `bxcore::layout::DAEMONS`, and its executable's.
    pub daemon: &'static str,
    /// Its own configuration tables, beside `[paths]`, `[peers]` and `[sandbox]`
    /// (`configs::common`).
    pub tables: fn(&DevHome, &Choice) -> Table,
    /// Directories of the home, besides its state directory, that are its own (as root: given
    /// to its user).
    pub owns: &'static [&'static str],
    /// Started only when the home has its configuration (`dev up --matrix` writes channeld's).
    pub optional: bool,
}

/// The daemons of the dev box, in the order they are started (a daemon's server first).
pub const ROWS: [Row; 6] = [
    Row {
        daemon: "gatewayd",
        tables: configs::gatewayd,
        owns: &[],
        optional: false,
    },
    Row {
        daemon: "brokerd",
        tables: configs::brokerd,
        owns: &["workspace"],
        optional: false,
    },
    Row {
        daemon: "inferproxy",
        tables: configs::inferproxy,
        owns: &[],
        optional: false,
    },
    Row {
        daemon: "memoryd",
        tables: configs::memoryd,
        owns: &[],
        optional: false,
    },
    Row {
        daemon: "loopd",
        tables: configs::loopd,
        owns: &[],
        optional: false,
    },
    // Last: a client of loopd and brokerd, which serve it.
    Row {
        daemon: "channeld",
        tables: configs::channeld,
        owns: &[],
        optional: true,
    },
];

/// How many rows are not optional.
const fn always() -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < ROWS.len() {
        if !ROWS[i].optional {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The daemons every dev box runs, in [`ROWS`]' order: the optional ones (channeld) left out.
pub const DAEMONS: [&str; always()] = {
    let mut names = [""; always()];
    let (mut i, mut j) = (0, 0);
    while i < ROWS.len() {
        if !ROWS[i].optional {
            names[j] = ROWS[i].daemon;
            j += 1;
        }
        i += 1;
    }
    names
};

/// Every daemon a dev box may run, in [`ROWS`]' order, the optional ones included.
pub const ALL_DAEMONS: [&str; ROWS.len()] = {
    let mut names = [""; ROWS.len()];
    let mut i = 0;
    while i < ROWS.len() {
        names[i] = ROWS[i].daemon;
        i += 1;
    }
    names
};

/// The row of `daemon`.
pub fn row(daemon: &str) -> Option<&'static Row> {
    ROWS.iter().find(|r| r.daemon == daemon)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_a_daemon_of_the_layout() {
        for d in ALL_DAEMONS {
            assert!(bxcore::layout::daemon(d).is_some(), "{d}");
        }
    }
}
