//! channel.sock, the owner's: a pairing code for a room (`bxctl channel pair`), and the
//! channel's status (`bxctl status`). The socket belongs to the owner's account alone (its
//! directory, and the peer check), so only the owner can start a pairing.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use bxcore::layout::ChannelRequest;
use bxcore::{ChannelPairing, ChannelReport, Envelope, ErrorCode, Message, Timestamp};

use crate::channel::{Channel, Pairing, lock};

/// The letters of a pairing code: no 0/o, 1/l/i, easy to type on a phone.
const LETTERS: &[u8] = b"abcdefghjkmnpqrstuvwxyz23456789";

/// A new code: `pair-` and 10 random letters (about 50 bits).
fn code() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 10];
    getrandom::fill(&mut bytes)?;
    let letters: String = bytes
        .iter()
        .map(|b| LETTERS[usize::from(*b) % LETTERS.len()] as char)
        .collect();
    Ok(format!("pair-{letters}"))
}

/// Serve one channel.sock request (a kind its table accepts).
pub fn handle(mut stream: UnixStream, id: u64, request: ChannelRequest, ch: &Channel) {
    let answer = match request {
        ChannelRequest::ChannelPair(p) => {
            if !ch.serves(&p.room) {
                Envelope::error(
                    id,
                    ErrorCode::Forbidden,
                    format!(
                        "{} is not one of the channel's rooms ([matrix] rooms: {})",
                        crate::channel::shown(&p.room),
                        ch.cfg.matrix.rooms.join(", ")
                    ),
                )
            } else {
                match code() {
                    Ok(code) => {
                        let expires = Timestamp(
                            Timestamp::now().0
                                + Duration::from_millis(ch.cfg.limits.pairing_ms).as_millis()
                                    as u64,
                        );
                        *lock(&ch.pairing) = Some(Pairing {
                            room: p.room.clone(),
                            code: code.clone(),
                            expires,
                        });
                        bxharden::log::notice(&format!(
                            "a pairing code for {} is out, until {}",
                            crate::channel::shown(&p.room),
                            expires.0
                        ));
                        Envelope::new(
                            id,
                            true,
                            Message::ChannelPairing(ChannelPairing {
                                room: p.room,
                                code,
                                expires,
                            }),
                        )
                    }
                    Err(e) => {
                        Envelope::error(id, ErrorCode::Internal, format!("no random code: {e}"))
                    }
                }
            }
        }
        ChannelRequest::ChannelStatus => {
            let status = lock(&ch.status).clone();
            let waiting = ch.approvals.waiting();
            let mut detail = status.detail;
            if waiting > 0 {
                detail.push_str(&format!("; {waiting} approval(s) asked in the rooms"));
            }
            Envelope::new(
                id,
                true,
                Message::ChannelReport(ChannelReport {
                    homeserver: ch.client.base().to_string(),
                    user: ch.me().to_string(),
                    connected: status.connected,
                    detail,
                    owners: ch.state().owners,
                    rooms: ch.cfg.matrix.rooms.clone(),
                }),
            )
        }
    };
    let _ = bxcore::write_frame(&mut stream, &answer);
}
