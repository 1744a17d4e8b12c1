//! The client side, for tests and tools (Rust clients, the integration
//! tests, a command-line check of a users file). The broker never uses it.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::{escape_saslname, hmac, random_nonce, salted_password, signature, utf8, ScramError};

/// Most PBKDF2 iterations the client accepts from a server: beyond this a
/// hostile server makes us spend seconds per login (the users file's
/// maximum too).
const ITERATIONS_MAX: u32 = 10_000_000;

/// The client side of the exchange: [`ScramClient::new`] gives
/// client-first, [`ScramClient::client_final`] answers server-first, and
/// [`ScramClient::verify_server_final`] checks the server's proof. No
/// channel binding and no authorization identity (GS2 header `n,,`).
#[derive(Debug, Clone)]
pub struct ScramClient {
    password: Vec<u8>,
    client_first_bare: String,
    cnonce: String,
    /// server-final expected (`v=ServerSignature`), once computed.
    expected_server_final: Option<String>,
}

impl ScramClient {
    /// A client for `user` and `password`, with a fresh random nonce.
    pub fn new(user: &str, password: &[u8]) -> Self {
        Self::build(user, password, random_nonce())
    }

    /// A client with a chosen nonce, to replay a recorded exchange (RFC
    /// 7677's test vector, a test's fixed messages). Never for a real
    /// login: a predictable nonce allows replays. The nonce must be
    /// printable ASCII without `,` (RFC 5802 section 7).
    pub fn with_nonce(user: &str, password: &[u8], cnonce: &str) -> Result<Self, ScramError> {
        let printable = |b: u8| (0x21..=0x7e).contains(&b) && b != b',';
        if cnonce.is_empty() || !cnonce.bytes().all(printable) {
            return Err(ScramError::Malformed("bad client nonce"));
        }
        Ok(Self::build(user, password, cnonce.to_owned()))
    }

    fn build(user: &str, password: &[u8], cnonce: String) -> Self {
        Self {
            password: password.to_vec(),
            client_first_bare: format!("n={},r={cnonce}", escape_saslname(user)),
            cnonce,
            expected_server_final: None,
        }
    }

    /// client-first: AMQP's sasl-init initial response, MQTT's CONNECT (or
    /// AUTH 0x19) Authentication Data.
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// client-final for `server_first`. Refuses a server nonce that does
    /// not extend ours and iteration counts outside 1 to 10 000 000.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let server_first = utf8(server_first)?;
        let (mut salt, mut iterations, mut nonce) = (None, None, None);
        for attr in server_first.split(',') {
            if let Some(v) = attr.strip_prefix("s=") {
                salt = B64.decode(v).ok();
            } else if let Some(v) = attr.strip_prefix("i=") {
                iterations = v.parse::<u32>().ok();
            } else if let Some(v) = attr.strip_prefix("r=") {
                nonce = Some(v);
            }
        }
        let (Some(salt), Some(iterations), Some(nonce)) = (salt, iterations, nonce) else {
            return Err(ScramError::Malformed("server-first lacks s=, i= or r="));
        };
        if !nonce.starts_with(&self.cnonce) || nonce.len() == self.cnonce.len() {
            return Err(ScramError::Malformed("server nonce does not extend ours"));
        }
        if !(1..=ITERATIONS_MAX).contains(&iterations) {
            return Err(ScramError::Malformed("iteration count out of range"));
        }
        let salted = salted_password(&self.password, &salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        // c=biws is base64("n,,"): no channel binding, no authzid.
        let without_proof = format!("c=biws,r={nonce}");
        let sign = |key| signature(key, &self.client_first_bare, server_first, &without_proof);
        let client_signature = sign(&stored_key);
        let proof: Vec<u8> = client_key
            .iter()
            .zip(client_signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = hmac(&salted, b"Server Key");
        let server_signature = sign(&server_key);
        self.expected_server_final = Some(format!("v={}", B64.encode(server_signature)));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// The server-final a server knowing our credentials sends, once
    /// [`ScramClient::client_final`] has run.
    pub fn expected_server_final(&self) -> Option<&str> {
        self.expected_server_final.as_deref()
    }

    /// True if `server_final` proves the server knows our credentials.
    pub fn verify_server_final(&self, server_final: &[u8]) -> bool {
        self.expected_server_final
            .as_deref()
            .is_some_and(|e| e.as_bytes() == server_final)
    }
}
