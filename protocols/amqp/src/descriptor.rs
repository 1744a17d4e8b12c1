//! Descriptors of AMQP described types, in both forms the spec allows.
//!
//! AMQP 1.0 §1.5: a descriptor is either a symbol (`amqp:open:list`) or
//! an ulong (`0x00000000:0x00000010`, domain id and descriptor id). Most
//! clients send the ulong; python-qpid-proton sends `amqp:declare:list`
//! and `amqp:discharge:list` for transaction control, and a peer may
//! send any described type either way. Every described type the broker
//! reads must therefore accept both.
//!
//! `serde_amqp` 0.18 accepts both forms for every type the broker
//! decodes with it (performatives, SASL frames, message sections,
//! delivery states, source, target, error, declare, discharge, lifetime
//! policies), in all four encodings (`smallulong`, `ulong`, `sym8`,
//! `sym32`): `symbolic_tests` checks each. What refused the symbolic form
//! was our own dispatch on the descriptor (which SASL frame, which message
//! section, declare or discharge). This module holds the one table of the
//! spec's descriptors ([`DESCRIPTORS`]) and [`descriptor_code`], which
//! reads a described value's code in either form for those places.
//!
//! [`to_symbolic`] re-encodes a value with every descriptor of the table,
//! at any depth, written as its symbol (recomputing the size of every
//! compound around it): for tests and tools that play a client writing
//! symbolic descriptors. The broker itself never needs it.
//!
//! Descriptors outside the table (vendor filters such as
//! `apache.org:no-local-filter:list`, `rosetta:retained`) are left as they
//! are: the code that reads them matches both forms itself.

use crate::codec::{self, CodecError};

/// Every described type of AMQP 1.0 (transport, messaging, transactions,
/// security), as (descriptor id, symbolic name). The domain id of all of
/// them is 0, so the ulong code is the descriptor id.
pub const DESCRIPTORS: &[(u64, &str)] = &[
    // Performatives (§2.7).
    (0x10, "amqp:open:list"),
    (0x11, "amqp:begin:list"),
    (0x12, "amqp:attach:list"),
    (0x13, "amqp:flow:list"),
    (0x14, "amqp:transfer:list"),
    (0x15, "amqp:disposition:list"),
    (0x16, "amqp:detach:list"),
    (0x17, "amqp:end:list"),
    (0x18, "amqp:close:list"),
    // Definitions (§2.8).
    (0x1d, "amqp:error:list"),
    // Delivery states (§3.4).
    (0x23, "amqp:received:list"),
    (0x24, "amqp:accepted:list"),
    (0x25, "amqp:rejected:list"),
    (0x26, "amqp:released:list"),
    (0x27, "amqp:modified:list"),
    // Terminus (§3.5).
    (0x28, "amqp:source:list"),
    (0x29, "amqp:target:list"),
    (0x2b, "amqp:delete-on-close:list"),
    (0x2c, "amqp:delete-on-no-links:list"),
    (0x2d, "amqp:delete-on-no-messages:list"),
    (0x2e, "amqp:delete-on-no-links-or-messages:list"),
    // Transactions (§4.5).
    (0x30, "amqp:coordinator:list"),
    (0x31, "amqp:declare:list"),
    (0x32, "amqp:discharge:list"),
    (0x33, "amqp:declared:list"),
    (0x34, "amqp:transactional-state:list"),
    // SASL (§5.3.3).
    (0x40, "amqp:sasl-mechanisms:list"),
    (0x41, "amqp:sasl-init:list"),
    (0x42, "amqp:sasl-challenge:list"),
    (0x43, "amqp:sasl-response:list"),
    (0x44, "amqp:sasl-outcome:list"),
    // Message sections (§3.2).
    (0x70, "amqp:header:list"),
    (0x71, "amqp:delivery-annotations:map"),
    (0x72, "amqp:message-annotations:map"),
    (0x73, "amqp:properties:list"),
    (0x74, "amqp:application-properties:map"),
    (0x75, "amqp:data:binary"),
    (0x76, "amqp:amqp-sequence:list"),
    (0x77, "amqp:amqp-value:*"),
    (0x78, "amqp:footer:map"),
];

/// Deepest nesting the re-encoder follows; the same bound as the checks
/// in `codec` (a crafted value must not recurse deeply here either).
const NESTING_MAX: usize = 32;

/// The code for a symbolic descriptor's name, if it is one of the spec's.
pub fn code_for_name(name: &[u8]) -> Option<u64> {
    DESCRIPTORS
        .iter()
        .find(|(_, n)| n.as_bytes() == name)
        .map(|(c, _)| *c)
}

/// The symbolic name for a descriptor code, if it is one of the spec's.
pub fn name_for_code(code: u64) -> Option<&'static str> {
    DESCRIPTORS
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| *n)
}

/// A descriptor as it is written: where it is, and what it says.
enum Written<'a> {
    /// `ulong0`, `smallulong` or `ulong`.
    Code(u64),
    /// `sym8` or `sym32`.
    Name(&'a [u8]),
}

/// Reads the descriptor at the start of `buf` (the bytes after `0x00`):
/// what it says and its encoded length. `None` when it is neither an
/// ulong nor a symbol, or is truncated.
fn read_descriptor(buf: &[u8]) -> Option<(Written<'_>, usize)> {
    match *buf.first()? {
        0x44 => Some((Written::Code(0), 1)),
        0x53 => Some((Written::Code(u64::from(*buf.get(1)?)), 2)),
        0x80 => {
            let b: [u8; 8] = buf.get(1..9)?.try_into().ok()?;
            Some((Written::Code(u64::from_be_bytes(b)), 9))
        }
        0xa3 => {
            let n = usize::from(*buf.get(1)?);
            Some((Written::Name(buf.get(2..2 + n)?), 2 + n))
        }
        0xb3 => {
            let b: [u8; 4] = buf.get(1..5)?.try_into().ok()?;
            let n = usize::try_from(u32::from_be_bytes(b)).ok()?;
            let end = 5usize.checked_add(n)?;
            Some((Written::Name(buf.get(5..end)?), end))
        }
        _ => None,
    }
}

/// The numeric code of the described value at the start of `buf` and the
/// length of `0x00` plus its descriptor: an ulong descriptor as written, a
/// symbolic one through [`DESCRIPTORS`]. `None` when `buf` does not start
/// with a described value whose descriptor is an ulong or a known symbol.
pub fn described_code(buf: &[u8]) -> Option<(u64, usize)> {
    if *buf.first()? != 0x00 {
        return None;
    }
    let (written, len) = read_descriptor(buf.get(1..)?)?;
    let code = match written {
        Written::Code(c) => c,
        Written::Name(n) => code_for_name(n)?,
    };
    Some((code, 1 + len))
}

/// The numeric code of the described value at the start of `buf`, in
/// either form (see [`described_code`]).
pub fn descriptor_code(buf: &[u8]) -> Option<u64> {
    described_code(buf).map(|(code, _)| code)
}

/// Which form [`rewrite`] writes known descriptors in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// The symbol, as `sym8` when it fits.
    Symbolic,
    /// The ulong code, as `smallulong` when it fits.
    #[cfg(test)]
    Numeric,
    /// The ulong code as a full 8-byte `ulong`, as some clients write it.
    #[cfg(test)]
    NumericWide,
    /// The symbol as `sym32`, as some clients write it.
    #[cfg(test)]
    SymbolicWide,
}

/// Re-encodes the value at the start of `buf` with every descriptor of
/// [`DESCRIPTORS`] written as its symbol, as python-qpid-proton writes
/// transaction control; returns the new encoding and the bytes of `buf`
/// it took. For tests and tools that act as such a client (the broker
/// itself never writes symbolic descriptors).
pub fn to_symbolic(buf: &[u8]) -> Result<(Vec<u8>, usize), CodecError> {
    rewrite(buf, Form::Symbolic)
}

/// [`to_symbolic`] for a run of whole values (a message's sections), value
/// by value.
pub fn to_symbolic_all(mut buf: &[u8]) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(buf.len() * 2);
    while !buf.is_empty() {
        let used = rewrite_value(buf, &mut out, 0, Form::Symbolic)?;
        buf = buf.get(used..).ok_or(CodecError::Truncated)?;
    }
    Ok(out)
}

/// Re-encodes the value at the start of `buf` with the spec's descriptors
/// in `form`; returns the new encoding and the bytes of `buf` it took.
pub(crate) fn rewrite(buf: &[u8], form: Form) -> Result<(Vec<u8>, usize), CodecError> {
    let mut out = Vec::with_capacity(buf.len() * 2);
    let used = rewrite_value(buf, &mut out, 0, form)?;
    Ok((out, used))
}

/// Writes the descriptor at the start of `buf` (the bytes after `0x00`)
/// in `form` and returns its length in `buf`; one outside the table, or
/// already in `form`, is copied.
fn write_descriptor(buf: &[u8], out: &mut Vec<u8>, form: Form) -> Result<usize, CodecError> {
    let (written, len) = read_descriptor(buf).ok_or(CodecError::Malformed {
        what: "descriptor",
        detail: "neither an ulong nor a symbol".into(),
    })?;
    let code = match written {
        Written::Code(c) => name_for_code(c).map(|_| c),
        Written::Name(n) => code_for_name(n),
    };
    let Some(code) = code else {
        // Not one of the spec's: copied as it came.
        out.extend_from_slice(buf.get(..len).ok_or(CodecError::Truncated)?);
        return Ok(len);
    };
    let name = name_for_code(code).unwrap_or_default();
    match form {
        #[cfg(test)]
        Form::Numeric => match u8::try_from(code) {
            Ok(small) => out.extend_from_slice(&[0x53, small]),
            Err(_) => {
                out.push(0x80);
                out.extend_from_slice(&code.to_be_bytes());
            }
        },
        Form::Symbolic => {
            codec::write_var_header(out, 0xa3, 0xb3, name.len());
            out.extend_from_slice(name.as_bytes());
        }
        #[cfg(test)]
        Form::NumericWide => {
            out.push(0x80);
            out.extend_from_slice(&code.to_be_bytes());
        }
        #[cfg(test)]
        Form::SymbolicWide => {
            out.push(0xb3);
            out.extend_from_slice(&u32::try_from(name.len()).unwrap_or(0).to_be_bytes());
            out.extend_from_slice(name.as_bytes());
        }
    }
    Ok(len)
}

/// Re-encodes one value (constructor and body); returns the bytes of
/// `buf` it took.
fn rewrite_value(
    buf: &[u8],
    out: &mut Vec<u8>,
    depth: usize,
    form: Form,
) -> Result<usize, CodecError> {
    if depth >= NESTING_MAX {
        return Err(CodecError::TooDeep);
    }
    let code = *buf.first().ok_or(CodecError::Truncated)?;
    if code == 0x00 {
        out.push(0x00);
        let rest = buf.get(1..).ok_or(CodecError::Truncated)?;
        let d = write_descriptor(rest, out, form)?;
        let value = rest.get(d..).ok_or(CodecError::Truncated)?;
        return Ok(1 + d + rewrite_value(value, out, depth + 1, form)?);
    }
    let body = buf.get(1..).ok_or(CodecError::Truncated)?;
    match compound_width(code) {
        None => {
            let n = scalar_len(code, body)?;
            out.extend_from_slice(buf.get(..1 + n).ok_or(CodecError::Truncated)?);
            Ok(1 + n)
        }
        Some(width) => {
            let (compound, used) = rewrite_compound(code, width, body, depth, form)?;
            let wide = compound.needs_wide();
            out.push(if wide { widen(code) } else { narrow(code) });
            compound.write(out, wide);
            Ok(1 + used)
        }
    }
}

/// A rewritten list, map or array: its element count and its content
/// (the items; for an array, its constructor and then the items).
struct Compound {
    count: usize,
    content: Vec<u8>,
}

impl Compound {
    /// Whether the size or count does not fit the one-byte form.
    fn needs_wide(&self) -> bool {
        self.count > 255 || self.content.len() + 1 > 255
    }

    /// Writes size, count and content, one- or four-byte.
    fn write(&self, out: &mut Vec<u8>, wide: bool) {
        if wide {
            // Our invariant: the input was at most a frame, and a rewrite
            // grows a descriptor by at most its table name.
            let size = u32::try_from(self.content.len() + 4).unwrap_or(u32::MAX);
            let count = u32::try_from(self.count).unwrap_or(u32::MAX);
            out.extend_from_slice(&size.to_be_bytes());
            out.extend_from_slice(&count.to_be_bytes());
        } else {
            out.push(u8::try_from(self.content.len() + 1).unwrap_or(u8::MAX));
            out.push(u8::try_from(self.count).unwrap_or(u8::MAX));
        }
        out.extend_from_slice(&self.content);
    }
}

/// Size/count width of a compound format code; `None` for other codes.
fn compound_width(code: u8) -> Option<usize> {
    match code {
        0xc0 | 0xc1 | 0xe0 => Some(1),
        0xd0 | 0xd1 | 0xf0 => Some(4),
        _ => None,
    }
}

fn widen(code: u8) -> u8 {
    match code {
        0xc0 => 0xd0,
        0xc1 => 0xd1,
        0xe0 => 0xf0,
        other => other,
    }
}

fn narrow(code: u8) -> u8 {
    match code {
        0xd0 => 0xc0,
        0xd1 => 0xc1,
        0xf0 => 0xe0,
        other => other,
    }
}

/// Length of the body of a non-compound value after its format code
/// (`codec`'s check, which reads sizes only for these codes).
fn scalar_len(code: u8, body: &[u8]) -> Result<usize, CodecError> {
    codec::check_body(code, body, 0)
}

/// Re-encodes the body of compound `code` (size, count, content) found at
/// the start of `buf`; returns it and the bytes of `buf` it took.
fn rewrite_compound(
    code: u8,
    width: usize,
    buf: &[u8],
    depth: usize,
    form: Form,
) -> Result<(Compound, usize), CodecError> {
    let size = codec::read_width(buf, 0, width)?;
    let end = width.checked_add(size).ok_or(CodecError::Truncated)?;
    let region = buf.get(width..end).ok_or(CodecError::Truncated)?;
    let count = codec::read_width(region, 0, width)?;
    let mut items = region.get(width..).ok_or(CodecError::Truncated)?;
    if count > items.len() {
        return Err(CodecError::BadCount {
            count,
            size: items.len(),
        });
    }
    let mut content = Vec::with_capacity(items.len());
    if code == 0xe0 || code == 0xf0 {
        rewrite_array_items(items, count, &mut content, depth, form)?;
    } else {
        for _ in 0..count {
            let n = rewrite_value(items, &mut content, depth + 1, form)?;
            items = items.get(n..).ok_or(CodecError::Truncated)?;
        }
    }
    Ok((Compound { count, content }, end))
}

/// An array's content: one constructor (its descriptor rewritten), then
/// `count` bodies of that type. Compound bodies are rewritten too, and
/// all of them take the width the widest one needs (an array has one
/// element constructor).
fn rewrite_array_items(
    mut items: &[u8],
    count: usize,
    content: &mut Vec<u8>,
    depth: usize,
    form: Form,
) -> Result<(), CodecError> {
    if depth + 1 >= NESTING_MAX {
        return Err(CodecError::TooDeep);
    }
    if items.first() == Some(&0x00) {
        content.push(0x00);
        let rest = items.get(1..).ok_or(CodecError::Truncated)?;
        let d = write_descriptor(rest, content, form)?;
        items = rest.get(d..).ok_or(CodecError::Truncated)?;
    }
    let elem = *items.first().ok_or(CodecError::Truncated)?;
    items = items.get(1..).ok_or(CodecError::Truncated)?;
    let Some(width) = compound_width(elem) else {
        let mut len = 0;
        for _ in 0..count {
            let rest = items.get(len..).ok_or(CodecError::Truncated)?;
            len += scalar_len(elem, rest)?;
        }
        content.push(elem);
        content.extend_from_slice(items.get(..len).ok_or(CodecError::Truncated)?);
        return Ok(());
    };
    let mut bodies = Vec::with_capacity(count.min(items.len()));
    for _ in 0..count {
        let (compound, used) = rewrite_compound(elem, width, items, depth + 1, form)?;
        items = items.get(used..).ok_or(CodecError::Truncated)?;
        bodies.push(compound);
    }
    let wide = bodies.iter().any(Compound::needs_wide);
    content.push(if wide { widen(elem) } else { narrow(elem) });
    for b in &bodies {
        b.write(content, wide);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite_numeric(buf: &[u8]) -> Result<(Vec<u8>, usize), CodecError> {
        rewrite(buf, Form::Numeric)
    }

    #[test]
    fn both_forms_give_the_code() {
        assert_eq!(descriptor_code(&[0x00, 0x53, 0x14, 0x45]), Some(0x14));
        assert_eq!(descriptor_code(&[0x00, 0x44, 0x45]), Some(0));
        let mut long = vec![0x00, 0x80];
        long.extend_from_slice(&0x41u64.to_be_bytes());
        assert_eq!(descriptor_code(&long), Some(0x41));
        let mut sym = vec![0x00, 0xa3, 17];
        sym.extend_from_slice(b"amqp:declare:list");
        sym.push(0x45);
        assert_eq!(descriptor_code(&sym), Some(0x31));
        let mut sym32 = vec![0x00, 0xb3, 0, 0, 0, 18];
        sym32.extend_from_slice(b"amqp:discharge:list");
        assert_eq!(descriptor_code(&sym32), None, "truncated name");
        sym32[5] = 19;
        assert_eq!(descriptor_code(&sym32), Some(0x32));
        let mut unknown = vec![0x00, 0xa3, 3];
        unknown.extend_from_slice(b"x:y");
        assert_eq!(descriptor_code(&unknown), None);
        assert_eq!(descriptor_code(&[0x45]), None);
        assert_eq!(descriptor_code(&[0x00, 0xa3, 200, b'a']), None);
    }

    #[test]
    fn every_code_and_name_round_trip() {
        for (code, name) in DESCRIPTORS {
            assert_eq!(code_for_name(name.as_bytes()), Some(*code));
            assert_eq!(name_for_code(*code), Some(*name));
        }
    }

    #[test]
    fn nested_descriptors_are_rewritten_and_sizes_recomputed() {
        // disposition [true, 0, null, true, accepted[]] with numeric
        // descriptors, as list8.
        let numeric = [
            0x00, 0x53, 0x15, 0xc0, 0x09, 0x05, 0x41, 0x43, 0x40, 0x41, 0x00, 0x53, 0x24, 0x45,
        ];
        let (symbolic, used) = to_symbolic(&numeric).unwrap();
        assert_eq!(used, numeric.len());
        let mut want = vec![0x00, 0xa3, 21];
        want.extend_from_slice(b"amqp:disposition:list");
        want.extend_from_slice(&[0xc0, 27, 0x05, 0x41, 0x43, 0x40, 0x41, 0x00, 0xa3, 18]);
        want.extend_from_slice(b"amqp:accepted:list");
        want.push(0x45);
        assert_eq!(symbolic, want);
        assert_eq!(
            rewrite_numeric(&symbolic).unwrap(),
            (numeric.to_vec(), want.len())
        );
    }

    #[test]
    fn growing_past_a_byte_widens_the_compound() {
        // An amqp-sequence of 20 `accepted` outcomes: a list8 of 80 bytes
        // numeric, more than 255 symbolic, so the list becomes a list32;
        // back numeric, a list8 again.
        let mut numeric = vec![0x00, 0x53, 0x76, 0xc0, 81, 20];
        for _ in 0..20 {
            numeric.extend_from_slice(&[0x00, 0x53, 0x24, 0x45]);
        }
        let (symbolic, _) = to_symbolic(&numeric).unwrap();
        let list_at = 3 + "amqp:amqp-sequence:list".len();
        assert_eq!(symbolic[list_at], 0xd0, "{symbolic:02x?}");
        assert_eq!(rewrite_numeric(&symbolic).unwrap().0, numeric);
    }

    #[test]
    fn arrays_keep_one_constructor() {
        // array8 of two described lists: [accepted[], accepted[]].
        let numeric = [
            0xe0, 0x09, 0x02, 0x00, 0x53, 0x24, 0xc0, 0x01, 0x00, 0x01, 0x00,
        ];
        let (symbolic, _) = to_symbolic(&numeric).unwrap();
        let mut want = vec![0xe0, 27, 0x02, 0x00, 0xa3, 18];
        want.extend_from_slice(b"amqp:accepted:list");
        want.extend_from_slice(&[0xc0, 0x01, 0x00, 0x01, 0x00]);
        assert_eq!(symbolic, want);
        assert_eq!(rewrite_numeric(&symbolic).unwrap().0, numeric);
    }

    #[test]
    fn unknown_descriptors_and_bad_input() {
        let mut vendor = vec![0x00, 0xa3, 31];
        vendor.extend_from_slice(b"apache.org:no-local-filter:list");
        vendor.push(0x45);
        assert_eq!(rewrite_numeric(&vendor).unwrap().0, vendor, "left as it is");
        assert!(rewrite_numeric(&[0xc0, 0x05, 0x01, 0x00, 0xa3]).is_err());
        assert!(rewrite_numeric(&[0xd0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1]).is_err());
        assert!(
            rewrite_numeric(&[0x00, 0x41, 0x45]).is_err(),
            "boolean descriptor"
        );
        assert!(rewrite_numeric(&[0x00; 64]).is_err());
        assert!(rewrite_numeric(&[]).is_err());
    }
}
