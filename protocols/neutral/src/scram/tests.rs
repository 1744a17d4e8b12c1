//! The exchange against RFC 7677's test vector, both sides against each
//! other, and every malformed input as a typed error (never a panic).

use super::server::server_first_with_nonce;
use super::*;
use proptest::prelude::*;

/// RFC 7677 section 3: user "user", password "pencil".
const RFC_CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const RFC_SALT_B64: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
const RFC_CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_FIRST: &str =
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const RFC_CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                                p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const RFC_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_creds() -> ScramCredentials {
    let salt = B64.decode(RFC_SALT_B64).expect("salt");
    derive_credentials(b"pencil", &salt, 4096)
}

/// Credentials of "al,i=ce" (a name that needs escaping), password "pencil".
fn alice(user: &str) -> Option<ScramCredentials> {
    (user == "al,i=ce").then(|| derive_credentials(b"pencil", b"saltsaltsaltsalt", 4096))
}

#[test]
fn server_replays_rfc_7677() {
    let (pending, first) = server_first_with_nonce(
        RFC_CLIENT_FIRST.as_bytes(),
        |u| (u == "user").then(rfc_creds),
        RFC_SERVER_NONCE,
    )
    .expect("client-first");
    assert_eq!(pending.user(), "user");
    assert_eq!(String::from_utf8(first).expect("text"), RFC_SERVER_FIRST);
    let last = pending
        .server_final(RFC_CLIENT_FINAL.as_bytes())
        .expect("the RFC's proof holds");
    assert_eq!(String::from_utf8(last).expect("text"), RFC_SERVER_FINAL);
}

#[test]
fn client_replays_rfc_7677() {
    let mut client = ScramClient::with_nonce("user", b"pencil", RFC_CLIENT_NONCE).expect("nonce");
    assert_eq!(client.client_first(), RFC_CLIENT_FIRST.as_bytes());
    let fin = client
        .client_final(RFC_SERVER_FIRST.as_bytes())
        .expect("server-first");
    assert_eq!(String::from_utf8(fin).expect("text"), RFC_CLIENT_FINAL);
    assert_eq!(client.expected_server_final(), Some(RFC_SERVER_FINAL));
    assert!(client.verify_server_final(RFC_SERVER_FINAL.as_bytes()));
    assert!(!client.verify_server_final(b"v=AAAA"));
}

/// The r= of a server-first.
fn combined_nonce(server_first: &[u8]) -> String {
    let text = std::str::from_utf8(server_first).expect("text");
    let nonce = text.split(',').find_map(|a| a.strip_prefix("r="));
    nonce.expect("r=").to_owned()
}

/// One whole exchange between our client and our server.
fn run(user: &str, password: &[u8]) -> Result<bool, ScramError> {
    let mut client = ScramClient::new(user, password);
    let (pending, first) = server_first(&client.client_first(), alice)?;
    assert_eq!(pending.user(), user, "escaping round-trips");
    let fin = client.client_final(&first)?;
    let last = pending.server_final(&fin)?;
    Ok(client.verify_server_final(&last))
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
fn an_unknown_user_gets_a_server_first_shaped_like_a_known_one() {
    let first_of = |user: &str| {
        let client = ScramClient::new(user, b"pencil");
        let (_, first) = server_first(&client.client_first(), alice).expect("first");
        String::from_utf8(first).expect("text")
    };
    let known = first_of("al,i=ce");
    let unknown = first_of("bob");
    let shape = |s: &str| -> Vec<usize> { s.split(',').map(str::len).collect() };
    assert_eq!(shape(&known), shape(&unknown), "{known} / {unknown}");
    assert!(unknown.ends_with(",i=4096"));
    // Two attempts for the same unknown user do not repeat a salt.
    assert_ne!(first_of("bob").split(',').nth(1), unknown.split(',').nth(1));
}

#[test]
fn the_credentials_lookup_runs_once_and_only_for_a_parsed_message() {
    let mut calls = 0;
    let _ = server_first(b"n,,n=a,r=x", |_| {
        calls += 1;
        None
    });
    assert_eq!(calls, 1);
    let _ = server_first(b"n,,r=x", |_| {
        calls += 1;
        None
    });
    assert_eq!(calls, 1, "not called for a malformed client-first");
}

#[test]
fn malformed_and_unsupported_client_first_is_refused() {
    let long = [b"n,,n=a,r=".as_slice(), &[b'x'; MESSAGE_LEN_MAX_BYTES]].concat();
    use ScramError::{Malformed as M, Unsupported as U};
    let no_gs2 = M("client-first lacks the GS2 header");
    let no_n_or_r = M("client-first lacks n= or r=");
    let bad_escape = M("bad escape in user name");
    let cases: [(&[u8], ScramError); 13] = [
        (b"", no_gs2.clone()),
        (b"n,", no_gs2),
        (b"n,,", no_n_or_r.clone()),
        (b"n,,r=abc", no_n_or_r.clone()),
        (b"n,,n=a", no_n_or_r),
        (b"n,,n=a,r=", M("bad client nonce")),
        (b"p=tls-unique,,n=a,r=x", U("channel binding")),
        (b"x,,n=a,r=x", U("channel binding")),
        (b"n,,m=ext,n=a,r=x", U("mandatory extension")),
        (b"n,,n=a=2,r=x", bad_escape.clone()),
        (b"n,,n=a=3d,r=x", bad_escape),
        (b"\xff", M("not UTF-8")),
        (&long, M("message too long")),
    ];
    for (msg, want) in cases {
        let got = server_first(msg, alice).map(|_| ());
        assert_eq!(got, Err(want), "{:?}", String::from_utf8_lossy(msg));
    }
}

#[test]
fn the_y_flag_and_an_authzid_are_accepted_and_bound_into_c() {
    // "y,,": the client supports binding but believes we do not.
    let (pending, first) = server_first(b"y,a=admin,n=al=2Ci=3Dce,r=abc", alice).expect("first");
    assert_eq!(pending.user(), "al,i=ce");
    let nonce = combined_nonce(&first);
    // c= must repeat this GS2 header, not the usual "n,,".
    let wrong_c = format!("c=biws,r={nonce},p={}", B64.encode([0u8; 32]));
    assert_eq!(
        pending.server_final(wrong_c.as_bytes()),
        Err(ScramError::Malformed("channel binding data mismatch"))
    );
    let right_c = format!(
        "c={},r={nonce},p={}",
        B64.encode("y,a=admin,"),
        B64.encode([0u8; 32])
    );
    assert_eq!(
        pending.server_final(right_c.as_bytes()),
        Err(ScramError::BadCredentials),
        "gets as far as the proof"
    );
}

#[test]
fn malformed_client_final_is_refused_before_the_proof() {
    let client = ScramClient::with_nonce("al,i=ce", b"pencil", "abc").expect("nonce");
    let (pending, first) = server_first(&client.client_first(), alice).expect("first");
    let nonce = combined_nonce(&first);
    let zeros = B64.encode([0u8; 32]);
    let long = format!("c=biws,r={nonce},p={}", "A".repeat(MESSAGE_LEN_MAX_BYTES));
    use ScramError::{BadCredentials as Bad, Malformed as M};
    let cbind = M("channel binding data mismatch");
    let cases = [
        (String::new(), M("client-final lacks a proof")),
        (format!("c=biws,r={nonce}"), M("client-final lacks a proof")),
        (format!("c=biws,r={nonce},p=!!"), M("proof is not base64")),
        (format!("r={nonce},p={zeros}"), cbind.clone()),
        (format!("c=bad,r={nonce},p={zeros}"), cbind),
        (format!("c=biws,p={zeros}"), M("nonce mismatch")),
        // A nonce of the client's own making.
        (format!("c=biws,r={nonce}x,p={zeros}"), M("nonce mismatch")),
        // A proof of the wrong length is a wrong proof.
        (format!("c=biws,r={nonce},p={}", B64.encode([0u8; 31])), Bad),
        (format!("c=biws,r={nonce},p={zeros}"), Bad),
        (long, M("message too long")),
    ];
    for (msg, want) in cases {
        assert_eq!(pending.server_final(msg.as_bytes()), Err(want), "{msg}");
    }
    assert_eq!(
        pending.server_final(b"\xff"),
        Err(ScramError::Malformed("not UTF-8"))
    );
}

#[test]
fn client_refuses_a_bad_server_first_and_a_bad_nonce() {
    let mut client = ScramClient::with_nonce("u", b"p", "abc").expect("nonce");
    for server_first in [
        &b"r=other,s=c2FsdA==,i=4096"[..],
        b"r=abc,s=c2FsdA==,i=4096",
        b"r=abcd,s=c2FsdA==,i=0",
        b"r=abcd,s=c2FsdA==,i=10000001",
        b"r=abcd,s=!!,i=4096",
        b"r=abcd,s=c2FsdA==",
        b"\xff",
    ] {
        let r = client.client_final(server_first);
        assert!(matches!(r, Err(ScramError::Malformed(_))), "{r:?}");
    }
    assert!(!client.verify_server_final(b"v=AAAA"));
    assert_eq!(client.expected_server_final(), None);
    for bad in ["", "a,b", "a b", "é"] {
        assert!(ScramClient::with_nonce("u", b"p", bad).is_err(), "{bad:?}");
    }
}

#[test]
fn saslname_escapes_round_trip() {
    assert_eq!(unescape_saslname("a=2Cb=3Dc").as_deref(), Ok("a,b=c"));
    assert_eq!(escape_saslname("a,b=c"), "a=2Cb=3Dc");
    assert!(unescape_saslname("a=2").is_err());
    assert!(unescape_saslname("a=").is_err());
}

proptest! {
    /// Any bytes as client-first, then any bytes as client-final: a typed
    /// answer every time, never a panic.
    #[test]
    fn arbitrary_input_never_panics(first in proptest::collection::vec(any::<u8>(), 0..64),
                                    last in proptest::collection::vec(any::<u8>(), 0..128)) {
        let first = [b"n,,n=al=2Ci=3Dce,r=".as_slice(), &first].concat();
        if let Ok((pending, _)) = server_first(&first, alice) {
            prop_assert!(pending.server_final(&last).is_err());
        }
    }

    #[test]
    fn arbitrary_text_never_panics(first in "[a-z=,0-9]{0,40}", last in "[a-zA-Z=,+/0-9]{0,80}") {
        if let Ok((pending, _)) = server_first(first.as_bytes(), alice) {
            prop_assert!(pending.server_final(last.as_bytes()).is_err());
        }
    }
}
