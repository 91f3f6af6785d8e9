//! What every configuration target checks: text that is not UTF-8 is not read; text that is
//! parses to a configuration that passes its checks again unchanged, or to an error that says
//! something, on one line after the file's name, without a control character that would break
//! a journal line.

use bxharden::daemon::{ConfigError, DaemonConfig};

pub fn config<C: DaemonConfig>(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match bxharden::daemon::parse::<C>(std::path::Path::new("fuzz.toml"), text) {
        Ok(mut cfg) => assert!(
            cfg.check().is_ok(),
            "a checked configuration fails its check"
        ),
        Err(ConfigError::Invalid { why, .. }) => {
            assert!(!why.trim().is_empty(), "an empty reason");
            assert!(
                !why.chars().any(|c| c.is_control() && c != '\n'),
                "a control character in {why:?}"
            );
        }
        Err(ConfigError::Parse { message, .. }) => assert!(!message.trim().is_empty()),
        Err(ConfigError::Read { .. }) => unreachable!("parse reads no file"),
    }
}
