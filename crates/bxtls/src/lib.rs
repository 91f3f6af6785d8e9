//! bxtls: the certificates a TLS client of the box trusts, for the daemons that open TLS
//! connections themselves (inferproxy to its provider, gatewayd to the allowed hosts) and no
//! other: a crate of its own, so that no daemon without TLS depends on ureq for it.
//!
//! [`load`] reads the CA bundle the configuration names, or else the first system bundle of
//! [`SYSTEM_CA_FILES`] that exists, once at start (before the sandbox closes). What a daemon does
//! on a machine with no system bundle is its own choice: inferproxy refuses to start, gatewayd
//! trusts the Mozilla roots built into the client.

use std::io;
use std::path::{Path, PathBuf};

use ureq::tls::{Certificate, PemItem};

/// The CA bundles looked for, in order, when the configuration names none.
pub const SYSTEM_CA_FILES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/ssl/certs/ca-bundle.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// The certificates of one CA bundle.
#[derive(Debug)]
pub struct Bundle {
    /// The file they were read from.
    pub path: PathBuf,
    /// At least one.
    pub certs: Vec<Certificate<'static>>,
}

/// Why a CA bundle cannot be used: its path, then what is wrong. The daemon that reads it adds
/// its runbook entry (that of its configuration).
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read the CA bundle {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the CA bundle {} does not parse: {why}", path.display())]
    Parse { path: PathBuf, why: String },
    #[error("the CA bundle {} holds no certificate", path.display())]
    Empty { path: PathBuf },
}

/// The first of [`SYSTEM_CA_FILES`] that is a file, if any.
pub fn system_bundle() -> Option<PathBuf> {
    SYSTEM_CA_FILES
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(Path::to_path_buf)
}

/// The certificates of `ca_file`, else of the first system bundle that exists; `None` when
/// `ca_file` is `None` and the machine has no system bundle.
pub fn load(ca_file: Option<&Path>) -> Result<Option<Bundle>, CaError> {
    match ca_file.map(Path::to_path_buf).or_else(system_bundle) {
        Some(path) => read(&path).map(Some),
        None => Ok(None),
    }
}

/// The certificates of the PEM bundle at `path`: refused if it cannot be read, if any item does
/// not parse, or if it holds no certificate (other items, such as keys, are passed over).
pub fn read(path: &Path) -> Result<Bundle, CaError> {
    let pem = std::fs::read(path).map_err(|source| CaError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => {
                return Err(CaError::Parse {
                    path: path.to_path_buf(),
                    why: e.to_string(),
                });
            }
        }
    }
    if certs.is_empty() {
        return Err(CaError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(Bundle {
        path: path.to_path_buf(),
        certs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ca.pem");

    #[test]
    fn the_named_bundle_is_read_with_its_certificates() {
        let b = load(Some(Path::new(CA))).unwrap().unwrap();
        assert_eq!(b.path, Path::new(CA));
        assert!(!b.certs.is_empty());
    }

    #[test]
    fn a_missing_bundle_is_refused_with_its_path() {
        let e = read(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(matches!(e, CaError::Read { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("cannot read the CA bundle /nonexistent/ca.pem: "),
            "{e}"
        );
    }

    #[test]
    fn a_bundle_without_a_certificate_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ca.pem");
        std::fs::write(&p, "no PEM here\n").unwrap();
        let e = read(&p).unwrap_err();
        assert!(matches!(e, CaError::Empty { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!("the CA bundle {} holds no certificate", p.display())
        );
    }

    #[test]
    fn a_bundle_that_does_not_parse_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ca.pem");
        std::fs::write(
            &p,
            "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = read(&p).unwrap_err();
        assert!(matches!(e, CaError::Parse { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("the CA bundle {} does not parse: ", p.display())),
            "{e}"
        );
    }

    #[test]
    fn with_no_bundle_named_the_system_one_is_taken_when_there_is_one() {
        match (load(None).unwrap(), system_bundle()) {
            (Some(b), Some(p)) => assert_eq!(b.path, p),
            (None, None) => {}
            (got, want) => panic!("loaded {got:?}, the system bundle is {want:?}"),
        }
    }
}
