//! Users and groups by name or number, looked up once at start, before the sandbox closes
//! (after it, `/etc/passwd` and NSS are out of reach).

use nix::unistd::{Gid, Group, Uid, User};

use crate::config::SandboxConfig;

/// What went wrong looking a user or a group up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// No such user in the user database.
    #[error("there is no user {0:?}")]
    NoUser(String),
    /// No such group in the group database.
    #[error("there is no group {0:?}")]
    NoGroup(String),
    /// The user database could not be read.
    #[error("cannot look {0:?} up: {1}")]
    Database(String, String),
}

/// A user name or a string of digits (a uid) to a uid. A uid needs no entry in the database.
pub fn resolve_user(name: &str) -> Result<u32, LookupError> {
    if let Ok(uid) = name.parse::<u32>() {
        return Ok(uid);
    }
    match User::from_name(name) {
        Ok(Some(user)) => Ok(user.uid.as_raw()),
        Ok(None) => Err(LookupError::NoUser(name.to_owned())),
        Err(e) => Err(LookupError::Database(name.to_owned(), e.to_string())),
    }
}

/// A group name or a string of digits (a gid) to a gid.
pub fn resolve_group(name: &str) -> Result<u32, LookupError> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    match Group::from_name(name) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => Err(LookupError::NoGroup(name.to_owned())),
        Err(e) => Err(LookupError::Database(name.to_owned(), e.to_string())),
    }
}

/// The owner a socket and its directory are given to: a uid and a gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The owning uid.
    pub uid: u32,
    /// The owning gid.
    pub gid: u32,
}

/// The identity a daemon runs as once `apply` is done: the `[sandbox] user` and group when it
/// starts as root, else the identity it already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The uid after the drop.
    pub uid: u32,
    /// The gid after the drop.
    pub gid: u32,
    /// Whether a drop from root to this identity is due (started as root, a user configured).
    pub drops: bool,
}

impl Identity {
    /// Resolve `[sandbox] user, group` against the process's own identity. A user without a
    /// group takes the user's primary group (a numeric uid with no entry: its gid of the same
    /// number). Not root: the configured user, if any, must be the one already running.
    pub fn resolve(cfg: &SandboxConfig) -> Result<Identity, LookupError> {
        let euid = Uid::effective().as_raw();
        let egid = Gid::effective().as_raw();
        let Some(user) = cfg.user.as_deref() else {
            let gid = match cfg.group.as_deref() {
                Some(g) => resolve_group(g)?,
                None => egid,
            };
            return Ok(Identity {
                uid: euid,
                gid,
                drops: false,
            });
        };
        let uid = resolve_user(user)?;
        let gid = match cfg.group.as_deref() {
            Some(g) => resolve_group(g)?,
            None => match User::from_uid(Uid::from_raw(uid)) {
                Ok(Some(u)) => u.gid.as_raw(),
                Ok(None) => uid,
                Err(e) => return Err(LookupError::Database(user.to_owned(), e.to_string())),
            },
        };
        Ok(Identity {
            uid,
            gid,
            drops: euid == 0 && uid != 0,
        })
    }

    /// The owner to give sockets and their directories to: `Some` only when running as root
    /// with a drop due, since only then do they need a new owner before the drop.
    /// The identity this process runs as, with no drop due: a process a daemon started inside
    /// its own sandbox (loopd's session worker), which can look no user up and need not.
    pub fn current() -> Identity {
        Identity {
            uid: Uid::effective().as_raw(),
            gid: Gid::effective().as_raw(),
            drops: false,
        }
    }

    pub fn owner(&self) -> Option<Owner> {
        self.drops.then_some(Owner {
            uid: self.uid,
            gid: self.gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_is_a_uid_without_a_lookup() {
        assert_eq!(resolve_user("4242"), Ok(4242));
        assert_eq!(resolve_group("4243"), Ok(4243));
    }

    #[test]
    fn root_is_found_by_name() {
        assert_eq!(resolve_user("root"), Ok(0));
        assert_eq!(resolve_group("root"), Ok(0));
    }

    #[test]
    fn an_unknown_name_is_a_clear_error() {
        let e = resolve_user("no-such-user-bx").unwrap_err();
        assert_eq!(e.to_string(), "there is no user \"no-such-user-bx\"");
        let e = resolve_group("no-such-group-bx").unwrap_err();
        assert_eq!(e.to_string(), "there is no group \"no-such-group-bx\"");
    }

    #[test]
    fn no_user_configured_keeps_the_running_identity() {
        let id = Identity::resolve(&SandboxConfig::default()).unwrap();
        assert_eq!(id.uid, Uid::effective().as_raw());
        assert!(!id.drops);
        assert_eq!(id.owner(), None);
    }
}
