//! Byte searches eight bytes at a time ("SIMD within a register"), for
//! the scans every frame's head goes through: line ends, colons, bytes
//! that need an escape. Plain safe Rust on `u64` words; several times
//! fewer instructions per byte than a byte loop.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `x` that equals `c` is set (and possibly
/// of bytes above a match, never below the first one).
fn matches(x: u64, c: u8) -> u64 {
    let y = x ^ (ONES * u64::from(c));
    y.wrapping_sub(ONES) & !y & HIGHS
}

fn word(w: &[u8]) -> u64 {
    let mut eight = [0u8; 8];
    eight.copy_from_slice(w);
    u64::from_le_bytes(eight)
}

/// The first position in `b` of a byte that `word_hits` flags in its
/// 8-byte word (the byte's high bit) or, in the tail shorter than a word,
/// that `byte_hit` accepts. Little-endian: the lowest flag is the first
/// hit (a false flag can only follow a true one). Inlined into each
/// search, so the closures cost nothing.
#[inline(always)]
fn find_by(
    b: &[u8],
    word_hits: impl Fn(u64) -> u64,
    byte_hit: impl Fn(u8) -> bool,
) -> Option<usize> {
    let mut words = b.chunks_exact(8);
    let mut at = 0;
    for w in &mut words {
        let hits = word_hits(word(w));
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&x| byte_hit(x))
        .map(|p| at + p)
}

/// The first position of a byte of `b` that is one of `cs`.
pub(crate) fn find_any<const N: usize>(b: &[u8], cs: [u8; N]) -> Option<usize> {
    find_by(
        b,
        |x| cs.iter().fold(0, |acc, &c| acc | matches(x, c)),
        |x| cs.contains(&x),
    )
}

/// The high bit of each byte of `x` below `n` (`n` at most 0x80) is set
/// (and possibly of bytes above a match, never below the first one).
fn below(x: u64, n: u8) -> u64 {
    x.wrapping_sub(ONES * u64::from(n)) & !x & HIGHS
}

/// Bytes below this are control bytes a header line may only end with
/// (LF) or must not hold (NUL), or rare ones (TAB, ...) left to a slower
/// path: one test finds them all.
pub(crate) const CONTROL_BELOW: u8 = b'\n' + 1;

/// The first position of a byte of `b` below `n` (at most 0x80) or one
/// of `cs`: [`find_any`] with a range of control bytes in one test (LF
/// and NUL, or LF and CR, with their neighbours).
pub(crate) fn find_below_or<const N: usize>(b: &[u8], n: u8, cs: [u8; N]) -> Option<usize> {
    find_by(
        b,
        |x| cs.iter().fold(below(x, n), |acc, &c| acc | matches(x, c)),
        |x| x < n || cs.contains(&x),
    )
}

/// [`find_below_or`] below [`CONTROL_BELOW`].
pub(crate) fn find_control_or<const N: usize>(b: &[u8], cs: [u8; N]) -> Option<usize> {
    find_below_or(b, CONTROL_BELOW, cs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_control_byte_or_match_at_every_position_and_length() {
        for len in 0..24 {
            let plain = vec![b'a'; len];
            assert_eq!(find_control_or(&plain, [b':']), None);
            for first in 0..len {
                for c in [0u8, 1, b'\t', b'\n', b':'] {
                    for second in first..len {
                        let mut t = plain.clone();
                        t[first] = c;
                        t[second] = if second == first { c } else { 0 };
                        assert_eq!(
                            find_control_or(&t, [b':']),
                            Some(first),
                            "{c} at {first}, {second} of {len}"
                        );
                    }
                }
                // The bytes just past the range, high bytes, and bytes
                // whose subtraction borrows never match alone.
                for c in [0x0b, 0x0c, b'\r', 0x80, 0x8a, 0xff, b';'] {
                    let mut t = plain.clone();
                    t[first] = c;
                    assert_eq!(find_control_or(&t, [b':']), None, "{c} at {first}");
                }
            }
        }
    }

    #[test]
    fn the_range_test_is_exact_for_every_byte_and_bound() {
        for n in [1u8, CONTROL_BELOW, 0x0e, 0x41, 0x80] {
            for c in 0..=255u8 {
                for at in 0..8 {
                    // A filler at or above every bound (a high byte, where
                    // a borrow would show).
                    let mut t = [0xe0; 8];
                    t[at] = c;
                    let want = (c < n || c == b':').then_some(at);
                    assert_eq!(
                        find_below_or(&t, n, [b':']),
                        want,
                        "{c:#x} below {n:#x} at {at}"
                    );
                }
            }
        }
    }

    #[test]
    fn finds_the_first_match_at_every_position_and_length() {
        for len in 0..24 {
            let plain = vec![b'a'; len];
            assert_eq!(find_any(&plain, [b'\n', 0]), None);
            for first in 0..len {
                for second in first..len {
                    let mut t = plain.clone();
                    t[first] = b'\n';
                    t[second] = 0;
                    let want = Some(first);
                    assert_eq!(find_any(&t, [b'\n', 0]), want, "{first} {second} of {len}");
                    assert_eq!(find_any(&t, [0]), Some(second));
                }
                // Neighbours and high bytes never match.
                for c in [0x0b, 0x09, 0x01, 0x8a, 0x80, 0xff] {
                    let mut t = plain.clone();
                    t[first] = c;
                    assert_eq!(find_any(&t, [b'\n', 0]), None, "{c} at {first}");
                }
            }
        }
    }
}
