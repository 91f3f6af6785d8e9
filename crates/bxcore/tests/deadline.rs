//! The deadline is for the whole frame, not for each read.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bxcore::deadline::{Deadline, is_timeout};
use bxcore::{Envelope, FrameError, Message, read_frame, write_frame};

#[test]
fn a_peer_that_trickles_bytes_cannot_hold_a_reader_past_its_deadline() {
    let (reader, mut writer) = UnixStream::pair().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&done);
    // A valid frame's length, then one byte of its body every 20 ms for as long as anyone reads,
    // never the last one: the frame stays short of whole however slowly the reader runs.
    let trickler = thread::spawn(move || {
        writer.write_all(&100u32.to_be_bytes()).unwrap();
        let mut sent = 0;
        while !stop.load(Ordering::SeqCst) {
            if sent < 99 && writer.write_all(b" ").is_err() {
                break;
            }
            sent += 1;
            thread::sleep(Duration::from_millis(20));
        }
    });
    let mut r = Deadline::new(&reader, Instant::now() + Duration::from_millis(300));
    let err = read_frame(&mut r).unwrap_err();
    done.store(true, Ordering::SeqCst);
    drop(r);
    drop(reader);
    bxtest::join(trickler, "the trickler");
    assert!(err.is_timeout(), "{err:?}");
    assert!(matches!(err, FrameError::Io(ref e) if is_timeout(e)));
}

#[test]
fn a_deadline_already_past_times_out_without_reading() {
    let (reader, _writer) = UnixStream::pair().unwrap();
    let mut r = Deadline::new(&reader, Instant::now() - Duration::from_millis(1));
    let err = read_frame(&mut r).unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
}

#[test]
fn a_frame_that_arrives_in_time_is_read() {
    let (reader, mut writer) = UnixStream::pair().unwrap();
    write_frame(&mut writer, &Envelope::new(4, true, Message::Ping {})).unwrap();
    let mut r = Deadline::within(&reader, Duration::from_secs(30)).unwrap();
    assert_eq!(read_frame(&mut r).unwrap().id, 4);
}

#[test]
fn a_timeout_past_what_the_clock_holds_is_none() {
    let (reader, _writer) = UnixStream::pair().unwrap();
    assert!(Deadline::within(&reader, Duration::MAX).is_none());
}

#[test]
fn a_deadline_leaves_no_timeout_on_the_stream_it_read() {
    let (reader, mut writer) = UnixStream::pair().unwrap();
    write_frame(&mut writer, &Envelope::new(4, true, Message::Ping {})).unwrap();
    {
        let mut r = Deadline::within(&reader, Duration::from_millis(500)).unwrap();
        assert_eq!(read_frame(&mut r).unwrap().id, 4);
    }
    // Whoever reads the stream next (a clone shares the socket's timeout) waits as long as it
    // chooses, not what was left of the deadline.
    assert_eq!(reader.read_timeout().unwrap(), None);
    let clone = reader.try_clone().unwrap();
    assert_eq!(clone.read_timeout().unwrap(), None);
}
