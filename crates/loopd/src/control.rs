//! The messages between loopd's monitor and a session's worker, declared once: what each side
//! may send, and how, over the one Unix stream socket between them (the worker's stdin).
//!
//! The monitor hands the worker its session's log and each connection of that session, and
//! connects for it to the three peers a turn uses; the worker asks for those connections and
//! says when a connection it was handed is served. Nothing else crosses: no message names a
//! path or another session, so a worker that sends anything else is ended
//! (`docs/protocol.md`, "loopd's monitor and its workers").
//!
//! A message is a 4-byte big-endian length and that many bytes of JSON. A descriptor travels
//! with the length (`SCM_RIGHTS` on its first byte), and the kind of the message says whether
//! one must (`ToWorker::carries_fd`): one missing, or one where none belongs, is a broken
//! channel.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use bxcore::{SessionId, Turn, TurnKey};

use crate::baseline::Owner;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The longest message: a `hand` holds the connection's first frame, at most the frame budget
/// (`bxcore::MAX_FRAME`), and its JSON escapes; the rest are a few bytes.
pub const MAX_MESSAGE: usize = 2 * bxcore::MAX_FRAME + 4096;

/// What the monitor sends a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToWorker {
    /// First, and only then: the session, the owner's part of a new session's baseline, and,
    /// when `log`, the session's log (the descriptor), opened by the monitor. The worker can
    /// open no file in loopd's directory but its own.
    Start {
        session: SessionId,
        owner: Owner,
        log: bool,
    },
    /// One connection of the session (the descriptor), with the request its first frame held:
    /// a turn, and for a channel's turn the key of the owner's message it is.
    Hand {
        id: u64,
        turn: Turn,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<TurnKey>,
    },
    /// The connection to the peer asked for (the descriptor).
    Dialed,
    /// The peer asked for could not be reached, or is not configured: why, in words.
    NotDialed { why: String },
    /// The session's log, made for a session begun now (the descriptor).
    Created,
    /// The session's log could not be made: why, in words.
    NotCreated { why: String },
    /// A `done` noted: the worker's final frame may go.
    Noted,
}

impl ToWorker {
    /// Whether the message comes with a descriptor.
    pub fn carries_fd(&self) -> bool {
        match self {
            ToWorker::Start { log, .. } => *log,
            ToWorker::Hand { .. } | ToWorker::Dialed | ToWorker::Created => true,
            ToWorker::NotDialed { .. } | ToWorker::NotCreated { .. } | ToWorker::Noted => false,
        }
    }
}

/// What a worker sends its monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToMonitor {
    /// Connect to one of the peers a turn uses, and hand the connection over.
    Dial { peer: Peer },
    /// Make the session's log, which did not exist when the worker started: a new session is
    /// being begun, its start record next. Nothing is made before that, so a turn that ends
    /// earlier (a broker outage) leaves no log behind.
    Create,
    /// A connection handed over was served to its end: the worker is idle when none is left.
    /// Answered `noted`, before the connection's final frame goes.
    Done,
}

/// The peers a worker may be connected to: loopd's own clients' sockets, as its configuration
/// names them, and no other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Peer {
    Inference,
    Broker,
    Memory,
}

/// Why a message could not be sent or read.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The other side closed the channel between messages.
    #[error("the other side closed the channel")]
    Closed,
    #[error("the channel failed: {0}")]
    Io(#[from] io::Error),
    /// A message longer than [`MAX_MESSAGE`].
    #[error("a message of {0} bytes, over the bound of {MAX_MESSAGE}")]
    TooLarge(usize),
    /// Not one of the messages this side accepts.
    #[error("a message that is not one this side accepts: {0}")]
    Bad(String),
    /// A descriptor missing where the message carries one, or sent with one that does not.
    #[error("a descriptor {0}")]
    Descriptor(&'static str),
}

/// Send `msg`, with `fd` when it carries one: the length (and the descriptor) in one
/// `sendmsg`, then the body.
pub fn send<M: Serialize>(
    stream: &mut UnixStream,
    msg: &M,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), ControlError> {
    let body = serde_json::to_vec(msg).map_err(|e| ControlError::Bad(e.to_string()))?;
    if body.len() > MAX_MESSAGE {
        return Err(ControlError::TooLarge(body.len()));
    }
    let len = (body.len() as u32).to_be_bytes();
    let raw: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    let mut sent = 0;
    while sent == 0 {
        sent = sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&len)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(io::Error::from)?;
    }
    // The descriptor went with the first byte; the rest of the length and the body follow.
    stream.write_all(&len[sent..])?;
    stream.write_all(&body)?;
    Ok(())
}

/// Read one message, and the descriptor that came with it, if any.
pub fn recv<M: DeserializeOwned>(
    stream: &mut UnixStream,
) -> Result<(M, Option<OwnedFd>), ControlError> {
    let mut len = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let (got, fd) = {
        let mut iov = [IoSliceMut::new(&mut len)];
        let msg = loop {
            match recvmsg::<()>(
                stream.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r.map_err(io::Error::from)?,
            }
        };
        let mut fd = None;
        let mut extra = false;
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for f in fds {
                    // SAFETY: the kernel just installed `f` in this process for this message;
                    // nothing else holds it, so it is owned here (and closed if not wanted).
                    let owned = unsafe { OwnedFd::from_raw_fd(f) };
                    if fd.is_none() {
                        fd = Some(owned);
                    } else {
                        extra = true;
                    }
                }
            }
        }
        if extra {
            return Err(ControlError::Descriptor(
                "more than one came with a message",
            ));
        }
        (msg.bytes, fd)
    };
    if got == 0 {
        return Err(ControlError::Closed);
    }
    stream.read_exact(&mut len[got..])?;
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_MESSAGE {
        return Err(ControlError::TooLarge(n));
    }
    let mut body = vec![0u8; n];
    stream.read_exact(&mut body)?;
    let msg = serde_json::from_slice(&body).map_err(|e| ControlError::Bad(e.to_string()))?;
    Ok((msg, fd))
}

/// A message to the worker, its descriptor checked against its kind.
pub fn recv_to_worker(
    stream: &mut UnixStream,
) -> Result<(ToWorker, Option<OwnedFd>), ControlError> {
    let (msg, fd): (ToWorker, _) = recv(stream)?;
    match (msg.carries_fd(), fd.is_some()) {
        (true, false) => Err(ControlError::Descriptor("is missing")),
        (false, true) => Err(ControlError::Descriptor("came where none belongs")),
        _ => Ok((msg, fd)),
    }
}

/// A message to the monitor, which never carries a descriptor.
pub fn recv_to_monitor(stream: &mut UnixStream) -> Result<ToMonitor, ControlError> {
    match recv::<ToMonitor>(stream)? {
        (msg, None) => Ok(msg),
        (_, Some(_)) => Err(ControlError::Descriptor("came where none belongs")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_travels_with_its_message_and_the_kinds_are_checked() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let (x, _y) = UnixStream::pair().unwrap();
        send(&mut a, &ToWorker::Dialed, Some(x.as_fd())).unwrap();
        let (m, fd) = recv_to_worker(&mut b).unwrap();
        assert_eq!(m, ToWorker::Dialed);
        assert!(fd.is_some());
        send(&mut a, &ToWorker::Dialed, None).unwrap();
        assert!(matches!(
            recv_to_worker(&mut b),
            Err(ControlError::Descriptor("is missing"))
        ));
        send(&mut a, &ToMonitor::Done, Some(x.as_fd())).unwrap();
        assert!(matches!(
            recv_to_monitor(&mut b),
            Err(ControlError::Descriptor(_))
        ));
        send(&mut a, &ToMonitor::Dial { peer: Peer::Broker }, None).unwrap();
        assert_eq!(
            recv_to_monitor(&mut b).unwrap(),
            ToMonitor::Dial { peer: Peer::Broker }
        );
        drop(a);
        assert!(matches!(recv_to_monitor(&mut b), Err(ControlError::Closed)));
    }

    #[test]
    fn a_message_that_names_a_path_or_an_unknown_kind_is_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        for bad in [
            r#"{"kind":"dial","peer":"state"}"#,
            r#"{"kind":"dial","peer":"broker","path":"/run/x.sock"}"#,
            r#"{"kind":"open","path":"/etc/passwd"}"#,
        ] {
            a.write_all(&(bad.len() as u32).to_be_bytes()).unwrap();
            a.write_all(bad.as_bytes()).unwrap();
            assert!(
                matches!(recv_to_monitor(&mut b), Err(ControlError::Bad(_))),
                "{bad}"
            );
        }
        a.write_all(&(MAX_MESSAGE as u32 + 1).to_be_bytes())
            .unwrap();
        assert!(matches!(
            recv_to_monitor(&mut b),
            Err(ControlError::TooLarge(_))
        ));
    }
}
