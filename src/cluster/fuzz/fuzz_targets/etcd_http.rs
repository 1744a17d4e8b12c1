//! An etcd endpoint's bytes into the JSON-gateway client
//! (`rosetta_cluster::etcd::fuzzing::read_response`: response head, body by
//! length, chunks or close, read whole as a call or as a watch's messages,
//! and every call's JSON decoder), over an in-memory endpoint that hands
//! out its bytes in fuzzer-chosen reads, now and then makes the client
//! wait, and at its end either closes or stalls (answers `Pending` and
//! never wakes).
//!
//! The first byte picks the mode and the knobs:
//! - raw: the rest is the whole response. Oracles: no panic; the reading
//!   is the same whatever the split into reads; what was read from the
//!   endpoint stays within the limits (head, then one read past the body
//!   limit at most).
//! - framed: the rest is a body the target frames itself (Content-Length,
//!   chunks of fuzzed sizes, or until the close), optionally declared or
//!   padded past the body limit. Oracles: a call reads exactly the body and
//!   a watch exactly its non-blank lines; every strict prefix that stalls
//!   asks for more (the read is still waiting); a body over the limit is
//!   refused, and no more than the limit and one read past it is taken
//!   from the endpoint.
#![no_main]

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};

use libfuzzer_sys::fuzz_target;
use rosetta_cluster::etcd::fuzzing::{
    read_response, Reading, ResponseReading, BODY_BYTES_MAX, READ_CHUNK_BYTES,
};
use tokio::io::{AsyncRead, ReadBuf};

/// Polls before a read is taken for one that never ends (each poll that
/// is not the last hands out at least one byte or one `Pending`).
const POLLS_MAX: usize = 1 << 24;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime")
    })
}

/// The endpoint: `input` in reads of at most `chunk` bytes, `Pending`
/// (with a wake) after every `pending_every` reads (never when 0), then
/// the end of the stream, or a stall when `stall_at_end`.
struct ScriptedEndpoint {
    input: Arc<Vec<u8>>,
    pos: usize,
    chunk: usize,
    pending_every: usize,
    reads: usize,
    stall_at_end: bool,
    /// Shared with the target: how far the client read.
    taken: Arc<std::sync::atomic::AtomicUsize>,
}

impl AsyncRead for ScriptedEndpoint {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.reads += 1;
        if self.pending_every > 0 && self.reads % (self.pending_every + 1) == 0 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let left = self.input.len() - self.pos;
        if left == 0 && self.stall_at_end {
            return Poll::Pending;
        }
        let n = self.chunk.min(buf.remaining()).min(left);
        let start = self.pos;
        buf.put_slice(&self.input[start..start + n]);
        self.pos += n;
        self.taken.store(self.pos, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Polls `future` until it is ready (`Some`) or waits with nothing to
/// wake it (`None`: it asks for more than the endpoint gave).
fn drive<F: Future>(future: F) -> Option<F::Output> {
    let _context = runtime().enter();
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    for _ in 0..POLLS_MAX {
        flag.0.store(false, Ordering::Relaxed);
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        if !flag.0.load(Ordering::Relaxed) {
            return None;
        }
    }
    panic!("a read that neither ends nor waits");
}

/// One reading of `input`: (the reading if it ended, bytes taken).
fn read(
    input: &Arc<Vec<u8>>,
    reading: Reading,
    chunk: usize,
    pending_every: usize,
    stall_at_end: bool,
) -> (Option<ResponseReading>, usize) {
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let endpoint = ScriptedEndpoint {
        input: Arc::clone(input),
        pos: 0,
        chunk,
        pending_every,
        reads: 0,
        stall_at_end,
        taken: Arc::clone(&taken),
    };
    let out = drive(read_response(endpoint, reading));
    (out, taken.load(Ordering::Relaxed))
}

/// How the framed mode frames its body.
#[derive(Clone, Copy, Debug)]
enum Framing {
    Length,
    Chunked,
    UntilClose,
}

/// A response carrying `body` as `framing` says; chunk sizes come from
/// `sizes` (cycled). With `declare`, the Content-Length says that many
/// bytes instead of the body's length.
fn framed(body: &[u8], framing: Framing, sizes: &[u8], declare: Option<usize>) -> (Vec<u8>, usize) {
    let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n".to_vec();
    match framing {
        Framing::Length => out.extend_from_slice(
            format!("Content-Length: {}\r\n", declare.unwrap_or(body.len())).as_bytes(),
        ),
        Framing::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        Framing::UntilClose => {}
    }
    out.extend_from_slice(b"\r\n");
    let head = out.len();
    match framing {
        Framing::Chunked => {
            let mut rest = body;
            let mut i = 0;
            while !rest.is_empty() {
                let size = sizes.get(i % sizes.len().max(1)).map_or(rest.len(), |s| {
                    // Small chunks mostly, now and then a large one.
                    if *s == 0xff { rest.len() } else { 1 + usize::from(*s) }
                });
                let (now, later) = rest.split_at(size.min(rest.len()));
                out.extend_from_slice(format!("{:x}\r\n", now.len()).as_bytes());
                out.extend_from_slice(now);
                out.extend_from_slice(b"\r\n");
                rest = later;
                i += 1;
            }
            out.extend_from_slice(b"0\r\n\r\n");
        }
        _ => out.extend_from_slice(body),
    }
    (out, head)
}

/// What a watch reads from a body: its non-blank lines.
fn lines(body: &[u8]) -> Vec<Vec<u8>> {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .map(<[u8]>::to_vec)
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, rest)) = data.split_first() else {
        return;
    };
    let Some((&more, rest)) = rest.split_first() else {
        return;
    };
    let reading = if knobs & 1 == 0 { Reading::Call } else { Reading::Watch };
    let chunk = 1 + usize::from(more) * 13;
    let pending_every = usize::from((knobs >> 2) & 3);
    if knobs & 2 == 0 {
        raw(rest, reading, chunk, pending_every);
    } else {
        framed_mode(knobs, more, rest, reading, chunk, pending_every);
    }
});

fn raw(rest: &[u8], reading: Reading, chunk: usize, pending_every: usize) {
    let input = Arc::new(rest.to_vec());
    let (split, taken) = read(&input, reading, chunk, pending_every, false);
    let (whole, _) = read(&input, reading, usize::MAX, 0, false);
    assert_eq!(split, whole, "the reading depends on how the bytes were split");
    let split = split.expect("a response that closes ends the read");
    for m in &split.messages {
        assert!(m.len() <= BODY_BYTES_MAX, "a {}-byte body over the limit", m.len());
    }
    assert!(taken <= input.len());
}

fn framed_mode(
    knobs: u8,
    more: u8,
    rest: &[u8],
    reading: Reading,
    chunk: usize,
    pending_every: usize,
) {
    // The body, then chunk sizes after a 0xfe 0xfe separator if any.
    let (body, sizes) = match rest.windows(2).position(|w| w == [0xfe, 0xfe]) {
        Some(at) => (&rest[..at], &rest[at + 2..]),
        None => (rest, &[][..]),
    };
    let framing = match ((knobs >> 4) & 3) % 3 {
        0 => Framing::Length,
        1 => Framing::Chunked,
        _ => Framing::UntilClose,
    };
    if knobs & 0x80 != 0 {
        over_the_limit(body, framing, sizes, more, reading, pending_every);
        return;
    }
    let (wire, head) = framed(body, framing, sizes, None);
    let input = Arc::new(wire);
    let (out, _) = read(&input, reading, chunk, pending_every, false);
    let out = out.expect("a whole response that closes ends the read");
    assert_eq!(out.status, Ok(200));
    assert_eq!(out.end, Ok(()), "a well-framed body failed");
    match reading {
        Reading::Call => assert_eq!(out.messages, vec![body.to_vec()], "the body read is not the body sent"),
        Reading::Watch => assert_eq!(out.messages, lines(body), "the messages read are not the lines sent"),
    }
    // A strict prefix that stalls asks for more (for a call; a watch may
    // have handed out messages, and waits for the next one either way).
    // Cuts: inside the head, right after it, and a fuzzed point.
    let cuts = [
        usize::from(more) % head.max(1),
        head,
        head + usize::from(more) * 7 % (input.len() - head + 1),
    ];
    for cut in cuts {
        if cut >= input.len() {
            continue;
        }
        let prefix = Arc::new(input[..cut].to_vec());
        let (out, _) = read(&prefix, reading, chunk, pending_every, true);
        if reading == Reading::Call {
            assert!(
                out.is_none(),
                "a {cut}-byte prefix of a {}-byte {framing:?} response did not ask for more: {out:?}",
                input.len()
            );
        }
    }
}

/// A body declared or sent past the limit: refused, and no more than the
/// limit and a read past it taken from the endpoint.
fn over_the_limit(
    body: &[u8],
    framing: Framing,
    sizes: &[u8],
    more: u8,
    reading: Reading,
    pending_every: usize,
) {
    let over = BODY_BYTES_MAX + 1 + usize::from(more);
    let (wire, head) = match framing {
        // Declared only: the bytes never come; the head alone refuses it.
        Framing::Length => framed(body, framing, sizes, Some(over)),
        // Sent: chunks or a stream of one long line (no newline, so a
        // watch's message is over the limit too).
        _ => {
            let mut big = body.iter().copied().filter(|b| *b != b'\n').collect::<Vec<u8>>();
            big.resize(over, b'x');
            framed(&big, framing, &[0xff], None)
        }
    };
    let input = Arc::new(wire);
    // Stall at the end: a refusal must not wait for bytes past the limit.
    let (out, taken) = read(&input, reading, READ_CHUNK_BYTES, pending_every, true);
    let out = out.expect("a body over the limit was waited for, not refused");
    assert!(
        out.status.is_err() || out.end.is_err(),
        "a {framing:?} body over the limit was taken: {:?}",
        out.messages.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let bound = head + BODY_BYTES_MAX + 2 * READ_CHUNK_BYTES + 64;
    assert!(taken <= bound, "read {taken} bytes for a refused body (bound {bound})");
}
