//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as an MQTT 5 enhanced authentication
//! method (MQTT 5 §4.12), without IO.
//!
//! The exchange, with Authentication Method `SCRAM-SHA-256` on every
//! packet:
//!
//! | client                                  | server                                     |
//! |-----------------------------------------|--------------------------------------------|
//! | CONNECT, data = client-first            |                                            |
//! |                                         | AUTH 0x18 (continue), data = server-first  |
//! | AUTH 0x18, data = client-final          |                                            |
//! |                                         | CONNACK 0x00, data = server-final (`v=…`)  |
//!
//! Re-authentication runs the same exchange after CONNACK, started by the
//! client with AUTH 0x19 and ended by the server with AUTH 0x00.
//!
//! The server side verifies the client proof against
//! [`Broker::scram_credentials`] (what the users file stores), so the
//! password never reaches us. An unknown user gets made-up credentials and
//! fails at the proof exactly like a wrong password, so user names cannot
//! be probed.
//!
//! The AMQP adapter runs the same algorithm inside its SASL layer
//! (`protocols/amqp/src/sasl.rs`); that module is private to its crate, so
//! this one is MQTT's own. Moving both onto one shared implementation in
//! `rosetta-neutral` is the clean next step.
//!
//! [`ScramClient`] is the client side, public so that Rust clients and the
//! integration tests can authenticate this way; the broker never uses it.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::RngCore;
use rosetta_neutral::{Broker, ScramCredentials};
use sha2::{Digest, Sha256};

/// The Authentication Method name.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// Bytes of randomness in a nonce (RFC 5802 asks for "sufficient").
const NONCE_BYTES: usize = 18;
/// Iterations claimed for an unknown user's made-up credentials (the
/// users file's default, so an unknown user looks like a known one).
const FAKE_ITERATIONS: u32 = 4096;
/// Longest SCRAM message accepted: user names and nonces are short; this
/// bounds what one exchange keeps.
const MESSAGE_LEN_MAX_BYTES: usize = 1024;

type HmacSha256 = Hmac<Sha256>;

/// Why a SCRAM exchange failed. Every variant ends the authentication.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// The message does not follow RFC 5802.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// Something the server does not offer (channel binding, extensions).
    #[error("SCRAM feature not supported: {0}")]
    Unsupported(&'static str),
    /// Wrong password or unknown user (deliberately not told apart).
    #[error("bad user name or password")]
    BadCredentials,
}

/// Server state between server-first and client-final.
#[derive(Debug)]
pub(crate) struct ScramPending {
    user: String,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    creds: ScramCredentials,
    known_user: bool,
}

impl ScramPending {
    /// The user named in client-first (not yet authenticated).
    pub(crate) fn user(&self) -> &str {
        &self.user
    }
}

fn utf8(msg: &[u8]) -> Result<&str, ScramError> {
    if msg.len() > MESSAGE_LEN_MAX_BYTES {
        return Err(ScramError::Malformed("message too long"));
    }
    std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("not UTF-8"))
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

fn escape_saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

fn nonce() -> String {
    let mut bytes = [0u8; NONCE_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    B64.encode(bytes)
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length; the error arm cannot happen.
    let Ok(mut mac) = HmacSha256::new_from_slice(key) else {
        return [0; 32];
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Reads client-first and answers server-first.
pub(crate) fn server_first(
    broker: &dyn Broker,
    msg: &[u8],
) -> Result<(ScramPending, Vec<u8>), ScramError> {
    let msg = utf8(msg)?;
    // gs2-header: cbind-flag "," [authzid] ","
    let mut it = msg.splitn(3, ',');
    let (Some(flag), Some(authzid), Some(bare)) = (it.next(), it.next(), it.next()) else {
        return Err(ScramError::Malformed("client-first lacks the GS2 header"));
    };
    // "y": the client could bind but thinks we cannot; fine, we cannot.
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
    let nonce = format!("{cnonce}{}", nonce());
    let (creds, known_user) = match broker.scram_credentials(&user) {
        Some(c) => (c, true),
        None => {
            let mut rng = rand::rng();
            let mut salt = vec![0u8; 16];
            rng.fill_bytes(&mut salt);
            let mut stored_key = [0u8; 32];
            rng.fill_bytes(&mut stored_key);
            let creds = ScramCredentials {
                salt,
                iterations: FAKE_ITERATIONS,
                stored_key,
                server_key: [0; 32],
            };
            (creds, false)
        }
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

/// Verifies client-final; on success returns server-final (`v=…`), which
/// proves to the client that we know its credentials too.
pub(crate) fn server_final(p: &ScramPending, msg: &[u8]) -> Result<Vec<u8>, ScramError> {
    let msg = utf8(msg)?;
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
    if cbind != Some(B64.encode(p.gs2_header.as_bytes()).as_str()) {
        return Err(ScramError::Malformed("channel binding data mismatch"));
    }
    if nonce != Some(p.nonce.as_str()) {
        return Err(ScramError::Malformed("nonce mismatch"));
    }
    if proof.len() != 32 {
        return Err(ScramError::BadCredentials);
    }
    let auth_message = format!(
        "{},{},{}",
        p.client_first_bare, p.server_first, without_proof
    );
    let client_signature = hmac(&p.creds.stored_key, auth_message.as_bytes());
    let mut client_key = [0u8; 32];
    for (k, (a, b)) in client_key
        .iter_mut()
        .zip(proof.iter().zip(client_signature.iter()))
    {
        *k = a ^ b;
    }
    let stored: [u8; 32] = Sha256::digest(client_key).into();
    // Constant-time compare: no early exit on the first differing byte.
    let diff = stored
        .iter()
        .zip(p.creds.stored_key.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if diff != 0 || !p.known_user {
        return Err(ScramError::BadCredentials);
    }
    let server_signature = hmac(&p.creds.server_key, auth_message.as_bytes());
    Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
}

/// The client side of the exchange: [`ScramClient::new`] gives
/// client-first, [`ScramClient::client_final`] answers server-first, and
/// [`ScramClient::verify_server_final`] checks the server's proof.
#[derive(Debug, Clone)]
pub struct ScramClient {
    password: Vec<u8>,
    client_first_bare: String,
    cnonce: String,
    /// `ServerSignature` expected in server-final, once computed.
    expected_server_final: Option<String>,
}

impl ScramClient {
    /// A client for `user` and `password`, with a fresh random nonce.
    pub fn new(user: &str, password: &[u8]) -> Self {
        let cnonce = nonce();
        Self {
            password: password.to_vec(),
            client_first_bare: format!("n={},r={cnonce}", escape_saslname(user)),
            cnonce,
            expected_server_final: None,
        }
    }

    /// client-first: the Authentication Data of CONNECT (or of AUTH 0x19).
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// client-final for `server_first` (the data of the server's AUTH
    /// 0x18). Refuses a server nonce that does not extend ours or absurd
    /// iteration counts.
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
        if !(1..=10_000_000).contains(&iterations) {
            return Err(ScramError::Malformed("iteration count out of range"));
        }
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2::<HmacSha256>(&self.password, &salt, iterations, &mut salted)
            .map_err(|_| ScramError::Malformed("PBKDF2 failed"))?;
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        // c=biws is base64("n,,"): no channel binding, no authzid.
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac(&stored_key, auth.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(signature.iter())
            .map(|(a, b)| a ^ b)
            .collect();
        let server_signature = hmac(&hmac(&salted, b"Server Key"), auth.as_bytes());
        self.expected_server_final = Some(format!("v={}", B64.encode(server_signature)));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// True if `server_final` (the data of CONNACK or AUTH 0x00) proves the
    /// server knows our credentials.
    pub fn verify_server_final(&self, server_final: &[u8]) -> bool {
        self.expected_server_final
            .as_deref()
            .is_some_and(|e| e.as_bytes() == server_final)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rosetta_neutral::{AuthError, EventSink, Principal, Session, SessionInfo};
    use std::sync::Arc;

    /// A broker that knows one SCRAM user.
    struct OneUser(ScramCredentials);

    impl Broker for OneUser {
        fn authenticate(&self, _: Option<&str>, _: Option<&[u8]>) -> Result<Principal, AuthError> {
            Err(AuthError::BadCredentials)
        }
        fn scram_credentials(&self, user: &str) -> Option<ScramCredentials> {
            (user == "al,i=ce").then(|| self.0.clone())
        }
        fn anonymous_allowed(&self) -> bool {
            false
        }
        fn authenticate_certificate(&self, _: &str) -> Result<Principal, AuthError> {
            Err(AuthError::BadCredentials)
        }
        fn open_session(&self, _: SessionInfo, _: Arc<dyn EventSink>) -> Box<dyn Session> {
            unreachable!("not used by SCRAM")
        }
    }

    fn creds(password: &[u8]) -> ScramCredentials {
        let salt = b"saltsaltsaltsalt".to_vec();
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2::<HmacSha256>(password, &salt, 4096, &mut salted).expect("pbkdf2");
        ScramCredentials {
            salt,
            iterations: 4096,
            stored_key: Sha256::digest(hmac(&salted, b"Client Key")).into(),
            server_key: hmac(&salted, b"Server Key"),
        }
    }

    fn run(user: &str, password: &[u8]) -> Result<bool, ScramError> {
        let broker = OneUser(creds(b"pencil"));
        let mut client = ScramClient::new(user, password);
        let (pending, first) = server_first(&broker, &client.client_first())?;
        assert_eq!(pending.user(), user, "escaping round-trips");
        let fin = client.client_final(&first)?;
        let server_fin = server_final(&pending, &fin)?;
        Ok(client.verify_server_final(&server_fin))
    }

    #[test]
    fn right_password_passes_and_proves_the_server() {
        assert_eq!(run("al,i=ce", b"pencil"), Ok(true));
    }

    #[test]
    fn wrong_password_and_unknown_user_fail_alike() {
        assert_eq!(run("al,i=ce", b"pen"), Err(ScramError::BadCredentials));
        assert_eq!(run("bob", b"pencil"), Err(ScramError::BadCredentials));
    }

    #[test]
    fn malformed_and_unsupported_messages_are_refused() {
        let broker = OneUser(creds(b"pencil"));
        for (msg, want) in [
            (
                &b"n,,r=abc"[..],
                ScramError::Malformed("client-first lacks n= or r="),
            ),
            (
                b"p=tls-unique,,n=a,r=x",
                ScramError::Unsupported("channel binding"),
            ),
            (
                b"n,,m=ext,n=a,r=x",
                ScramError::Unsupported("mandatory extension"),
            ),
            (
                b"n,,n=a=2,r=x",
                ScramError::Malformed("bad escape in user name"),
            ),
            (b"\xff", ScramError::Malformed("not UTF-8")),
        ] {
            assert_eq!(server_first(&broker, msg).map(|_| ()), Err(want));
        }
        let long = vec![b'a'; MESSAGE_LEN_MAX_BYTES + 1];
        assert!(server_first(&broker, &long).is_err());

        // A client-final with a nonce of its own is refused before any
        // proof is checked.
        let client = ScramClient::new("al,i=ce", b"pencil");
        let (pending, _) = server_first(&broker, &client.client_first()).expect("first");
        let forged = format!("c=biws,r={}x,p={}", pending.nonce, B64.encode([0u8; 32]));
        assert_eq!(
            server_final(&pending, forged.as_bytes()),
            Err(ScramError::Malformed("nonce mismatch"))
        );
    }

    #[test]
    fn client_refuses_a_server_nonce_that_is_not_an_extension() {
        let mut client = ScramClient::new("u", b"p");
        let r = client.client_final(b"r=other,s=c2FsdA==,i=4096");
        assert!(matches!(r, Err(ScramError::Malformed(_))));
        assert!(!client.verify_server_final(b"v=AAAA"));
    }
}
