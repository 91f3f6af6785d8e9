//! Server-sent events, as both providers stream them: `field: value` lines, `data` lines joined
//! with a newline, a blank line ends an event, lines starting with `:` are comments (keep-alives).
//!
//! Lines end in `\n`, `\r\n` or `\r`. One line and one event are bounded ([`MAX_EVENT`]), so a
//! provider cannot make inferproxy buffer without limit; an event cut off by the end of the
//! stream is not an event (the caller sees `None` and decides whether the stream was complete).

use std::io::{self, BufRead};

/// The largest event (all its lines together), in bytes.
pub const MAX_EVENT: usize = 1 << 20;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// The `event:` field; empty when absent (the SSE default type is `message`).
    pub name: String,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Why the stream could not be read as events.
#[derive(Debug)]
pub enum SseError {
    /// The transport failed (a timeout included).
    Io(io::Error),
    /// A line or an event over [`MAX_EVENT`].
    TooLong,
    /// A line that is not UTF-8.
    NotUtf8,
}

/// Reads events from a byte stream.
#[derive(Debug)]
pub struct Reader<R> {
    inner: R,
    line: Vec<u8>,
    /// A `\r` ended the last line: a `\n` right after it belongs to it.
    after_cr: bool,
}

impl<R: BufRead> Reader<R> {
    pub fn new(inner: R) -> Reader<R> {
        Reader {
            inner,
            line: Vec::new(),
            after_cr: false,
        }
    }

    /// The next whole event, or `None` at the end of the stream.
    pub fn next_event(&mut self) -> Result<Option<Event>, SseError> {
        let mut ev = Event::default();
        let mut has_data = false;
        let mut size = 0usize;
        loop {
            if !self.read_line()? {
                return Ok(None);
            }
            size = size.saturating_add(self.line.len() + 1);
            if size > MAX_EVENT {
                return Err(SseError::TooLong);
            }
            if self.line.is_empty() {
                if has_data || !ev.name.is_empty() {
                    return Ok(Some(ev));
                }
                continue;
            }
            let line = std::str::from_utf8(&self.line).map_err(|_| SseError::NotUtf8)?;
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "event" => ev.name = value.to_string(),
                "data" => {
                    if has_data {
                        ev.data.push('\n');
                    }
                    ev.data.push_str(value);
                    has_data = true;
                }
                // `id`, `retry` and unknown fields are ignored, as the standard says.
                _ => {}
            }
        }
    }

    /// Read one line into `self.line`, without its end. `false` at the end of the stream (a
    /// last line with no end is dropped: a cut stream).
    fn read_line(&mut self) -> Result<bool, SseError> {
        self.line.clear();
        loop {
            let buf = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(SseError::Io(e)),
            };
            if buf.is_empty() {
                return Ok(false);
            }
            let mut start = 0;
            if self.after_cr {
                self.after_cr = false;
                if buf[0] == b'\n' {
                    start = 1;
                }
            }
            match buf[start..].iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    let end = start + i;
                    if self.line.len() + (end - start) > MAX_EVENT {
                        return Err(SseError::TooLong);
                    }
                    self.line.extend_from_slice(&buf[start..end]);
                    self.after_cr = buf[end] == b'\r';
                    self.inner.consume(end + 1);
                    return Ok(true);
                }
                None => {
                    let n = buf.len();
                    if self.line.len() + (n - start) > MAX_EVENT {
                        return Err(SseError::TooLong);
                    }
                    self.line.extend_from_slice(&buf[start..]);
                    self.inner.consume(n);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufReader, Read};

    fn all(text: &[u8]) -> Vec<Event> {
        let mut r = Reader::new(BufReader::with_capacity(3, text));
        let mut out = Vec::new();
        while let Some(e) = r.next_event().unwrap() {
            out.push(e);
        }
        out
    }

    fn ev(name: &str, data: &str) -> Event {
        Event {
            name: name.into(),
            data: data.into(),
        }
    }

    #[test]
    fn data_lines_and_named_events() {
        let got =
            all(b"data: {\"a\":1}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\ndata: [DONE]\n\n");
        assert_eq!(
            got,
            [
                ev("", "{\"a\":1}"),
                ev("ping", "{\"type\": \"ping\"}"),
                ev("", "[DONE]")
            ]
        );
    }

    #[test]
    fn comments_are_keep_alives_and_are_skipped() {
        let got = all(b": OPENROUTER PROCESSING\n\n:\n\ndata: x\n\n");
        assert_eq!(got, [ev("", "x")]);
    }

    #[test]
    fn every_line_ending_is_a_line_ending() {
        let got = all(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n");
        assert_eq!(got, [ev("", "a"), ev("", "b"), ev("", "c")]);
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines() {
        let got = all(b"data: one\ndata:two\ndata\n\n");
        assert_eq!(got, [ev("", "one\ntwo\n")]);
    }

    #[test]
    fn a_cut_last_event_is_not_an_event() {
        assert_eq!(all(b"data: a\n\ndata: {\"cho"), [ev("", "a")]);
        assert_eq!(all(b"data: a\n\ndata: b\n"), [ev("", "a")]);
    }

    #[test]
    fn an_endless_line_is_refused() {
        let endless = std::io::repeat(b'a').take((MAX_EVENT + 10) as u64);
        let mut r = Reader::new(BufReader::new(endless));
        assert!(matches!(r.next_event(), Err(SseError::TooLong)));
    }

    #[test]
    fn an_endless_event_is_refused() {
        // Short lines, never a blank one: the event grows until it is refused.
        let body: Vec<u8> = b"data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n"
            .iter()
            .copied()
            .cycle()
            .take(2 * MAX_EVENT)
            .collect();
        let mut r = Reader::new(BufReader::new(body.as_slice()));
        assert!(matches!(r.next_event(), Err(SseError::TooLong)));
    }

    #[test]
    fn a_line_that_is_not_utf8_is_refused() {
        let mut r = Reader::new(BufReader::new(&b"data: \xff\xfe\n\n"[..]));
        assert!(matches!(r.next_event(), Err(SseError::NotUtf8)));
    }
}
