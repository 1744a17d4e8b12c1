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

/// The first position of a byte of `b` that is one of `cs`.
pub(crate) fn find_any<const N: usize>(b: &[u8], cs: [u8; N]) -> Option<usize> {
    let mut words = b.chunks_exact(8);
    let mut at = 0;
    for w in &mut words {
        let x = word(w);
        let hits = cs.iter().fold(0, |acc, &c| acc | matches(x, c));
        if hits != 0 {
            // Little-endian: the lowest set bit is the first matching byte
            // (a false match can only follow a true one).
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|x| cs.contains(x))
        .map(|p| at + p)
}

/// Each byte of `x` that is zero gets its high bit set, exactly (no
/// false hits: each byte's sum stays within the byte).
fn zeros_exact(x: u64) -> u64 {
    const LOWS: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    !(((x & LOWS).wrapping_add(LOWS)) | x | LOWS)
}

/// Calls `visit(i, is_b)` for every position `i` of `a` or `b` in `bytes`,
/// in order (`is_b`: the byte there is `b`), while it returns `Ok(true)`.
pub(crate) fn each_of<E>(
    bytes: &[u8],
    a: u8,
    b: u8,
    mut visit: impl FnMut(usize, bool) -> Result<bool, E>,
) -> Result<(), E> {
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for w in &mut words {
        let x = word(w);
        let is_a = zeros_exact(x ^ (ONES * u64::from(a)));
        let is_b = zeros_exact(x ^ (ONES * u64::from(b)));
        let mut hits = is_a | is_b;
        while hits != 0 {
            let bit = hits.trailing_zeros();
            hits &= hits - 1;
            if !visit(at + (bit / 8) as usize, is_b >> bit & 1 == 1)? {
                return Ok(());
            }
        }
        at += 8;
    }
    for (i, &c) in words.remainder().iter().enumerate() {
        if (c == a || c == b) && !visit(at + i, c == b)? {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_of_visits_every_match_in_order() {
        let text: Vec<u8> = b"a:b\n;:\x0b\n::\x01\xba\x8a\x3b\nzz:".to_vec();
        for len in 0..=text.len() {
            let t = &text[..len];
            let want: Vec<(usize, bool)> = t
                .iter()
                .enumerate()
                .filter(|(_, &c)| c == b'\n' || c == b':')
                .map(|(i, &c)| (i, c == b':'))
                .collect();
            let mut got = Vec::new();
            let r: Result<(), ()> = each_of(t, b'\n', b':', |i, is_colon| {
                got.push((i, is_colon));
                Ok(true)
            });
            assert_eq!(r, Ok(()));
            assert_eq!(got, want, "{len}");
            // Stopping stops.
            let mut first = None;
            let _: Result<(), ()> = each_of(t, b'\n', b':', |i, _| {
                first = first.or(Some(i));
                Ok(false)
            });
            assert_eq!(first, want.first().map(|w| w.0));
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
