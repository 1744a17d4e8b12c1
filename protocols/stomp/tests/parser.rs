//! Decoder and encoder tests: STOMP 1.2 spec examples, edge cases, limits,
//! byte-at-a-time feeding and an encode → decode round trip.

// Helpers outside #[test] fns unwrap too: a panic is a test failure.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use rosetta_stomp::{Command, Decoder, Frame, FrameError, FrameWriter, Limits, Version};

const LIMITS: Limits = Limits {
    frame_size_max_bytes: 4096,
    header_line_max_bytes: 256,
    headers_max: 8,
    body_size_max_bytes: 2048,
};

/// Feeds `input` in chunks of `chunk` bytes, collecting frames until the
/// first error.
fn decode_chunked(input: &[u8], chunk: usize, version: Version) -> Result<Vec<Frame>, FrameError> {
    let mut d = Decoder::new(LIMITS, version);
    let mut frames = Vec::new();
    for piece in input.chunks(chunk.max(1)) {
        let mut rest = piece;
        loop {
            let n = d.feed(rest);
            rest = &rest[n..];
            while let Some(f) = d.decode()? {
                frames.push(f);
            }
            if rest.is_empty() {
                break;
            }
        }
    }
    Ok(frames)
}

/// Decodes whole and byte by byte, checks both agree, returns the frames.
fn decode(input: &[u8], version: Version) -> Result<Vec<Frame>, FrameError> {
    let whole = decode_chunked(input, input.len(), version);
    let bytewise = decode_chunked(input, 1, version);
    assert_eq!(whole, bytewise, "whole vs byte-at-a-time");
    whole
}

fn one(input: &[u8], version: Version) -> Frame {
    let mut frames = decode(input, version).unwrap();
    assert_eq!(frames.len(), 1, "{frames:?}");
    frames.remove(0)
}

fn err(input: &[u8], version: Version) -> FrameError {
    decode(input, version).unwrap_err()
}

#[test]
fn spec_connect_example() {
    let f = one(
        b"CONNECT\naccept-version:1.2\nhost:stomp.github.org\n\n\0",
        Version::V1_0,
    );
    assert_eq!(f.command, Command::Connect);
    assert_eq!(f.header("accept-version"), Some("1.2"));
    assert_eq!(f.header("host"), Some("stomp.github.org"));
    assert!(f.body.is_empty());
}

#[test]
fn spec_send_example_with_text_body() {
    let f = one(
        b"SEND\ndestination:/queue/a\ncontent-type:text/plain\n\nhello queue a\0",
        Version::V1_2,
    );
    assert_eq!(f.command, Command::Send);
    assert_eq!(f.header("destination"), Some("/queue/a"));
    assert_eq!(f.header("content-type"), Some("text/plain"));
    assert_eq!(&f.body[..], b"hello queue a");
    assert!(!f.has_content_length);
}

#[test]
fn spec_repeated_headers_first_wins() {
    let f = one(b"MESSAGE\nfoo:World\nfoo:Hello\n\n\0", Version::V1_2);
    assert_eq!(f.header("foo"), Some("World"));
    assert_eq!(f.headers.len(), 2, "repeats are kept");
}

#[test]
fn content_length_body_may_contain_nul() {
    let f = one(
        b"SEND\ndestination:/queue/a\ncontent-length:5\n\na\0b\0c\0",
        Version::V1_2,
    );
    assert_eq!(&f.body[..], b"a\0b\0c");
    assert!(f.has_content_length);
}

#[test]
fn crlf_line_endings_and_heart_beats_between_frames() {
    let input = b"\n\r\nSEND\r\ndestination:/queue/a\r\n\r\nx\0\n\n\r\nBEGIN\r\ntransaction:t\r\n\r\n\0\r\n";
    let frames = decode(input, Version::V1_2).unwrap();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0].header("destination"), Some("/queue/a"));
    assert_eq!(&frames[0].body[..], b"x");
    assert_eq!(frames[1].command, Command::Begin);
    assert_eq!(frames[1].header("transaction"), Some("t"));
}

#[test]
fn several_frames_in_one_read() {
    let mut input = Vec::new();
    for i in 0..5 {
        input.extend_from_slice(format!("SEND\ndestination:/queue/{i}\n\nbody{i}\0").as_bytes());
    }
    let frames = decode(&input, Version::V1_2).unwrap();
    assert_eq!(frames.len(), 5);
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(
            f.header("destination"),
            Some(format!("/queue/{i}").as_str())
        );
        assert_eq!(f.body, format!("body{i}").as_bytes());
    }
}

#[test]
fn partial_frame_waits_for_more() {
    let mut d = Decoder::new(LIMITS, Version::V1_2);
    d.feed(b"SEND\ndestination:/queue/a\ncontent-length:3\n\nab");
    assert_eq!(d.decode(), Ok(None));
    d.feed(b"c");
    assert_eq!(d.decode(), Ok(None), "NUL not yet here");
    d.feed(b"\0SEN");
    assert_eq!(&d.decode().unwrap().unwrap().body[..], b"abc");
    assert_eq!(d.decode(), Ok(None));
    assert_eq!(d.buffered(), 3);
}

#[test]
fn escapes_follow_the_version() {
    let input = b"SEND\nk\\cey:a\\nb\\\\c\\cd\n\n\0";
    let f12 = one(input, Version::V1_2);
    assert_eq!(f12.header("k:ey"), Some("a\nb\\c:d"));
    let f11 = one(input, Version::V1_1);
    assert_eq!(f11.header("k:ey"), Some("a\nb\\c:d"));
    let f10 = one(input, Version::V1_0);
    assert_eq!(f10.header("k\\cey"), Some("a\\nb\\\\c\\cd"));
    assert_eq!(
        one(b"SEND\nk:a\\rb\n\n\0", Version::V1_2).header("k"),
        Some("a\rb")
    );
    assert!(matches!(
        err(b"SEND\nk:a\\rb\n\n\0", Version::V1_1),
        FrameError::BadEscape(_)
    ));
    assert!(matches!(
        err(b"SEND\nk:a\\tb\n\n\0", Version::V1_2),
        FrameError::BadEscape(_)
    ));
}

#[test]
fn connect_headers_are_never_unescaped() {
    let f = one(b"CONNECT\nlogin:a\\cb\npasscode:x\\y\n\n\0", Version::V1_2);
    assert_eq!(f.header("login"), Some("a\\cb"));
    assert_eq!(f.header("passcode"), Some("x\\y"));
}

#[test]
fn value_may_contain_colons() {
    let f = one(b"SEND\nurl:http://x:80/\n\n\0", Version::V1_0);
    assert_eq!(f.header("url"), Some("http://x:80/"));
}

/// The headers of `f` as owned pairs, in wire order.
fn pairs(f: &Frame) -> Vec<(String, String)> {
    f.headers
        .iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect()
}

/// A SEND with the headers a publisher sends (known and not, repeated,
/// empty, with colons in values, CRLF) parses the same whole, split at
/// every byte, and a byte at a time: the whole head is parsed in the pass
/// that finds its end, a split one after its last piece.
#[test]
fn a_head_parses_the_same_whole_and_split_anywhere() {
    let input: &[u8] = b"SEND\r\ndestination:/queue/a:b\r\nreceipt:1\r\nx-custom:\r\n\
receipt:2\r\nurl:http://h:80/p\r\ncontent-type:text/plain\r\ncontent-length:3\r\n\r\nabc\0";
    let f = one(input, Version::V1_2);
    assert_eq!(f.header("destination"), Some("/queue/a:b"));
    assert_eq!(f.header("receipt"), Some("1"), "the first one wins");
    assert_eq!(f.header("x-custom"), Some(""));
    assert_eq!(f.header("url"), Some("http://h:80/p"));
    assert_eq!(f.header("content-type"), Some("text/plain"));
    assert_eq!(f.header("Destination"), None, "names are case-sensitive");
    let want = [
        ("destination", "/queue/a:b"),
        ("receipt", "1"),
        ("x-custom", ""),
        ("receipt", "2"),
        ("url", "http://h:80/p"),
        ("content-type", "text/plain"),
        ("content-length", "3"),
    ]
    .map(|(n, v)| (n.to_owned(), v.to_owned()));
    assert_eq!(pairs(&f), want);
    assert_eq!(&f.body[..], b"abc");
    for split in 1..input.len() {
        let mut d = Decoder::new(LIMITS, Version::V1_2);
        let mut frames = Vec::new();
        for piece in [&input[..split], &input[split..]] {
            assert_eq!(d.feed(piece), piece.len());
            while let Some(got) = d.decode().unwrap() {
                frames.push(got);
            }
        }
        assert_eq!(frames, std::slice::from_ref(&f), "split at {split}");
    }
}

/// A head the one-pass parse leaves to the line-by-line one (a TAB or
/// another control byte in a value, a backslash in 1.0) reads as before.
#[test]
fn heads_with_rare_bytes_parse_as_before() {
    let f = one(b"SEND\nk:a\tb\x01c\nreceipt:7\n\n\0", Version::V1_2);
    assert_eq!(f.header("k"), Some("a\tb\x01c"));
    assert_eq!(f.header("receipt"), Some("7"));
    let f = one(b"SEND\nk:a\\b\nreceipt:7\n\n\0", Version::V1_0);
    assert_eq!(f.header("k"), Some("a\\b"));
    assert_eq!(f.header("receipt"), Some("7"));
}

/// Escapes in known headers are undone (1.1, 1.2) and the headers are
/// still found by name; 1.0 and CONNECT keep them as they are.
#[test]
fn escaped_known_headers_are_found_unescaped() {
    let input = b"SEND\ndestination:/queue/a\\cb\nreceipt:r\\\\1\nk:v\n\n\0";
    let f = one(input, Version::V1_2);
    assert_eq!(f.header("destination"), Some("/queue/a:b"));
    assert_eq!(f.header("receipt"), Some("r\\1"));
    assert_eq!(f.header("k"), Some("v"));
    let f10 = one(input, Version::V1_0);
    assert_eq!(f10.header("destination"), Some("/queue/a\\cb"));
    assert_eq!(f10.header("receipt"), Some("r\\\\1"));
    // An escaped name that spells a known one is that header.
    let f = one(
        b"SEND\nreceipt\\c:x\nre\\\\ceipt:y\nreceipt:z\n\n\0",
        Version::V1_2,
    );
    assert_eq!(f.header("receipt:"), Some("x"));
    assert_eq!(f.header("re\\ceipt"), Some("y"));
    assert_eq!(f.header("receipt"), Some("z"));
}

/// A bad line after good ones is found, and the first bad line decides
/// the error, as in a parse line by line.
#[test]
fn the_first_bad_header_line_decides_the_error() {
    let v = Version::V1_2;
    assert_eq!(
        err(b"SEND\ndestination:/queue/a\nreceipt:1\nnocolon\n\n\0", v),
        FrameError::MissingColon
    );
    assert_eq!(
        err(b"SEND\ndestination:/queue/a\n:v\n\n\0", v),
        FrameError::EmptyHeaderName
    );
    assert_eq!(
        err(b"SEND\nk:\xff\nnocolon\n\n\0", v),
        FrameError::InvalidUtf8
    );
    assert_eq!(
        err(b"SEND\nnocolon\nk:\xff\n\n\0", v),
        FrameError::MissingColon
    );
    assert!(matches!(
        err(b"SEND\nk:a\\tb\nnocolon\n\n\0", v),
        FrameError::BadEscape(_)
    ));
    // Limits met later in the head still come first (they are checked
    // as the bytes arrive).
    let mut many = b"SEND\nnocolon\n".to_vec();
    for i in 0..9 {
        many.extend_from_slice(format!("h{i}:v\n").as_bytes());
    }
    many.extend_from_slice(b"\n\0");
    assert_eq!(err(&many, v), FrameError::TooManyHeaders { max: 8 });
}

#[test]
fn malformed_input_is_rejected() {
    let v = Version::V1_2;
    assert_eq!(
        err(b"FOO\n\n\0", v),
        FrameError::UnknownCommand("FOO".into())
    );
    assert_eq!(
        err(b"send\n\n\0", v),
        FrameError::UnknownCommand("send".into())
    );
    assert_eq!(
        err(b"\x16\x03\x01\x02\x00", v),
        FrameError::Garbage,
        "TLS hello"
    );
    assert_eq!(err(b"GET / HTTP/1.1\r\n", v), FrameError::Garbage);
    assert_eq!(err(b"SEND\nnocolon\n\n\0", v), FrameError::MissingColon);
    assert_eq!(err(b"SEND\n:v\n\n\0", v), FrameError::EmptyHeaderName);
    assert_eq!(err(b"SEND\nk:v\0\n\n\0", v), FrameError::NulInHead);
    assert_eq!(
        err(b"SEND\ncontent-length:x\n\n\0", v),
        FrameError::BadContentLength("x".into())
    );
    assert_eq!(
        err(b"SEND\ncontent-length:1\n\nab\0", v),
        FrameError::MissingNul
    );
    assert_eq!(err(b"SEND\nk:\xff\n\n\0", v), FrameError::InvalidUtf8);
}

#[test]
fn limits_are_checked_before_buffering() {
    let v = Version::V1_2;
    // A declared body over the limit fails as soon as the head is complete.
    let mut d = Decoder::new(LIMITS, v);
    d.feed(b"SEND\ncontent-length:999999\n\n");
    assert_eq!(d.decode(), Err(FrameError::BodyTooLarge { max: 2048 }));
    // A declared body that fits the body limit but not the frame limit.
    let limits = Limits {
        body_size_max_bytes: 4096,
        ..LIMITS
    };
    let mut d = Decoder::new(limits, v);
    d.feed(b"SEND\ncontent-length:4090\n\n");
    assert_eq!(d.decode(), Err(FrameError::FrameTooLarge { max: 4096 }));
    // A long header line fails before its end arrives.
    let mut d = Decoder::new(LIMITS, v);
    d.feed(b"SEND\nk:");
    d.feed(&[b'a'; 300]);
    assert_eq!(d.decode(), Err(FrameError::HeaderLineTooLong { max: 256 }));
    // A header line of exactly the limit (CR included, LF not) is fine,
    // one byte more is not; a NUL at the limit is a NUL.
    let line = |len: usize, end: &[u8]| {
        let mut f = b"SEND\nk:".to_vec();
        f.resize(5 + len, b'a');
        f.extend_from_slice(end);
        f
    };
    assert_eq!(one(&line(256, b"\n\n\0"), v).headers.len(), 1);
    assert_eq!(one(&line(255, b"\r\n\n\0"), v).headers.len(), 1);
    assert_eq!(
        err(&line(257, b"\n\n\0"), v),
        FrameError::HeaderLineTooLong { max: 256 }
    );
    assert_eq!(err(&line(256, b"\0"), v), FrameError::NulInHead);
    // Header count.
    let mut many = b"SEND\n".to_vec();
    for i in 0..9 {
        many.extend_from_slice(format!("h{i}:v\n").as_bytes());
    }
    assert_eq!(err(&many, v), FrameError::TooManyHeaders { max: 8 });
    // Exactly the limit is fine.
    let mut ok = b"SEND\n".to_vec();
    for i in 0..8 {
        ok.extend_from_slice(format!("h{i}:v\n").as_bytes());
    }
    ok.extend_from_slice(b"\n\0");
    assert_eq!(one(&ok, v).headers.len(), 8);
    // A missing NUL shows up as an over-long body, after at most the limit.
    let mut no_nul = b"SEND\ndestination:/queue/a\n\n".to_vec();
    no_nul.extend_from_slice(&[b'x'; 2100]);
    assert_eq!(err(&no_nul, v), FrameError::BodyTooLarge { max: 2048 });
    // The decoder never holds more than a frame.
    let mut d = Decoder::new(LIMITS, v);
    let taken = d.feed(&[b'\n'; 10_000]);
    assert_eq!(taken, 4096);
}

/// Found by the `swar` fuzz target (protocols/FUZZING.md, finding 9):
/// a body without `content-length` that arrived in one read with its NUL
/// was not held to the body limit; a byte at a time it was.
#[test]
fn a_body_over_the_limit_fails_when_its_nul_arrives_in_the_same_read() {
    let v = Version::V1_2;
    let frame = |body: usize| {
        let mut f = b"SEND\ndestination:/queue/a\n\n".to_vec();
        f.resize(f.len() + body, b'x');
        f.push(0);
        f
    };
    let mut d = Decoder::new(LIMITS, v);
    d.feed(&frame(2049));
    assert_eq!(d.decode(), Err(FrameError::BodyTooLarge { max: 2048 }));
    let mut d = Decoder::new(LIMITS, v);
    d.feed(&frame(2048));
    let body = d.decode().map(|f| f.map(|f| f.body.len()));
    assert_eq!(body, Ok(Some(2048)), "exactly the limit is fine");
    assert_eq!(err(&frame(2049), v), FrameError::BodyTooLarge { max: 2048 });
}

#[test]
fn command_line_garbage_fails_at_once() {
    let mut d = Decoder::new(LIMITS, Version::V1_0);
    d.feed(b"CONN\x01");
    assert_eq!(d.decode(), Err(FrameError::Garbage));
    let mut d = Decoder::new(LIMITS, Version::V1_0);
    d.feed(&[b'A'; 40]);
    assert!(matches!(d.decode(), Err(FrameError::UnknownCommand(_))));
}

#[test]
fn body_is_split_off_the_read_buffer_without_copy() {
    let mut d = Decoder::new(LIMITS, Version::V1_2);
    d.feed(b"SEND\ncontent-length:4\n\nabcd\0SEND\n\nefgh\0");
    let a = d.decode().unwrap().unwrap();
    let b = d.decode().unwrap().unwrap();
    // Both bodies are views into the one allocation the bytes were read into.
    let gap = b.body.as_ptr() as usize - a.body.as_ptr() as usize;
    assert_eq!(gap, "abcd\0SEND\n\n".len());
}

fn encode_message(version: Version, headers: &[(String, String)], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = FrameWriter::new(&mut out, version, Command::Message);
    for (n, v) in headers {
        w.header(n, v);
    }
    w.finish(body);
    out
}

#[test]
fn encoder_writes_spec_shapes() {
    let out = encode_message(Version::V1_2, &[("k:1".into(), "a\nb\r\\".into())], b"x\0y");
    assert_eq!(
        out,
        b"MESSAGE\nk\\c1:a\\nb\\r\\\\\ncontent-length:3\n\nx\0y\0".to_vec()
    );
    let mut connected = Vec::new();
    FrameWriter::new(&mut connected, Version::V1_2, Command::Connected)
        .header("server", "a:b")
        .finish(b"");
    assert_eq!(connected, b"CONNECTED\nserver:a:b\n\n\0".to_vec());
}

fn header_text(with_cr: bool) -> impl Strategy<Value = String> {
    let chars: Vec<char> = if with_cr {
        vec![
            'a', 'Z', '0', ':', '\n', '\r', '\\', ' ', 'é', '✓', 'c', 'n', 'r',
        ]
    } else {
        vec!['a', 'Z', '0', ':', '\n', '\\', ' ', 'é', '✓', 'c', 'n', 'r']
    };
    proptest::collection::vec(proptest::sample::select(chars), 0..12)
        .prop_map(|v| v.into_iter().collect())
}

proptest! {
    #[test]
    fn encode_then_decode_round_trips_1_2(
        headers in proptest::collection::vec(
            (header_text(true).prop_filter("non-empty", |s| !s.is_empty()), header_text(true)),
            0..6,
        ),
        body in proptest::collection::vec(any::<u8>(), 0..64),
        chunk in 1usize..40,
    ) {
        let bytes = encode_message(Version::V1_2, &headers, &body);
        let frames = decode_chunked(&bytes, chunk, Version::V1_2).unwrap();
        prop_assert_eq!(frames.len(), 1);
        let f = &frames[0];
        let got: Vec<(String, String)> =
            f.headers.iter().map(|(n, v)| (n.to_owned(), v.to_owned())).collect();
        prop_assert_eq!(&got[..headers.len()], &headers[..]);
        prop_assert_eq!(&f.body[..], &body[..]);
    }

    #[test]
    fn encode_then_decode_round_trips_1_1(
        headers in proptest::collection::vec(
            (header_text(false).prop_filter("non-empty", |s| !s.is_empty()), header_text(false)),
            0..6,
        ),
    ) {
        let bytes = encode_message(Version::V1_1, &headers, b"");
        let f = &decode_chunked(&bytes, 7, Version::V1_1).unwrap()[0];
        let got: Vec<(String, String)> =
            f.headers.iter().map(|(n, v)| (n.to_owned(), v.to_owned())).collect();
        prop_assert_eq!(&got[..headers.len()], &headers[..]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_chunked(&input, 3, Version::V1_2);
    }

    /// Frame-shaped input (commands, header lines of every length around
    /// the limit, NULs, CRs) decodes to the same frames, or fails with the
    /// same error, whether it arrives whole, byte by byte, or in chunks:
    /// the head is scanned a line at a time when a line is complete and a
    /// byte at a time otherwise, and both must meet the limits in the same
    /// order.
    #[test]
    fn splitting_the_input_never_changes_the_outcome(
        pieces in proptest::collection::vec(
            prop_oneof![
                Just(b"SEND\n".to_vec()),
                Just(b"MESSAGE\r\n".to_vec()),
                Just(b"SE ND\n".to_vec()),
                Just(b"a:b\n".to_vec()),
                Just(b"content-length:3\n".to_vec()),
                Just(b"\n".to_vec()),
                Just(b"\r".to_vec()),
                Just(b"\0".to_vec()),
                Just(b"xyz".to_vec()),
                (1usize..300).prop_map(|n| vec![b'h'; n]),
            ],
            0..24,
        ),
        chunk in 1usize..64,
    ) {
        let input: Vec<u8> = pieces.concat();
        let whole = decode_chunked(&input, input.len(), Version::V1_2);
        prop_assert_eq!(&whole, &decode_chunked(&input, 1, Version::V1_2));
        prop_assert_eq!(&whole, &decode_chunked(&input, chunk, Version::V1_2));
    }
}
