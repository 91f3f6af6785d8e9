//! Frames: a 4-byte big-endian length `N`, then exactly `N` bytes of UTF-8 JSON, one envelope.
//!
//! The length is checked before anything else is read or written, so a peer can never make a
//! daemon read, allocate or send more than `4 + MAX_FRAME` bytes for one frame.

use std::io::{self, Read, Write};

use serde_json::Value;

use crate::{Envelope, ErrorCode};

/// The protocol version every envelope's `v` carries.
pub const PROTOCOL_VERSION: u32 = 1;

/// The largest frame body, in bytes (1 MiB).
pub const MAX_FRAME: usize = 1 << 20;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// End of stream before the first byte of a frame: the peer is done.
    #[error("the connection closed before a frame")]
    Closed,
    /// Anything else from the stream, end of stream inside a frame included.
    #[error("the connection failed inside a frame: {0}")]
    Io(#[source] io::Error),
    /// A length over `MAX_FRAME`; the body was not read (or, writing, nothing was written).
    #[error("a frame of {0} bytes is over the limit of {MAX_FRAME}")]
    TooLarge(usize),
    /// A zero length, or a body that is not UTF-8.
    #[error("{0}")]
    BadFrame(String),
    /// Not JSON, or JSON that is not an envelope.
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// An envelope of another protocol version.
    #[error("protocol version {0} is not spoken here (this side speaks {PROTOCOL_VERSION})")]
    BadVersion(u32),
}

impl FrameError {
    /// The error code that answers this failure on the wire.
    pub fn code(&self) -> ErrorCode {
        match self {
            FrameError::Closed
            | FrameError::Io(_)
            | FrameError::TooLarge(_)
            | FrameError::BadFrame(_) => ErrorCode::BadFrame,
            FrameError::Json(_) => ErrorCode::BadMessage,
            FrameError::BadVersion(_) => ErrorCode::BadVersion,
        }
    }

    /// Whether this is a read that ran out of time (see `deadline`).
    pub fn is_timeout(&self) -> bool {
        matches!(self, FrameError::Io(e) if crate::deadline::is_timeout(e))
    }
}

/// Write one envelope as one frame, in a single `write_all` of a buffer built first. An envelope
/// over `MAX_FRAME` is `TooLarge` and nothing is written.
pub fn write_frame(w: &mut impl Write, env: &Envelope) -> Result<(), FrameError> {
    let body = serde_json::to_vec(env).map_err(FrameError::Json)?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge(body.len()))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf).map_err(FrameError::Io)?;
    w.flush().map_err(FrameError::Io)
}

/// Read one frame and decode its envelope. `v` is checked before the rest is decoded: a JSON body
/// with another `v` is `BadVersion`, whatever else is wrong with it.
pub fn read_frame(r: &mut impl Read) -> Result<Envelope, FrameError> {
    let n = read_frame_len(r)?;
    read_frame_body(r, n)
}

/// Read a frame's length and check it (`1..=MAX_FRAME`): the first half of [`read_frame`], for a
/// server that must reserve the body's memory before it reads it.
pub fn read_frame_len(r: &mut impl Read) -> Result<usize, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => {
                return Err(FrameError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the stream ended inside a frame's length",
                )));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let n = u32::from_be_bytes(len) as usize;
    if n == 0 {
        return Err(FrameError::BadFrame("a frame of zero length".to_string()));
    }
    if n > MAX_FRAME {
        return Err(FrameError::TooLarge(n));
    }
    Ok(n)
}

/// Read a body of `n` bytes (a length [`read_frame_len`] checked) and decode its envelope: the
/// second half of [`read_frame`].
pub fn read_frame_body(r: &mut impl Read, n: usize) -> Result<Envelope, FrameError> {
    // Grown as bytes arrive, never allocated up front from a length a peer chose.
    let mut body = Vec::new();
    r.take(n as u64)
        .read_to_end(&mut body)
        .map_err(FrameError::Io)?;
    if body.len() < n {
        return Err(FrameError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the stream ended after {} of {n} bytes", body.len()),
        )));
    }
    decode_body(body)
}

/// A whole frame body as an envelope: UTF-8, then `v` checked before anything else, then the
/// envelope (for a reader that gathered the body itself, a chunk at a time).
pub fn decode_body(body: Vec<u8>) -> Result<Envelope, FrameError> {
    let text = String::from_utf8(body)
        .map_err(|e| FrameError::BadFrame(format!("the frame is not UTF-8: {}", e.utf8_error())))?;
    let value: Value = serde_json::from_str(&text).map_err(FrameError::Json)?;
    if let Some(v) = value.get("v").and_then(Value::as_u64) {
        if v != u64::from(PROTOCOL_VERSION) {
            return Err(FrameError::BadVersion(u32::try_from(v).unwrap_or(u32::MAX)));
        }
    }
    serde_json::from_value(value).map_err(FrameError::Json)
}
