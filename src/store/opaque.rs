//! The value of a record that the store keeps without looking inside.
//!
//! The store knows which records exist, which keys (message seq, queue id)
//! they carry and which are still live, because compaction and recovery
//! need that; it does not know what a message is. A `Message` record's
//! body, and a retained message's, is [`Opaque`]: bytes that the core
//! encoded and will decode (see `rosetta_core::codec`).
//!
//! Writing takes the value still unencoded ([`Opaque::Deferred`]) so that the
//! group-commit writer encodes it straight into the entry buffer: a payload
//! is copied once, into the journal, not first into a temporary and then
//! again. Reading returns [`Opaque::Bytes`], a zero-copy slice of what was
//! read from disk.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

/// A value that knows how to write itself into a record.
pub trait EncodeOpaque: Send + Sync + 'static {
    /// Appends the encoding to `out`. It must be deterministic: compaction
    /// and tests compare encodings.
    fn encode(&self, out: &mut Vec<u8>);

    /// Roughly how many bytes [`EncodeOpaque::encode`] appends, so that the
    /// entry buffer rarely reallocates; need not be exact.
    fn encoded_len_hint(&self) -> usize;
}

/// Bytes the store keeps for its user without interpreting them.
#[derive(Clone)]
pub enum Opaque {
    /// Encoded already: what a read returns, or a value a test made up.
    Bytes(Bytes),
    /// Encoded by the writer into the journal entry.
    Deferred(Arc<dyn EncodeOpaque>),
}

impl Opaque {
    /// Appends the bytes to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        match self {
            Opaque::Bytes(b) => out.extend_from_slice(b),
            Opaque::Deferred(v) => v.encode(out),
        }
    }

    /// Roughly how many bytes [`Opaque::write_to`] appends.
    pub fn len_hint(&self) -> usize {
        match self {
            Opaque::Bytes(b) => b.len(),
            Opaque::Deferred(v) => v.encoded_len_hint(),
        }
    }

    /// The bytes, encoding a deferred value (a copy) if need be.
    pub fn to_bytes(&self) -> Bytes {
        match self {
            Opaque::Bytes(b) => b.clone(),
            Opaque::Deferred(v) => {
                let mut out = Vec::with_capacity(v.encoded_len_hint());
                v.encode(&mut out);
                Bytes::from(out)
            }
        }
    }
}

impl From<Bytes> for Opaque {
    fn from(b: Bytes) -> Self {
        Opaque::Bytes(b)
    }
}

/// Equal when the bytes are: a deferred value equals what it encodes to.
impl PartialEq for Opaque {
    fn eq(&self, other: &Self) -> bool {
        self.to_bytes() == other.to_bytes()
    }
}

impl fmt::Debug for Opaque {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opaque::Bytes(b) => write!(f, "Opaque({} bytes)", b.len()),
            Opaque::Deferred(v) => write!(f, "Opaque(deferred, ~{} bytes)", v.encoded_len_hint()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Repeat(u8, usize);

    impl EncodeOpaque for Repeat {
        fn encode(&self, out: &mut Vec<u8>) {
            out.resize(out.len() + self.1, self.0);
        }
        fn encoded_len_hint(&self) -> usize {
            self.1
        }
    }

    #[test]
    fn a_deferred_value_writes_and_compares_as_its_encoding() {
        let deferred = Opaque::Deferred(Arc::new(Repeat(7, 3)));
        let mut out = vec![1];
        deferred.write_to(&mut out);
        assert_eq!(out, [1, 7, 7, 7]);
        assert_eq!(deferred, Opaque::Bytes(Bytes::from_static(&[7, 7, 7])));
        assert_ne!(deferred, Opaque::Bytes(Bytes::from_static(&[7, 7])));
        assert_eq!(deferred.len_hint(), 3);
    }
}
