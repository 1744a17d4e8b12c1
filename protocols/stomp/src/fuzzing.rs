//! For the cargo-fuzz target `fuzz/fuzz_targets/swar.rs` only (hidden from
//! the docs, not an API): the word-at-a-time fast paths beside the scalar
//! code they replace, so the target can check that they agree.

use crate::frame::{Command, Headers, Version};
use crate::parser::{FrameError, Limits};

/// What parsing a head gave.
pub type HeadResult = Result<(Command, Headers), FrameError>;

/// `swar::find_any` with the first four of `needles` (none: `None`).
pub fn find_any(b: &[u8], needles: &[u8]) -> Option<usize> {
    match *needles {
        [] => None,
        [a] => crate::swar::find_any(b, [a]),
        [a, c] => crate::swar::find_any(b, [a, c]),
        [a, c, d] => crate::swar::find_any(b, [a, c, d]),
        [a, c, d, e, ..] => crate::swar::find_any(b, [a, c, d, e]),
    }
}

/// The byte loop [`find_any`] replaces.
pub fn find_any_scalar(b: &[u8], needles: &[u8]) -> Option<usize> {
    let needles = needles.get(..needles.len().min(4)).unwrap_or_default();
    b.iter().position(|x| needles.contains(x))
}

/// The encoder's word-at-a-time test for bytes an escape may change.
pub fn may_need_escape(b: &[u8]) -> bool {
    crate::escape::may_need_escape(b)
}

/// The byte loop [`may_need_escape`] replaces (control bytes up to CR
/// count, as there).
pub fn may_need_escape_scalar(b: &[u8]) -> bool {
    b.iter().any(|c| *c <= b'\r' || matches!(c, b':' | b'\\'))
}

/// A complete head (command line, header lines, the blank line) parsed by
/// the UTF-8 path (word-at-a-time line and colon searches) and by the
/// field-by-field `nom` parse; `None` when the head is not UTF-8 (the
/// decoder then takes the `nom` parse alone).
pub fn parse_head_both(head: &[u8], version: Version) -> Option<(HeadResult, HeadResult)> {
    let text = std::str::from_utf8(head).ok()?;
    Some((
        crate::parser::parse_head_text(text, version),
        crate::parser::parse_head_bytes(head, version),
    ))
}

/// `swar::find_below_or` with the first three of `needles`.
pub fn find_below_or(b: &[u8], n: u8, needles: &[u8]) -> Option<usize> {
    match *needles {
        [] => crate::swar::find_below_or(b, n, []),
        [a] => crate::swar::find_below_or(b, n, [a]),
        [a, c] => crate::swar::find_below_or(b, n, [a, c]),
        [a, c, d, ..] => crate::swar::find_below_or(b, n, [a, c, d]),
    }
}

/// The byte loop [`find_below_or`] replaces.
pub fn find_below_or_scalar(b: &[u8], n: u8, needles: &[u8]) -> Option<usize> {
    let needles = needles.get(..needles.len().min(3)).unwrap_or_default();
    b.iter().position(|x| *x < n || needles.contains(x))
}

/// A complete head parsed by the decoder's one pass (when it takes it:
/// `None` when it leaves the head to the line by line scan) and by the
/// field-by-field `nom` parse.
pub fn parse_whole_head_both(
    head: &[u8],
    version: Version,
    limits: Limits,
) -> Option<(HeadResult, HeadResult)> {
    let (command, headers, _) = crate::parser::whole_head(head, limits)?;
    Some((
        Ok((command, headers)),
        crate::parser::parse_head_bytes(head, version),
    ))
}
