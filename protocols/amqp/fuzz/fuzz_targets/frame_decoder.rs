//! Arbitrary bytes into the frame decoder: it must return frames or errors,
//! never panic, and never hand out a frame larger than the limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rosetta_amqp::frame::FrameDecoder;

const MAX_FRAME: u32 = 4096;

fuzz_target!(|data: &[u8]| {
    // The first byte picks how the input is split, to exercise partial reads.
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(split).max(1);
    let mut d = FrameDecoder::new();
    let mut header_done = false;
    for piece in rest.chunks(chunk) {
        d.push(piece);
        if !header_done {
            match d.next_protocol_header() {
                Ok(Some(_)) => header_done = true,
                Ok(None) => continue,
                Err(_) => return,
            }
        }
        loop {
            match d.next_frame(MAX_FRAME) {
                Ok(Some(f)) => assert!(f.body.len() + 8 <= MAX_FRAME as usize),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    let _ = d.finish();
});
