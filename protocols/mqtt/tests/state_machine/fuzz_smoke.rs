//! Runs the fuzz bodies on mutations of valid sessions (a few thousand
//! deterministic cases), so the fuzz targets keep compiling and the
//! oracles hold on every `cargo test`. Real fuzzing: `cargo +nightly fuzz
//! run connection` in `protocols/mqtt/fuzz`.

use crate::fuzz_common::{run_connection, run_decoder};
use crate::harness::*;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Seed programs for `run_connection`: a mode byte (1: 3.1.1 CONNECT
/// first, 2: 5.0 CONNECT first, 4: 3.1.1 with pending commits), then
/// `0x60 | (len - 1)` control bytes each followed by `len` input bytes.
fn seeds() -> Vec<Vec<u8>> {
    let streams = [
        (
            1u8,
            [
                subscribe_v4(1, &[("f/#", 2)]),
                publish_v4("f/t", 2, 3, b"x"),
                pubrel(3),
            ]
            .concat(),
        ),
        (
            2u8,
            [pub_v5("f/t", 1, 1, b"x"), puback(1), pubrec(1), pubcomp(1)].concat(),
        ),
        (
            4u8,
            [
                publish_v4("a", 1, 2, b"yy"),
                unsubscribe(4, &["f/#"], false),
                vec![0xE0, 0],
            ]
            .concat(),
        ),
    ];
    streams
        .into_iter()
        .map(|(mode, s)| {
            let mut prog = vec![mode];
            for chunk in s.chunks(32) {
                prog.push(0x60 | (chunk.len() as u8 - 1));
                prog.extend_from_slice(chunk);
            }
            // A delivery and a commit after the packets.
            prog.extend_from_slice(&[0x23, 0x49, b'a', b'b', b'c', 0x41, 0x01]);
            prog
        })
        .collect()
}

#[test]
fn fuzz_bodies_hold_on_mutated_sessions() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let seeds = seeds();
    // The seeds reach deep states: CONNACK, SUBACK, PUBREC, PUBCOMP,
    // the delivery's PUBLISH...
    let written: Vec<usize> = seeds.iter().map(|s| run_connection(s)).collect();
    assert!(
        written[0] >= 5 && written.iter().all(|&n| n >= 2),
        "{written:?}"
    );
    for seed in &seeds {
        run_decoder(seed);
    }
    for round in 0..3000 {
        let mut data = seeds[round % seeds.len()].clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(data.len());
            match rng.below(4) {
                0 => data[at] ^= 1 << rng.below(8),
                1 => data[at] = rng.next() as u8,
                2 => data.truncate(at.max(1)),
                _ => data.insert(at, rng.next() as u8),
            }
        }
        run_connection(&data);
        run_decoder(&data);
    }
    // Pure noise too.
    for _ in 0..500 {
        let len = rng.below(200);
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        run_connection(&data);
        run_decoder(&data);
    }
}
