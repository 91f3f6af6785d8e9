//! Any bytes fed to `read_frame` give an envelope or an error, never a panic, and never more
//! than `4 + MAX_FRAME` bytes read; an envelope that decodes writes back and decodes the same.
#![no_main]

use std::io::Read;

use bxcore::{MAX_FRAME, read_frame, write_frame};
use libfuzzer_sys::fuzz_target;

struct Counting<'a> {
    inner: &'a [u8],
    read: usize,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n;
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Counting {
        inner: data,
        read: 0,
    };
    let got = read_frame(&mut r);
    assert!(r.read <= 4 + MAX_FRAME);
    if let Ok(env) = got {
        let mut out = Vec::new();
        write_frame(&mut out, &env).expect("a decoded envelope writes back");
        assert_eq!(
            read_frame(&mut out.as_slice()).expect("and decodes again"),
            env
        );
    }
});
