//! SCRAM-SHA-256 stored credentials (RFC 5802 section 3, RFC 7677).
//!
//! The server never keeps the password, only what the exchange needs:
//!
//! ```text
//! SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations)
//! StoredKey      = SHA-256(HMAC(SaltedPassword, "Client Key"))
//! ServerKey      = HMAC(SaltedPassword, "Server Key")
//! ```
//!
//! In the users file they are one string in PostgreSQL's format, so
//! existing tools can produce and read it:
//! `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (base64).
//!
//! The password is used as given. RFC 5802 asks for SASLprep first; for
//! ASCII passwords that changes nothing, and non-ASCII passwords that
//! SASLprep would alter are not normalised here (a known gap: such a user
//! can log in with PLAIN but not SCRAM).

use base64ct::{Base64, Encoding};
use hmac::{Hmac, Mac};
use rosetta_neutral::ScramCredentials;
use sha2::{Digest, Sha256};

/// PBKDF2 iterations for new users: RFC 7677's recommended minimum. The
/// cost falls on the client at each login (the server only runs a few
/// HMACs), so more would slow down every client's connect.
pub const ITERATIONS_DEFAULT: u32 = 4096;
/// Fewest iterations accepted from a users file (RFC 7677 section 4).
pub const ITERATIONS_MIN: u32 = 4096;
/// Most iterations accepted: beyond this a client spends seconds per login.
pub const ITERATIONS_MAX: u32 = 10_000_000;
/// Salt length for new users, in bytes.
pub const SALT_LEN_BYTES: usize = 16;
/// Longest salt accepted from a users file, in bytes.
pub const SALT_LEN_MAX_BYTES: usize = 256;

const MECHANISM: &str = "SCRAM-SHA-256";

/// Why a stored SCRAM string is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramFormatError {
    /// Not `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
    #[error("expected SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey> (base64)")]
    Shape,
    /// Iterations not a number or out of range.
    #[error("iterations must be a number from {ITERATIONS_MIN} to {ITERATIONS_MAX}")]
    Iterations,
    /// Salt empty, too long or not base64.
    #[error("the salt must be 1 to {SALT_LEN_MAX_BYTES} bytes of base64")]
    Salt,
    /// A key is not 32 bytes of base64.
    #[error("StoredKey and ServerKey must each be 32 bytes of base64")]
    Key,
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Derives the stored credentials for `password` (RFC 5802 section 3).
pub fn derive(password: &[u8], salt: &[u8], iterations: u32) -> ScramCredentials {
    let mut salted = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut salted);
    let client_key = hmac_sha256(&salted, b"Client Key");
    let stored_key: [u8; 32] = Sha256::digest(client_key).into();
    let server_key = hmac_sha256(&salted, b"Server Key");
    ScramCredentials {
        salt: salt.to_vec(),
        iterations,
        stored_key,
        server_key,
    }
}

/// Derives credentials with a fresh random salt and the default iterations.
pub fn derive_new(password: &[u8]) -> ScramCredentials {
    let salt: [u8; SALT_LEN_BYTES] = rand::random();
    derive(password, &salt, ITERATIONS_DEFAULT)
}

/// Formats credentials for the users file.
pub fn encode(c: &ScramCredentials) -> String {
    format!(
        "{MECHANISM}${}:{}${}:{}",
        c.iterations,
        Base64::encode_string(&c.salt),
        Base64::encode_string(&c.stored_key),
        Base64::encode_string(&c.server_key),
    )
}

/// Parses credentials from the users file.
pub fn decode(s: &str) -> Result<ScramCredentials, ScramFormatError> {
    let rest = s
        .strip_prefix(MECHANISM)
        .and_then(|r| r.strip_prefix('$'))
        .ok_or(ScramFormatError::Shape)?;
    let (iter_salt, keys) = rest.split_once('$').ok_or(ScramFormatError::Shape)?;
    let (iterations, salt) = iter_salt.split_once(':').ok_or(ScramFormatError::Shape)?;
    let (stored, server) = keys.split_once(':').ok_or(ScramFormatError::Shape)?;
    let iterations: u32 = iterations
        .parse()
        .map_err(|_| ScramFormatError::Iterations)?;
    if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) {
        return Err(ScramFormatError::Iterations);
    }
    let salt = Base64::decode_vec(salt).map_err(|_| ScramFormatError::Salt)?;
    if salt.is_empty() || salt.len() > SALT_LEN_MAX_BYTES {
        return Err(ScramFormatError::Salt);
    }
    let key = |b64: &str| -> Result<[u8; 32], ScramFormatError> {
        let bytes = Base64::decode_vec(b64).map_err(|_| ScramFormatError::Key)?;
        bytes.try_into().map_err(|_| ScramFormatError::Key)
    };
    Ok(ScramCredentials {
        salt,
        iterations,
        stored_key: key(stored)?,
        server_key: key(server)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exchange of RFC 7677 section 3 (user "user", password "pencil").
    const CLIENT_FIRST_BARE: &str = "n=user,r=rOprNGfwEbeRWgbNEkqO";
    const SERVER_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL_WITHOUT_PROOF: &str =
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const PROOF: &str = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_SIGNATURE: &str = "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    /// Checks our stored credentials the way a SCRAM server does, against
    /// the client proof and server signature published in RFC 7677: the
    /// proof must unmask to a ClientKey whose hash is our StoredKey, and
    /// our ServerKey must sign the AuthMessage to the RFC's `v=` value.
    #[test]
    fn rfc7677_exchange_verifies_against_derived_credentials() {
        let salt = Base64::decode_vec("W22ZaJ0SNY7soEsUEjb6gQ==").expect("salt");
        let creds = derive(b"pencil", &salt, 4096);
        let auth_message =
            format!("{CLIENT_FIRST_BARE},{SERVER_FIRST},{CLIENT_FINAL_WITHOUT_PROOF}");

        let client_signature = hmac_sha256(&creds.stored_key, auth_message.as_bytes());
        let proof = Base64::decode_vec(PROOF).expect("proof");
        let client_key: Vec<u8> = proof
            .iter()
            .zip(client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        let stored_key: [u8; 32] = Sha256::digest(&client_key).into();
        assert_eq!(stored_key, creds.stored_key, "the RFC's proof verifies");

        let server_signature = hmac_sha256(&creds.server_key, auth_message.as_bytes());
        assert_eq!(Base64::encode_string(&server_signature), SERVER_SIGNATURE);

        let wrong = derive(b"pencil!", &salt, 4096);
        assert_ne!(wrong.stored_key, creds.stored_key);
    }

    #[test]
    fn encode_decode_round_trip() {
        let salt = Base64::decode_vec("W22ZaJ0SNY7soEsUEjb6gQ==").expect("salt");
        let creds = derive(b"pencil", &salt, 4096);
        let s = encode(&creds);
        assert!(
            s.starts_with("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$"),
            "{s}"
        );
        assert_eq!(decode(&s), Ok(creds));
        let fresh = derive_new(b"x");
        assert_eq!(fresh.iterations, ITERATIONS_DEFAULT);
        assert_eq!(fresh.salt.len(), SALT_LEN_BYTES);
        assert_ne!(derive_new(b"x").salt, fresh.salt);
    }

    #[test]
    fn bad_strings_are_refused() {
        let k = Base64::encode_string(&[7u8; 32]);
        let good = format!("SCRAM-SHA-256$4096:c2FsdA==${k}:{k}");
        assert!(decode(&good).is_ok());
        let cases = [
            (
                "SCRAM-SHA-1$4096:c2FsdA==$a:b".to_owned(),
                ScramFormatError::Shape,
            ),
            (
                format!("SCRAM-SHA-256$4096:c2FsdA==${k}"),
                ScramFormatError::Shape,
            ),
            (
                format!("SCRAM-SHA-256$many:c2FsdA==${k}:{k}"),
                ScramFormatError::Iterations,
            ),
            (
                format!("SCRAM-SHA-256$100:c2FsdA==${k}:{k}"),
                ScramFormatError::Iterations,
            ),
            (
                format!("SCRAM-SHA-256$4096:!!${k}:{k}"),
                ScramFormatError::Salt,
            ),
            (
                format!("SCRAM-SHA-256$4096:${k}:{k}"),
                ScramFormatError::Salt,
            ),
            (
                format!("SCRAM-SHA-256$4096:c2FsdA==$c2FsdA==:{k}"),
                ScramFormatError::Key,
            ),
        ];
        for (s, want) in cases {
            assert_eq!(decode(&s), Err(want.clone()), "{s}");
        }
    }
}
