//! The STOMP parser's word-at-a-time ("SWAR") searches against the scalar
//! code they replaced: a differential target.
//!
//! The first byte picks the mode:
//! - search (1 in 4): `swar::find_any`, `swar::find_below_or` (a byte
//!   range and needles) and the encoder's escape test against byte
//!   loops, for 1-4 needles (the parser's own sets half the time, any
//!   bytes else) over every slice of the input that starts in
//!   its first 9 bytes and ends in its last 9: every alignment, and
//!   lengths either side of the 8-byte words. Bytes of 0x80 and above are
//!   where a carry or borrow would leak between bytes.
//! - head (1 in 4): a complete head through the UTF-8 path (word-at-a-time
//!   line and colon searches) and the field-by-field `nom` parse: the same
//!   command and headers, or the same error; and through the decoder's
//!   one-pass parse of a whole head, where it takes the head: the same
//!   command and headers.
//! - decoder (2 in 4): the same bytes decoded whole, a byte at a time and
//!   in chunks of a chosen size, under small limits: the same frames and
//!   the same error. The header line scan keeps its place between feeds
//!   and searches a word at a time, so each feeding gives it other slices
//!   of the same lines; the limits must be met in the order a byte loop
//!   meets them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rosetta_stomp::fuzzing::{
    find_any, find_any_scalar, find_below_or, find_below_or_scalar, may_need_escape,
    may_need_escape_scalar, parse_head_both, parse_whole_head_both,
};
use rosetta_stomp::{Decoder, Frame, FrameError, Limits, Version};

/// The needle sets the parser and encoder search for.
const PARSER_NEEDLES: [&[u8]; 4] = [b"\n\0", b"\n", b":", b"\n\r:\\"];
const COMMANDS: [&[u8]; 4] = [b"SEND\n", b"CONNECT\n", b"MESSAGE\n", b"SUBSCRIBE\r\n"];

fn version(b: u8) -> Version {
    match b % 3 {
        0 => Version::V1_0,
        1 => Version::V1_1,
        _ => Version::V1_2,
    }
}

fn check_search(knob: u8, rest: &[u8]) {
    let (needles, hay): (&[u8], &[u8]) = if knob & 0x80 == 0 {
        (PARSER_NEEDLES[usize::from(knob) % 4], rest)
    } else {
        let n = 1 + usize::from(knob) % 4;
        rest.split_at(n.min(rest.len()))
    };
    let len = hay.len();
    for start in 0..len.min(9) {
        for end in (len.saturating_sub(8).max(start)..=len).rev() {
            let b = &hay[start..end];
            assert_eq!(
                find_any(b, needles),
                find_any_scalar(b, needles),
                "find_any({needles:02x?}) over {start}..{end}"
            );
            assert_eq!(
                may_need_escape(b),
                may_need_escape_scalar(b),
                "may_need_escape over {start}..{end}"
            );
            // The range test with the bounds the parser and encoder use
            // and one from the input (at most 0x80).
            for n in [0x0b, 0x0e, 1 + knob % 0x80] {
                assert_eq!(
                    find_below_or(b, n, needles),
                    find_below_or_scalar(b, n, needles),
                    "find_below_or({n:#x}, {needles:02x?}) over {start}..{end}"
                );
            }
        }
    }
}

fn check_head(knob: u8, rest: &[u8]) {
    // A head as the decoder hands it over: no NUL, up to and with its
    // blank line.
    let mut head: Vec<u8> = Vec::new();
    if knob & 0x80 != 0 {
        head.extend_from_slice(COMMANDS[usize::from(knob >> 3) % 4]);
    }
    head.extend(rest.iter().copied().filter(|&b| b != 0));
    let end = head
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|p| p + 2)
        .into_iter()
        .chain(head.windows(3).position(|w| w == b"\n\r\n").map(|p| p + 3))
        .min();
    match end {
        Some(end) => head.truncate(end),
        None => head.extend_from_slice(b"\n\n"),
    }
    if let Some((text, bytes)) = parse_head_both(&head, version(knob)) {
        assert_eq!(text, bytes, "the UTF-8 head parse disagrees with nom's");
    }
    let limits = Limits {
        frame_size_max_bytes: 1 << 20,
        header_line_max_bytes: 1 << 20,
        headers_max: 1 << 20,
        body_size_max_bytes: 1 << 20,
    };
    if let Some((whole, bytes)) = parse_whole_head_both(&head, version(knob), limits) {
        assert_eq!(whole, bytes, "the one-pass head parse disagrees with nom's");
    }
}

/// Every frame the decoder returns for `input` fed in pieces of `chunk`
/// bytes, and the error it stopped at.
fn decode_all(input: &[u8], chunk: usize, limits: Limits, v: Version) -> (Vec<Frame>, Option<FrameError>) {
    let mut decoder = Decoder::new(limits, v);
    let mut frames = Vec::new();
    for mut piece in input.chunks(chunk.max(1)) {
        while !piece.is_empty() {
            let n = decoder.feed(piece);
            piece = &piece[n..];
            loop {
                match decoder.decode() {
                    Ok(Some(frame)) => frames.push(frame),
                    Ok(None) => break,
                    Err(e) => return (frames, Some(e)),
                }
            }
            if n == 0 {
                // Full and no frame out: decode reported nothing, which
                // the limits forbid.
                panic!("the decoder holds {} bytes and asks for more", decoder.buffered());
            }
        }
    }
    (frames, None)
}

fn check_decoder(knob: u8, rest: &[u8]) {
    let Some((&sizes, input)) = rest.split_first() else {
        return;
    };
    let limits = Limits {
        frame_size_max_bytes: 64 + usize::from(sizes & 0x0F) * 61,
        header_line_max_bytes: 5 + usize::from(sizes >> 4) * 7,
        headers_max: 1 + usize::from(knob >> 4),
        body_size_max_bytes: 256,
    };
    let v = version(knob);
    let whole = decode_all(input, input.len(), limits, v);
    let bytewise = decode_all(input, 1, limits, v);
    assert_eq!(whole, bytewise, "whole and a byte at a time decode differently");
    let chunk = 2 + usize::from(knob >> 2) % 16;
    let chunked = decode_all(input, chunk, limits, v);
    assert_eq!(whole, chunked, "whole and in {chunk}-byte pieces decode differently");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Some((&knob, rest)) = rest.split_first() else {
        return;
    };
    match mode % 4 {
        0 => check_search(knob, rest),
        1 => check_head(knob, rest),
        _ => check_decoder(knob, rest),
    }
});
