//! The filesystem half of the device check: every directory of the layout with its mode and
//! owner, every socket 0600 and its client's, and nothing of the box (nor a directory above
//! it) writable by anyone but its owner. Read with `lstat`: a symlink is never followed.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::manifest::{Directory, Ids, Manifest, Socket, group_name, resolve, user_name};

/// The most entries the walk of the home visits: the box's state is small, and a walk that
/// found more says so rather than run without end.
pub const WALK_LIMIT: usize = 200_000;

/// How many problems a line names before it only counts them.
const SHOWN: usize = 5;

fn owner_text(uid: u32, gid: u32) -> String {
    format!("{}:{}", user_name(uid), group_name(gid))
}

/// What a path of the box must be: a directory or a socket (never a link to one), with this
/// mode, owned by this user and group (`whose`: how the owner is named, `its client ` for a
/// socket).
struct Wanted<'a> {
    path: &'a Path,
    kind: &'static str,
    is_kind: fn(&fs::FileType) -> bool,
    mode: u32,
    user: &'a str,
    group: &'a str,
    whose: &'static str,
}

/// The path is as `w` wants it; else every way it is not.
fn is_as(w: Wanted<'_>) -> Result<String, String> {
    let ids = resolve(w.user, w.group)?;
    let meta = fs::symlink_metadata(w.path).map_err(|e| format!("cannot stat it: {e}"))?;
    if !(w.is_kind)(&meta.file_type()) {
        return Err(format!("not a {}", w.kind));
    }
    let mode = meta.mode() & 0o7777;
    let mut wrong = Vec::new();
    if mode != w.mode {
        wrong.push(format!("mode {mode:04o}, not {:04o}", w.mode));
    }
    if (meta.uid(), meta.gid()) != (ids.uid, ids.gid) {
        wrong.push(format!(
            "owned by {}, not {}{}:{}",
            owner_text(meta.uid(), meta.gid()),
            w.whose,
            w.user,
            w.group
        ));
    }
    if wrong.is_empty() {
        Ok(format!("{:04o} {}:{}", w.mode, w.user, w.group))
    } else {
        Err(wrong.join(", "))
    }
}

/// `dir` has its mode and owner, and is a directory (not a link to one).
pub fn directory(dir: &Directory) -> Result<String, String> {
    is_as(Wanted {
        path: &dir.path,
        kind: "directory",
        is_kind: fs::FileType::is_dir,
        mode: dir.mode_bits()?,
        user: &dir.user,
        group: &dir.group,
        whose: "",
    })
}

/// `sock` is a socket, 0600, owned by its client.
pub fn socket(sock: &Socket) -> Result<String, String> {
    is_as(Wanted {
        path: &sock.path,
        kind: "socket",
        is_kind: FileTypeExt::is_socket,
        mode: 0o600,
        user: &sock.user,
        group: &sock.group,
        whose: "its client ",
    })
}

/// Nothing of the box is writable by a user other than its owner. The box is every layout
/// directory with no layout directory above it (the home, and the sockets' run directory) and
/// everything below: no entry has the group or world write bit, and every entry belongs to the
/// owner of the nearest layout directory above it (a socket, to that socket directory's
/// client). The directories above each of them belong to root (or the top directory's owner)
/// and are writable by their owner alone.
pub fn nobody_else_writes(m: &Manifest) -> Result<String, String> {
    let mut owners: BTreeMap<PathBuf, Ids> = BTreeMap::new();
    for d in &m.directories {
        match resolve(&d.user, &d.group) {
            Ok(ids) => {
                owners.insert(d.path.clone(), ids);
            }
            Err(e) => return Err(format!("{}: {e}", d.path.display())),
        }
    }
    let mut tops: Vec<PathBuf> = owners
        .keys()
        .filter(|p| !p.ancestors().skip(1).any(|a| owners.contains_key(a)))
        .cloned()
        .collect();
    if !owners.contains_key(&m.home) {
        tops.push(m.home.clone());
    }
    let mut problems = Vec::new();
    for top in &tops {
        problems.extend(above(top, owners.get(top).map_or(0, |ids| ids.uid)));
    }
    let mut seen = 0usize;
    let mut stack = tops.clone();
    while let Some(path) = stack.pop() {
        seen += 1;
        if seen > WALK_LIMIT {
            problems.push(format!(
                "more than {WALK_LIMIT} paths: the walk stopped at {}",
                path.display()
            ));
            break;
        }
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            // Gone since its directory was listed (a session file replaced, say).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                problems.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        if let Some(want) = owner_of(&owners, &path) {
            if meta.uid() != want.uid {
                problems.push(format!(
                    "{} belongs to {}, in a directory of {}",
                    path.display(),
                    user_name(meta.uid()),
                    user_name(want.uid)
                ));
            }
        }
        if !meta.file_type().is_symlink() && meta.mode() & 0o022 != 0 {
            problems.push(format!(
                "{} is {:04o}: writable by its group or by anyone",
                path.display(),
                meta.mode() & 0o7777
            ));
        }
        if meta.file_type().is_dir() {
            match fs::read_dir(&path) {
                Ok(entries) => stack.extend(entries.flatten().map(|e| e.path())),
                Err(e) => problems.push(format!("cannot list {}: {e}", path.display())),
            }
        }
    }
    let where_ = tops
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" and ");
    if problems.is_empty() {
        Ok(format!(
            "{seen} paths under {where_}, none writable by another user"
        ))
    } else {
        let n = problems.len();
        let mut text = problems
            .into_iter()
            .take(SHOWN)
            .collect::<Vec<_>>()
            .join("; ");
        if n > SHOWN {
            text.push_str(&format!("; and {} more", n - SHOWN));
        }
        Err(text)
    }
}

/// What is wrong with the directories above `top`: each must belong to root or to `top`'s
/// owner (who could replace `top` anyway), and be writable by its owner alone (or sticky).
fn above(top: &Path, top_owner: u32) -> Vec<String> {
    let mut problems = Vec::new();
    for a in top.ancestors().skip(1) {
        match fs::symlink_metadata(a) {
            Ok(meta) if meta.uid() != 0 && meta.uid() != top_owner => problems.push(format!(
                "{} belongs to {}, not root",
                a.display(),
                user_name(meta.uid())
            )),
            Ok(meta) if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 => {
                problems.push(format!(
                    "{} is {:04o}: writable by others",
                    a.display(),
                    meta.mode() & 0o7777
                ))
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("{}: {e}", a.display())),
        }
    }
    problems
}

/// Who must own `path`: the layout directory it is, else the nearest one above it.
fn owner_of(owners: &BTreeMap<PathBuf, Ids>, path: &Path) -> Option<Ids> {
    if let Some(ids) = owners.get(path) {
        return Some(*ids);
    }
    path.ancestors()
        .skip(1)
        .find_map(|a| owners.get(a).copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::manifest::{Account, Manifest};
    use std::os::unix::fs::PermissionsExt;

    fn me() -> (String, String) {
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        (user_name(uid), group_name(gid))
    }

    fn dir(path: &Path, mode: &str) -> Directory {
        let (user, group) = me();
        Directory {
            path: path.to_path_buf(),
            mode: mode.into(),
            user,
            group,
        }
    }

    /// A home of two layout directories (0711 and 0700) owned by whoever runs the test.
    fn home() -> (tempfile::TempDir, Manifest) {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("box");
        fs::create_dir(&home).unwrap();
        fs::set_permissions(&home, fs::Permissions::from_mode(0o711)).unwrap();
        fs::create_dir(home.join("loop")).unwrap();
        fs::set_permissions(home.join("loop"), fs::Permissions::from_mode(0o700)).unwrap();
        let (user, group) = me();
        let m = Manifest {
            home: home.clone(),
            security_threshold: 15,
            owner: Account { user, group },
            services: vec![],
            sockets: vec![],
            directories: vec![dir(&home, "0711"), dir(&home.join("loop"), "0700")],
            ondemand: None,
        };
        (tmp, m)
    }

    #[test]
    fn a_directory_with_its_mode_and_owner_is_ok() {
        let (_tmp, m) = home();
        for d in &m.directories {
            assert!(directory(d).is_ok(), "{d:?}");
        }
    }

    #[test]
    fn a_loosened_directory_fails_and_says_its_mode() {
        let (_tmp, m) = home();
        let d = &m.directories[1];
        fs::set_permissions(&d.path, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(directory(d), Err("mode 0755, not 0700".into()));
    }

    #[test]
    fn a_missing_directory_fails() {
        let (_tmp, m) = home();
        let mut d = m.directories[1].clone();
        d.path = d.path.join("nope");
        assert!(matches!(directory(&d), Err(w) if w.starts_with("cannot stat it")));
    }

    #[test]
    fn a_symlink_in_place_of_a_directory_fails() {
        let (_tmp, m) = home();
        let link = m.home.join("link");
        std::os::unix::fs::symlink(&m.directories[1].path, &link).unwrap();
        let d = dir(&link, "0700");
        assert_eq!(directory(&d), Err("not a directory".into()));
    }

    #[test]
    fn a_socket_must_be_0600() {
        let (_tmp, m) = home();
        let path = m.home.join("loop/x.sock");
        let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let (user, group) = me();
        let s = Socket {
            name: "x".into(),
            unit: "x.socket".into(),
            path: path.clone(),
            server: "loopd".into(),
            user,
            group,
        };
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(socket(&s).is_ok());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o660)).unwrap();
        assert_eq!(socket(&s), Err("mode 0660, not 0600".into()));
    }

    #[test]
    fn a_file_that_is_not_a_socket_fails_the_socket_check() {
        let (_tmp, m) = home();
        let path = m.home.join("loop/x.sock");
        fs::write(&path, b"").unwrap();
        let (user, group) = me();
        let s = Socket {
            name: "x".into(),
            unit: "x.socket".into(),
            path,
            server: "loopd".into(),
            user,
            group,
        };
        assert_eq!(socket(&s), Err("not a socket".into()));
    }

    #[test]
    fn a_group_writable_file_deep_in_the_home_fails_the_walk() {
        let (_tmp, m) = home();
        fs::create_dir_all(m.home.join("loop/sessions")).unwrap();
        let f = m.home.join("loop/sessions/a.jsonl");
        fs::write(&f, b"{}\n").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            nobody_else_writes(&m).is_ok(),
            "{:?}",
            nobody_else_writes(&m)
        );
        fs::set_permissions(&f, fs::Permissions::from_mode(0o620)).unwrap();
        match nobody_else_writes(&m) {
            Err(w) => assert!(w.contains("a.jsonl is 0620"), "{w}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bad_mode_in_the_manifest_is_a_failure_not_a_pass() {
        let (_tmp, m) = home();
        let mut d = m.directories[1].clone();
        d.mode = "rwx".into();
        assert_eq!(directory(&d), Err("`rwx` is not an octal mode".into()));
    }
}
