//! Talking to a socket as its client. A socket of the box lets in one uid, its client's (the
//! file mode and the server's peer check both say so), so root, to check a socket whose client
//! is a daemon, takes the client's effective ids for that one exchange (`crate::thread_ids`;
//! `SO_PEERCRED` and the file modes both see them). The device check does so with the users of
//! `device.json`; a dev box made as root with the users `dev up` made for it; everything else
//! talks as itself.

use nix::unistd::{User, geteuid};

use bxcore::layout::{self, SocketSpec};

use crate::dev::{DevHome, user};
use crate::target::Target;
use crate::thread_ids::{Ids, as_ids};

/// The ids root takes to talk to `spec`'s socket of the dev box at `home`: its client's user,
/// when the box was made as root and the client is a daemon; `None` (as itself) otherwise.
pub fn dev_client(home: &DevHome, spec: &SocketSpec) -> Option<Ids> {
    if !geteuid().is_root() || spec.client == layout::OWNER {
        return None;
    }
    let box_id = home.read_marker().ok()??.box_id?;
    let name = user::name(&box_id, spec.client)?;
    let u = User::from_name(&name).ok()??;
    Some(Ids {
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
    })
}

/// `f` as the client of `spec`'s socket of `target` (see [`dev_client`]), else as this process;
/// `Err` says why the client's ids could not be taken.
pub fn as_client<T>(
    target: &Target,
    spec: &SocketSpec,
    f: impl FnOnce() -> T,
) -> Result<T, String> {
    let ids = target
        .is_dev_box()
        .then(|| DevHome::new(target.home()).ok())
        .flatten()
        .and_then(|h| dev_client(&h, spec));
    match ids {
        Some(ids) => as_ids(ids, f),
        None => Ok(f()),
    }
}
