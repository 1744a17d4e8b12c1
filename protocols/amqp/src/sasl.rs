//! The SASL layer (spec part 5.3): ANONYMOUS, PLAIN, SCRAM-SHA-256
//! (RFC 5802, RFC 7677) and EXTERNAL (RFC 4422 appendix A: the identity of
//! a verified TLS client certificate), as a small state machine with no IO.
//!
//! PLAIN is checked with [`Broker::authenticate`]; SCRAM verifies the
//! client proof against [`Broker::scram_credentials`], so the password never
//! reaches us. An unknown SCRAM user gets a made-up salt and fails at the
//! proof, like a wrong password, so user names cannot be probed.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::RngCore;
use rosetta_neutral::{AuthError, Broker, Principal, ScramCredentials};
use sha2::{Digest, Sha256};

/// SASL ANONYMOUS.
pub(crate) const ANONYMOUS: &str = "ANONYMOUS";
/// SASL PLAIN.
pub(crate) const PLAIN: &str = "PLAIN";
/// SASL SCRAM-SHA-256.
pub(crate) const SCRAM_SHA_256: &str = "SCRAM-SHA-256";
/// SASL EXTERNAL: the transport (here a TLS client certificate) authenticated.
pub(crate) const EXTERNAL: &str = "EXTERNAL";

/// Bytes of randomness in the server nonce (RFC 5802 asks for "sufficient").
const SERVER_NONCE_BYTES: usize = 18;
/// Iterations claimed for an unknown user's made-up credentials.
const FAKE_ITERATIONS: u32 = 4096;

type HmacSha256 = Hmac<Sha256>;

/// What the server answers to one SASL frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SaslStep {
    /// Send a sasl-challenge with these bytes and wait for a response.
    Challenge(Vec<u8>),
    /// Authenticated: send sasl-outcome ok (with the additional data).
    Success {
        principal: Principal,
        additional_data: Option<Vec<u8>>,
    },
    /// Failed: send sasl-outcome auth and close.
    Failure(String),
}

/// Where the exchange is.
#[derive(Debug, Default)]
pub(crate) enum SaslServer {
    /// Waiting for sasl-init.
    #[default]
    AwaitInit,
    /// SCRAM server-first sent; waiting for client-final.
    ScramFinal(Box<ScramPending>),
    /// An outcome was produced; further SASL frames are out of order.
    Done,
}

/// SCRAM state kept between the two round trips.
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

/// The mechanisms to offer. EXTERNAL comes first when the connection has
/// a verified client certificate, because clients pick the first one they
/// support and a certificate is what such a client meant to use.
pub(crate) fn mechanisms(broker: &dyn Broker, certificate_user: Option<&str>) -> Vec<&'static str> {
    let mut m = Vec::with_capacity(4);
    if certificate_user.is_some() {
        m.push(EXTERNAL);
    }
    m.extend([SCRAM_SHA_256, PLAIN]);
    if broker.anonymous_allowed() {
        m.push(ANONYMOUS);
    }
    m
}

impl SaslServer {
    /// Handles sasl-init.
    pub(crate) fn on_init(
        &mut self,
        broker: &dyn Broker,
        certificate_user: Option<&str>,
        mechanism: &str,
        initial_response: Option<&[u8]>,
    ) -> SaslStep {
        if !matches!(self, SaslServer::AwaitInit) {
            *self = SaslServer::Done;
            return SaslStep::Failure("sasl-init out of order".into());
        }
        *self = SaslServer::Done;
        match mechanism {
            ANONYMOUS => match broker.authenticate(None, None) {
                Ok(principal) if broker.anonymous_allowed() => SaslStep::Success {
                    principal,
                    additional_data: None,
                },
                Ok(_) => SaslStep::Failure(AuthError::AnonymousDisabled.to_string()),
                Err(e) => SaslStep::Failure(e.to_string()),
            },
            PLAIN => plain(broker, initial_response.unwrap_or_default()),
            EXTERNAL => external(
                broker,
                certificate_user,
                initial_response.unwrap_or_default(),
            ),
            SCRAM_SHA_256 => match scram_first(broker, initial_response.unwrap_or_default()) {
                Ok((pending, challenge)) => {
                    *self = SaslServer::ScramFinal(Box::new(pending));
                    SaslStep::Challenge(challenge)
                }
                Err(e) => SaslStep::Failure(e),
            },
            other => SaslStep::Failure(format!("unsupported mechanism {other}")),
        }
    }

    /// Handles sasl-response.
    pub(crate) fn on_response(&mut self, response: &[u8]) -> SaslStep {
        match std::mem::replace(self, SaslServer::Done) {
            SaslServer::ScramFinal(pending) => match scram_final(&pending, response) {
                Ok(server_final) => SaslStep::Success {
                    principal: Principal {
                        user: Some(pending.user),
                    },
                    additional_data: Some(server_final),
                },
                Err(e) => SaslStep::Failure(e),
            },
            _ => SaslStep::Failure("sasl-response out of order".into()),
        }
    }
}

/// The step for a one-round mechanism's authentication result.
fn outcome(result: Result<Principal, AuthError>) -> SaslStep {
    match result {
        Ok(principal) => SaslStep::Success {
            principal,
            additional_data: None,
        },
        Err(e) => SaslStep::Failure(e.to_string()),
    }
}

/// EXTERNAL: the initial response is an optional authorization identity
/// (RFC 4422 appendix A); when given, it must name the certificate's user.
fn external(broker: &dyn Broker, certificate_user: Option<&str>, authzid: &[u8]) -> SaslStep {
    let Some(subject) = certificate_user else {
        return SaslStep::Failure("EXTERNAL needs a verified TLS client certificate".into());
    };
    let Ok(authzid) = std::str::from_utf8(authzid) else {
        return SaslStep::Failure("authorization identity is not UTF-8".into());
    };
    let requested = (!authzid.is_empty()).then_some(authzid);
    outcome(broker.authenticate_connection(requested, None, Some(subject)))
}

/// PLAIN: `[authzid] NUL authcid NUL passwd` (RFC 4616).
fn plain(broker: &dyn Broker, response: &[u8]) -> SaslStep {
    let mut parts = response.split(|b| *b == 0);
    let (Some(_authzid), Some(user), Some(pass), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return SaslStep::Failure("malformed PLAIN response".into());
    };
    let Ok(user) = std::str::from_utf8(user) else {
        return SaslStep::Failure("user name is not UTF-8".into());
    };
    outcome(broker.authenticate(Some(user), Some(pass)))
}

/// Undoes SCRAM's `=2C`/`=3D` escaping of user names.
fn unescape_saslname(name: &str) -> Result<String, String> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err("bad escape in SCRAM user name".into()),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn scram_first(broker: &dyn Broker, msg: &[u8]) -> Result<(ScramPending, Vec<u8>), String> {
    let msg = std::str::from_utf8(msg).map_err(|_| "SCRAM message is not UTF-8")?;
    // gs2-header: cbind-flag "," [authzid] ","
    let mut it = msg.splitn(3, ',');
    let (Some(flag), Some(authzid), Some(bare)) = (it.next(), it.next(), it.next()) else {
        return Err("malformed SCRAM client-first message".into());
    };
    if flag != "n" && flag != "y" {
        return Err("SCRAM channel binding is not supported".into());
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
            return Err("SCRAM mandatory extension not supported".into());
        }
    }
    let (Some(user), Some(cnonce)) = (user, cnonce) else {
        return Err("SCRAM client-first lacks n= or r=".into());
    };
    if cnonce.is_empty() {
        return Err("empty SCRAM client nonce".into());
    }
    let mut rng = rand::rng();
    let mut snonce = [0u8; SERVER_NONCE_BYTES];
    rng.fill_bytes(&mut snonce);
    let nonce = format!("{cnonce}{}", B64.encode(snonce));
    let (creds, known_user) = match broker.scram_credentials(&user) {
        Some(c) => (c, true),
        None => {
            let mut salt = vec![0u8; 16];
            rng.fill_bytes(&mut salt);
            let mut stored_key = [0u8; 32];
            rng.fill_bytes(&mut stored_key);
            (
                ScramCredentials {
                    salt,
                    iterations: FAKE_ITERATIONS,
                    stored_key,
                    server_key: [0; 32],
                },
                false,
            )
        }
    };
    let server_first = format!(
        "r={nonce},s={},i={}",
        B64.encode(&creds.salt),
        creds.iterations
    );
    let challenge = server_first.clone().into_bytes();
    Ok((
        ScramPending {
            user,
            gs2_header,
            client_first_bare: bare.to_owned(),
            server_first,
            nonce,
            creds,
            known_user,
        },
        challenge,
    ))
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length; the error arm cannot happen.
    let Ok(mut mac) = HmacSha256::new_from_slice(key) else {
        return [0; 32];
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

fn scram_final(p: &ScramPending, msg: &[u8]) -> Result<Vec<u8>, String> {
    let msg = std::str::from_utf8(msg).map_err(|_| "SCRAM message is not UTF-8")?;
    let idx = msg.rfind(",p=").ok_or("SCRAM client-final lacks a proof")?;
    let without_proof = &msg[..idx];
    let proof = B64
        .decode(&msg[idx + 3..])
        .map_err(|_| "SCRAM proof is not base64")?;
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
        return Err("SCRAM channel binding mismatch".into());
    }
    if nonce != Some(p.nonce.as_str()) {
        return Err("SCRAM nonce mismatch".into());
    }
    if proof.len() != 32 {
        return Err("bad user name or password".into());
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
        return Err(AuthError::BadCredentials.to_string());
    }
    let server_signature = hmac(&p.creds.server_key, auth_message.as_bytes());
    Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Stored SCRAM credentials for `password` (what a users file holds).
    pub(crate) fn scram_creds(password: &str, salt: &[u8], iterations: u32) -> ScramCredentials {
        let salted = salted_password(password, salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        ScramCredentials {
            salt: salt.to_vec(),
            iterations,
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, b"Server Key"),
        }
    }

    fn salted_password(password: &str, salt: &[u8], iterations: u32) -> [u8; 32] {
        let mut out = [0u8; 32];
        pbkdf2::pbkdf2::<HmacSha256>(password.as_bytes(), salt, iterations, &mut out).unwrap();
        out
    }

    /// The client side of SCRAM: returns (client-final, expected server-final).
    pub(crate) fn scram_client_final(
        password: &str,
        client_first_bare: &str,
        server_first: &str,
    ) -> (String, String) {
        let mut salt = None;
        let mut iters = None;
        let mut nonce = None;
        for attr in server_first.split(',') {
            if let Some(v) = attr.strip_prefix("s=") {
                salt = Some(B64.decode(v).unwrap());
            } else if let Some(v) = attr.strip_prefix("i=") {
                iters = Some(v.parse::<u32>().unwrap());
            } else if let Some(v) = attr.strip_prefix("r=") {
                nonce = Some(v.to_owned());
            }
        }
        let salted = salted_password(password, &salt.unwrap(), iters.unwrap());
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        let without_proof = format!("c=biws,r={}", nonce.unwrap());
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = hmac(&stored_key, auth.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(sig.iter())
            .map(|(a, b)| a ^ b)
            .collect();
        let server_sig = hmac(&hmac(&salted, b"Server Key"), auth.as_bytes());
        (
            format!("{without_proof},p={}", B64.encode(proof)),
            format!("v={}", B64.encode(server_sig)),
        )
    }

    #[test]
    fn saslname_escapes() {
        assert_eq!(unescape_saslname("a=2Cb=3Dc").unwrap(), "a,b=c");
        assert!(unescape_saslname("a=2").is_err());
    }
}
