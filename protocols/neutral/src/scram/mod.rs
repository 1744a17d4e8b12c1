//! SCRAM-SHA-256 (RFC 5802, RFC 7677), without IO and without a wire
//! format: the one implementation behind AMQP's SASL layer and MQTT 5's
//! enhanced authentication (AUTH packets). Each adapter only moves the
//! messages below in and out of its own frames.
//!
//! ```text
//! client                                   server
//! client-first  n,,n=user,r=cnonce   ->    server_first()
//!                                    <-    r=cnonce+snonce,s=salt,i=4096
//! client-final  c=biws,r=…,p=proof   ->    ScramPending::server_final()
//!                                    <-    v=ServerSignature
//! ```
//!
//! - [`server_first`] parses client-first (GS2 header, channel-binding
//!   flag, user name, client nonce) and answers server-first; the returned
//!   [`ScramPending`] holds what the second round trip needs.
//! - [`ScramPending::server_final`] checks client-final (channel-binding
//!   data, nonce, proof, compared in constant time) and answers
//!   server-final, which proves to the client that we know its
//!   credentials too.
//! - [`ScramClient`] is the client side, for tests and tools (the broker
//!   never uses it); [`derive_credentials`] computes what a users file
//!   stores for a password.
//!
//! The server verifies the proof against stored [`ScramCredentials`]
//! (`StoredKey`, `ServerKey`), so the password never reaches it. An unknown
//! user gets made-up credentials and fails at the proof exactly like a
//! wrong password, so user names cannot be probed.
//!
//! Not supported, refused with [`ScramError::Unsupported`]: channel binding
//! (`p=` in the GS2 header) and mandatory extensions (`m=`). SASLprep is not
//! applied: user names and passwords are used as given.

mod client;
mod server;
#[cfg(test)]
mod tests;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::ScramCredentials;

pub use client::ScramClient;
pub use server::{server_first, ScramPending};

/// The mechanism name, in AMQP's sasl-mechanisms and as MQTT 5's
/// Authentication Method.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// Longest SCRAM message accepted, in bytes: user names and nonces are
/// short, and this bounds what one exchange keeps in memory.
pub const MESSAGE_LEN_MAX_BYTES: usize = 1024;

/// Bytes of randomness in a nonce (RFC 5802 asks for "sufficient").
const NONCE_BYTES: usize = 18;

type HmacSha256 = Hmac<Sha256>;

/// Why a SCRAM exchange failed. Every variant ends the authentication.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// The message does not follow RFC 5802 (or is longer than
    /// [`MESSAGE_LEN_MAX_BYTES`]).
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// Something the server does not offer (channel binding, extensions).
    #[error("SCRAM feature not supported: {0}")]
    Unsupported(&'static str),
    /// Wrong password or unknown user (deliberately not told apart).
    #[error("bad user name or password")]
    BadCredentials,
}

/// The stored credentials for `password` (RFC 5802 section 3):
///
/// ```text
/// SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations)
/// StoredKey      = SHA-256(HMAC(SaltedPassword, "Client Key"))
/// ServerKey      = HMAC(SaltedPassword, "Server Key")
/// ```
///
/// The cost is `iterations` HMACs; bounding it is the caller's job.
pub fn derive_credentials(password: &[u8], salt: &[u8], iterations: u32) -> ScramCredentials {
    let salted = salted_password(password, salt, iterations);
    ScramCredentials {
        salt: salt.to_vec(),
        iterations,
        stored_key: Sha256::digest(hmac(&salted, b"Client Key")).into(),
        server_key: hmac(&salted, b"Server Key"),
    }
}

fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut salted = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut salted);
    salted
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length; the error arm cannot happen.
    let Ok(mut mac) = HmacSha256::new_from_slice(key) else {
        return [0; 32];
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// A message as text, refused if too long or not UTF-8.
fn utf8(msg: &[u8]) -> Result<&str, ScramError> {
    if msg.len() > MESSAGE_LEN_MAX_BYTES {
        return Err(ScramError::Malformed("message too long"));
    }
    std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("not UTF-8"))
}

/// A fresh random nonce, base64 (so printable and without `,`).
fn random_nonce() -> String {
    let mut bytes = [0u8; NONCE_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    B64.encode(bytes)
}

/// Undoes SCRAM's `=2C`/`=3D` escaping of user names.
fn unescape_saslname(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape in user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// SCRAM's escaping of `=` and `,` in user names.
fn escape_saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

/// `ClientSignature` / `ServerSignature`: HMAC of the AuthMessage
/// (`client-first-bare,server-first,client-final-without-proof`).
fn signature(
    key: &[u8; 32],
    client_first_bare: &str,
    server_first: &str,
    without_proof: &str,
) -> [u8; 32] {
    let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
    hmac(key, auth_message.as_bytes())
}
