//! Header escaping per STOMP version.
//!
//! | version / frame          | `\n`  | `:`   | `\`   | `\r`  |
//! |--------------------------|-------|-------|-------|-------|
//! | 1.0, CONNECT, CONNECTED  | –     | –     | –     | –     |
//! | 1.1                      | `\n`  | `\c`  | `\\`  | –     |
//! | 1.2                      | `\n`  | `\c`  | `\\`  | `\r`  |
//!
//! Any other backslash sequence is a fatal error in 1.1 and 1.2 (the spec
//! says so). Where a value cannot be represented (a line break under 1.0
//! rules) the encoder replaces it with a space rather than break framing.

use std::borrow::Cow;

use crate::frame::{Command, Version};
use crate::parser::FrameError;

/// Which escaping rules apply to a frame's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escaping {
    /// No escaping: STOMP 1.0, and CONNECT/STOMP/CONNECTED in every version.
    None,
    /// STOMP 1.1 rules.
    V1_1,
    /// STOMP 1.2 rules (1.1 plus `\r`).
    V1_2,
}

impl Escaping {
    /// The rules for `command` under `version`.
    pub fn for_frame(version: Version, command: Command) -> Escaping {
        if !command.escapes_headers() {
            return Escaping::None;
        }
        match version {
            Version::V1_0 => Escaping::None,
            Version::V1_1 => Escaping::V1_1,
            Version::V1_2 => Escaping::V1_2,
        }
    }
}

/// Decodes one raw header name or value. Borrows when nothing needs
/// unescaping (the common case), allocates only for escaped text.
pub fn unescape(raw: &[u8], escaping: Escaping) -> Result<Cow<'_, str>, FrameError> {
    if escaping == Escaping::None || !raw.contains(&b'\\') {
        return std::str::from_utf8(raw)
            .map(Cow::Borrowed)
            .map_err(|_| FrameError::InvalidUtf8);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter();
    while let Some(&b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let decoded = match bytes.next() {
            Some(b'n') => b'\n',
            Some(b'c') => b':',
            Some(b'\\') => b'\\',
            Some(b'r') if escaping == Escaping::V1_2 => b'\r',
            Some(&other) => return Err(FrameError::BadEscape(char::from(other).to_string())),
            None => return Err(FrameError::BadEscape(String::new())),
        };
        out.push(decoded);
    }
    String::from_utf8(out)
        .map(Cow::Owned)
        .map_err(|_| FrameError::InvalidUtf8)
}

/// [`unescape`] of text already known to be UTF-8.
pub(crate) fn unescape_str(raw: &str, escaping: Escaping) -> Result<Cow<'_, str>, FrameError> {
    if escaping == Escaping::None || !raw.contains('\\') {
        return Ok(Cow::Borrowed(raw));
    }
    unescape(raw.as_bytes(), escaping)
}

/// Appends `text` to `out` escaped per `escaping`. `is_name` additionally
/// keeps a 1.0 header name free of `:` (which would end the name early).
#[inline]
pub fn escape_into(out: &mut Vec<u8>, text: &str, escaping: Escaping, is_name: bool) {
    escape_bytes_into(out, text.as_bytes(), escaping, is_name);
}

/// [`escape_into`] of the bytes of a `str` (or of UTF-8 kept as bytes).
#[inline]
pub(crate) fn escape_bytes_into(out: &mut Vec<u8>, text: &[u8], escaping: Escaping, is_name: bool) {
    // Almost every header needs no escape: copy it whole then (this runs
    // for every header of every MESSAGE, so this test is inlined and the
    // byte loop is not).
    if !may_need_escape(text) {
        out.extend_from_slice(text);
        return;
    }
    escape_bytes(out, text, escaping, is_name);
}

/// [`escape_into`] a byte at a time.
#[cold]
#[inline(never)]
fn escape_bytes(out: &mut Vec<u8>, text: &[u8], escaping: Escaping, is_name: bool) {
    for &b in text {
        match (escaping, b) {
            (Escaping::None, b'\n' | b'\r') => out.push(b' '),
            (Escaping::None, b':') if is_name => out.push(b'_'),
            (Escaping::None, _) => out.push(b),
            (_, b'\n') => out.extend_from_slice(b"\\n"),
            (_, b':') => out.extend_from_slice(b"\\c"),
            (_, b'\\') => out.extend_from_slice(b"\\\\"),
            (Escaping::V1_2, b'\r') => out.extend_from_slice(b"\\r"),
            _ => out.push(b),
        }
    }
}

/// Bytes below this include the two an escape may change (`\n`, `\r`)
/// and the other control bytes below `\r` (TAB, ...): one test for all,
/// and the rare control bytes take the byte loop, which keeps them.
const ESCAPE_CONTROL_BELOW: u8 = b'\r' + 1;

/// Whether `b` may hold a byte some escaping rule changes: `\n`, `\r`,
/// `:`, `\\` (and, conservatively, the control bytes below `\r`).
#[inline]
pub(crate) fn may_need_escape(b: &[u8]) -> bool {
    crate::swar::find_below_or(b, ESCAPE_CONTROL_BELOW, [b':', b'\\']).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_per_version() {
        assert_eq!(
            unescape(br"a\nb\cc\\d", Escaping::V1_1).unwrap(),
            "a\nb:c\\d"
        );
        assert_eq!(unescape(br"a\rb", Escaping::V1_2).unwrap(), "a\rb");
        assert!(matches!(
            unescape(br"a\rb", Escaping::V1_1),
            Err(FrameError::BadEscape(_))
        ));
        assert!(matches!(
            unescape(br"a\tb", Escaping::V1_2),
            Err(FrameError::BadEscape(_))
        ));
        assert!(matches!(
            unescape(b"trailing\\", Escaping::V1_2),
            Err(FrameError::BadEscape(_))
        ));
        assert_eq!(unescape(br"a\nb", Escaping::None).unwrap(), r"a\nb");
        assert!(matches!(
            unescape(br"x\n", Escaping::V1_2),
            Ok(Cow::Owned(_))
        ));
        assert!(matches!(
            unescape(b"plain", Escaping::V1_2),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn the_fast_check_finds_every_special_byte_at_every_position() {
        for len in 0..20 {
            let plain = vec![b'a'; len];
            assert!(!may_need_escape(&plain));
            for at in 0..len {
                for c in [b'\n', b'\r', b':', b'\\'] {
                    let mut t = plain.clone();
                    t[at] = c;
                    assert!(may_need_escape(&t), "{c} at {at} of {len}");
                }
                // Bytes next to the special ones, and high bytes, are not
                // (the control bytes below CR are, conservatively).
                for c in [b'\x0e', b';', b'[', b']', b'9', 0x8a, 0x8d, 0xba, 0xdc] {
                    let mut t = plain.clone();
                    t[at] = c;
                    assert!(!may_need_escape(&t), "{c} at {at} of {len}");
                }
            }
        }
    }

    #[test]
    fn control_bytes_other_than_line_ends_are_written_as_they_are() {
        for escaping in [Escaping::None, Escaping::V1_1, Escaping::V1_2] {
            let mut out = Vec::new();
            escape_into(&mut out, "a\tb\x0bc\x0c\x01", escaping, false);
            assert_eq!(out, b"a\tb\x0bc\x0c\x01", "{escaping:?}");
        }
    }

    #[test]
    fn escapes_per_version() {
        let mut out = Vec::new();
        escape_into(&mut out, "a:b\nc\\d\re", Escaping::V1_2, false);
        assert_eq!(out, br"a\cb\nc\\d\re");
        out.clear();
        escape_into(&mut out, "a:b\nc\re", Escaping::V1_1, false);
        assert_eq!(out, b"a\\cb\\nc\re");
        out.clear();
        escape_into(&mut out, "a:b\nc", Escaping::None, false);
        assert_eq!(out, b"a:b c");
        out.clear();
        escape_into(&mut out, "a:b", Escaping::None, true);
        assert_eq!(out, b"a_b");
    }
}
