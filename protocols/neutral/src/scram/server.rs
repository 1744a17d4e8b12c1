//! The server side: client-first in, server-first out; client-final in,
//! server-final out.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{random_nonce, signature, unescape_saslname, utf8, ScramError};
use crate::ScramCredentials;

/// Iterations claimed for an unknown user's made-up credentials (the users
/// file's default, so an unknown user looks like a known one).
const FAKE_ITERATIONS: u32 = 4096;
/// Salt length of an unknown user's made-up credentials, in bytes (the
/// users file's length for new users).
const FAKE_SALT_LEN_BYTES: usize = 16;

/// Server state between server-first and client-final. It holds the
/// stored credentials, so it is boxed and dropped when the exchange ends.
#[derive(Debug)]
pub struct ScramPending {
    user: String,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    creds: ScramCredentials,
    known_user: bool,
}

/// Reads client-first and answers server-first.
///
/// `lookup` gives the stored credentials of the named user (typically
/// [`crate::Broker::scram_credentials`]); it is called exactly once, after
/// the message parsed. An unknown user still gets a server-first, with
/// made-up salt and keys, and fails at [`ScramPending::server_final`].
pub fn server_first(
    client_first: &[u8],
    lookup: impl FnOnce(&str) -> Option<ScramCredentials>,
) -> Result<(ScramPending, Vec<u8>), ScramError> {
    server_first_with_nonce(client_first, lookup, &random_nonce())
}

/// [`server_first`] with a given server nonce part (tests replay RFC 7677's
/// exchange with it; the broker always uses a random one).
pub(super) fn server_first_with_nonce(
    client_first: &[u8],
    lookup: impl FnOnce(&str) -> Option<ScramCredentials>,
    server_nonce: &str,
) -> Result<(ScramPending, Vec<u8>), ScramError> {
    let msg = utf8(client_first)?;
    // gs2-header: cbind-flag "," [authzid] ","
    let mut it = msg.splitn(3, ',');
    let (Some(flag), Some(authzid), Some(bare)) = (it.next(), it.next(), it.next()) else {
        return Err(ScramError::Malformed("client-first lacks the GS2 header"));
    };
    // "y": the client could bind but thinks we cannot; fine, we cannot.
    // "p=…": the client wants channel binding, which we do not offer.
    if flag != "n" && flag != "y" {
        return Err(ScramError::Unsupported("channel binding"));
    }
    let gs2_header = format!("{flag},{authzid},");
    let mut user = None;
    let mut cnonce = None;
    for attr in bare.split(',') {
        if let Some(v) = attr.strip_prefix("n=") {
            user = Some(unescape_saslname(v)?);
        } else if let Some(v) = attr.strip_prefix("r=") {
            cnonce = Some(v);
        } else if attr.starts_with("m=") {
            return Err(ScramError::Unsupported("mandatory extension"));
        }
    }
    let (Some(user), Some(cnonce)) = (user, cnonce) else {
        return Err(ScramError::Malformed("client-first lacks n= or r="));
    };
    if cnonce.is_empty() || cnonce.contains(',') {
        return Err(ScramError::Malformed("bad client nonce"));
    }
    let nonce = format!("{cnonce}{server_nonce}");
    let (creds, known_user) = match lookup(&user) {
        Some(c) => (c, true),
        None => (made_up_credentials(), false),
    };
    let server_first = format!(
        "r={nonce},s={},i={}",
        B64.encode(&creds.salt),
        creds.iterations
    );
    let reply = server_first.clone().into_bytes();
    let pending = ScramPending {
        user,
        gs2_header,
        client_first_bare: bare.to_owned(),
        server_first,
        nonce,
        creds,
        known_user,
    };
    Ok((pending, reply))
}

/// Credentials for an unknown user: a random salt (so two attempts do not
/// reveal a constant one) and a random `StoredKey` no proof can match.
fn made_up_credentials() -> ScramCredentials {
    let mut rng = rand::rng();
    let mut salt = vec![0u8; FAKE_SALT_LEN_BYTES];
    rng.fill_bytes(&mut salt);
    let mut stored_key = [0u8; 32];
    rng.fill_bytes(&mut stored_key);
    ScramCredentials {
        salt,
        iterations: FAKE_ITERATIONS,
        stored_key,
        server_key: [0; 32],
    }
}

impl ScramPending {
    /// The user named in client-first (not yet authenticated: only
    /// [`ScramPending::server_final`] succeeding proves it).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Verifies client-final; on success returns server-final (`v=…`),
    /// which proves to the client that we know its credentials too.
    pub fn server_final(&self, client_final: &[u8]) -> Result<Vec<u8>, ScramError> {
        let msg = utf8(client_final)?;
        let idx = msg
            .rfind(",p=")
            .ok_or(ScramError::Malformed("client-final lacks a proof"))?;
        let without_proof = &msg[..idx];
        let proof = B64
            .decode(&msg[idx + 3..])
            .map_err(|_| ScramError::Malformed("proof is not base64"))?;
        let mut cbind = None;
        let mut nonce = None;
        for attr in without_proof.split(',') {
            if let Some(v) = attr.strip_prefix("c=") {
                cbind = Some(v);
            } else if let Some(v) = attr.strip_prefix("r=") {
                nonce = Some(v);
            }
        }
        // Without channel binding, c= repeats the GS2 header.
        if cbind != Some(B64.encode(self.gs2_header.as_bytes()).as_str()) {
            return Err(ScramError::Malformed("channel binding data mismatch"));
        }
        if nonce != Some(self.nonce.as_str()) {
            return Err(ScramError::Malformed("nonce mismatch"));
        }
        let Ok(proof) = <[u8; 32]>::try_from(proof) else {
            return Err(ScramError::BadCredentials);
        };
        let sign = |key| {
            signature(
                key,
                &self.client_first_bare,
                &self.server_first,
                without_proof,
            )
        };
        let client_signature = sign(&self.creds.stored_key);
        // ClientKey = ClientProof XOR ClientSignature; it must hash to StoredKey.
        let mut client_key = proof;
        for (k, s) in client_key.iter_mut().zip(client_signature) {
            *k ^= s;
        }
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        // Constant time: no early exit on the first differing byte.
        let matches: bool = stored.ct_eq(&self.creds.stored_key).into();
        if !matches || !self.known_user {
            return Err(ScramError::BadCredentials);
        }
        let server_signature = sign(&self.creds.server_key);
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}
