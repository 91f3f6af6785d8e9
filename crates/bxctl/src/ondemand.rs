//! The owner's on-demand units on the device (`nixos-module/layout.json`'s "ondemand"): a
//! socket that belongs to the owner, on which systemd starts one instance of a template unit
//! per connection, its standard output the connection. `bxctl selftest` (loopd's selftest, run
//! as loopd's user) and `bxctl check` as the owner (the device check, run as root) read their
//! report this way: the owner needs neither sudo nor polkit, and nobody else may open the
//! socket (0600 in a 0700 directory of the owner's).

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The most a report may be: a device check of every unit is a few kB.
const LIMIT: usize = 1 << 20;

/// The owner's on-demand sockets, by what they start (the device manifest's `ondemand`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnDemand {
    /// `boxmaker-check@.service`: `bxctl check --json` as root.
    pub check: PathBuf,
    /// `boxmaker-selftest@.service`: `loopd selftest` as loopd's user.
    pub selftest: PathBuf,
}

/// The owner's on-demand sockets the device manifest at `manifest` names (the device check
/// reads the rest of it: `crate::check::manifest`).
pub fn of_device(manifest: &Path) -> Result<OnDemand, String> {
    #[derive(Deserialize)]
    struct Named {
        #[serde(default)]
        ondemand: Option<OnDemand>,
    }
    let text = std::fs::read_to_string(manifest)
        .map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
    let named: Named = serde_json::from_str(&text)
        .map_err(|e| format!("{} does not parse: {e}", manifest.display()))?;
    named.ondemand.ok_or_else(|| {
        format!(
            "{} names no on-demand units for the owner",
            manifest.display()
        )
    })
}

/// Connect to `socket` and read what the unit writes until it closes the connection, within
/// `deadline`; `Err` says why there is no report.
pub fn report(socket: &Path, deadline: Duration) -> Result<String, String> {
    let mut stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied => format!(
            "{} is not yours to open: only the box's owner starts this unit",
            socket.display()
        ),
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => format!(
            "{} does not answer: its socket unit is not listening ({e})",
            socket.display()
        ),
        _ => format!("cannot connect to {}: {e}", socket.display()),
    })?;
    let until = Instant::now() + deadline;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "the unit behind {} did not finish its report within {} s",
                socket.display(),
                deadline.as_secs()
            ));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| format!("{}: {e}", socket.display()))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > LIMIT {
                    return Err(format!(
                        "the unit behind {} sent more than {LIMIT} bytes",
                        socket.display()
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(format!("reading {}: {e}", socket.display())),
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    #[test]
    fn the_report_is_everything_the_unit_wrote_before_it_closed_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("check.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let unit = std::thread::spawn(move || {
            let mut c = bxtest::accept(&listener, "the report's reader");
            c.write_all(b"line one\n").unwrap();
            c.write_all(b"check: ok\n").unwrap();
        });
        let got = report(&path, Duration::from_secs(120)).unwrap();
        bxtest::join(unit, "the unit's writer");
        assert_eq!(got, "line one\ncheck: ok\n");
    }

    #[test]
    fn the_manifest_names_the_owners_sockets_or_says_it_names_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device.json");
        std::fs::write(
            &path,
            r#"{"home": "/var/lib/boxmaker", "ondemand": {"check": "/run/a/check.sock", "selftest": "/run/b/selftest.sock"}}"#,
        )
        .unwrap();
        assert_eq!(
            of_device(&path).unwrap(),
            OnDemand {
                check: "/run/a/check.sock".into(),
                selftest: "/run/b/selftest.sock".into(),
            }
        );
        std::fs::write(&path, r#"{"home": "/var/lib/boxmaker"}"#).unwrap();
        let e = of_device(&path).unwrap_err();
        assert!(e.ends_with("names no on-demand units for the owner"), "{e}");
    }

    #[test]
    fn a_socket_that_is_not_there_says_its_unit_is_not_listening() {
        let dir = tempfile::tempdir().unwrap();
        let e = report(&dir.path().join("absent.sock"), Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("its socket unit is not listening"), "{e}");
    }
}
