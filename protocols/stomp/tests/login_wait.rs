//! A CONNECT whose passcode the broker checks elsewhere
//! (`Broker::start_login` answered `Pending`): no frame is decoded and no
//! input is wanted until `SessionEvent::LoginChecked`; then CONNECTED (or
//! an ERROR), and the frames pipelined behind the CONNECT, in order.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns: a panic is a test failure

mod common;

use common::{Call, Harness};
use rosetta_neutral::*;
use rosetta_stomp::{Command, StompConfig};

const CONNECT: &[u8] =
    b"CONNECT\naccept-version:1.2\nhost:h\nlogin:guest\npasscode:guest\nreceipt:c1\n\n\0";
const SEND: &[u8] = b"SEND\ndestination:/queue/q\nreceipt:r1\n\nhello\0";

fn guest() -> Principal {
    Principal {
        user: Some("guest".into()),
    }
}

fn deferring() -> Harness {
    let h = Harness::new();
    h.broker.0.lock().unwrap().logins.defer_passwords = true;
    h
}

fn opened(h: &Harness) -> usize {
    h.calls()
        .iter()
        .filter(|c| matches!(c, Call::Open(_)))
        .count()
}

#[test]
fn frames_pipelined_behind_connect_wait_for_the_login_result() {
    let mut h = deferring();
    let mut input = CONNECT.to_vec();
    input.extend_from_slice(SEND);
    h.input(&input);
    assert!(h.raw_output().is_empty(), "nothing answered yet");
    assert!(!h.conn.wants_input());
    assert!(
        h.calls().is_empty(),
        "no session, no SEND before the result"
    );
    {
        let inner = h.broker.0.lock().unwrap();
        assert_eq!(inner.logins.pending.len(), 1);
        assert_eq!(inner.logins.pending[0].user(), Some("guest"));
    }
    // Bytes that come while waiting are kept for after the result.
    h.input(b"SEND\ndestination:/queue/q\n\nsecond\0");
    assert!(h.raw_output().is_empty());

    h.event(SessionEvent::LoginChecked {
        result: Ok(guest()),
    });
    let frames = h.frames();
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0].command, Command::Connected);
    let calls = h.calls();
    assert!(matches!(&calls[0], Call::Open(info) if info.principal == guest()));
    let sent: Vec<String> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Publish(_, m, _) => Some(String::from_utf8_lossy(&m.body.bytes).into_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(sent, ["hello", "second"], "both SENDs ran, in order");
    assert!(h.conn.wants_input());
    // The first SEND's receipt comes once its publish is durable.
    let ticket = h.tickets()[0];
    h.commit(ticket);
    let receipt = h.frame();
    assert_eq!(receipt.command, Command::Receipt);
    assert_eq!(receipt.header("receipt-id"), Some("r1"));
}

#[test]
fn a_refused_check_is_an_error_frame_and_what_followed_is_ignored() {
    let mut h = deferring();
    let mut input = CONNECT.to_vec();
    input.extend_from_slice(SEND);
    h.input(&input);
    h.event(SessionEvent::LoginChecked {
        result: Err(AuthError::BadCredentials),
    });
    let f = h.frame();
    assert_eq!(f.command, Command::Error);
    assert_eq!(f.header("message"), Some("authentication failed"));
    assert_eq!(f.header("receipt-id"), Some("c1"), "the CONNECT's receipt");
    assert!(h.conn.is_closed());
    assert!(h.calls().is_empty(), "no session, no SEND");
}

#[test]
fn a_full_check_queue_is_a_server_busy_error() {
    let mut h = Harness::new();
    h.broker.0.lock().unwrap().logins.refuse_all = Some(AuthError::ServerBusy);
    h.input(CONNECT);
    let f = h.frame();
    assert_eq!(f.command, Command::Error);
    assert_eq!(f.header("message"), Some("server busy"));
    assert!(h.conn.is_closed());
}

#[test]
fn a_connection_closed_while_its_check_is_pending_does_no_harm() {
    let mut h = deferring();
    h.input(CONNECT);
    h.conn.handle_transport_closed(h.now);
    h.event(SessionEvent::LoginChecked {
        result: Ok(guest()),
    });
    assert!(h.raw_output().is_empty());
    assert_eq!(opened(&h), 0);
    let Harness { conn, broker, .. } = h;
    drop(conn);
    let check = broker.0.lock().unwrap().logins.pending.pop().unwrap();
    assert!(check.is_abandoned(), "nobody waits for the result");
    check.finish(Ok(guest()));
}

#[test]
fn the_connect_deadline_runs_while_the_check_is_pending() {
    let config = StompConfig::default();
    let timeout_ms = config.connect_timeout_ms;
    let mut h = Harness::with_config(config);
    h.broker.0.lock().unwrap().logins.defer_passwords = true;
    h.input(CONNECT);
    assert!(h.conn.poll_timeout().is_some());
    h.advance_ms(timeout_ms + 1);
    let f = h.frame();
    assert_eq!(f.header("message"), Some("connect timeout"));
    assert!(h.conn.is_closed());
    h.event(SessionEvent::LoginChecked {
        result: Ok(guest()),
    });
    assert!(h.raw_output().is_empty());
    assert_eq!(opened(&h), 0);
}

#[test]
fn input_beyond_a_frame_while_waiting_is_refused() {
    let config = StompConfig {
        frame_size_max_bytes: 4096,
        body_size_max_bytes: 4096,
        ..StompConfig::default()
    };
    let mut h = Harness::with_config(config);
    h.broker.0.lock().unwrap().logins.defer_passwords = true;
    h.input(CONNECT);
    h.input(&[b'\n'; 4096]);
    assert!(!h.conn.is_closed(), "one frame's worth is kept");
    h.input(b"\n");
    let f = h.frame();
    assert_eq!(f.command, Command::Error);
    assert_eq!(f.header("message"), Some("limit exceeded"));
    assert!(h.conn.is_closed());
}

#[test]
fn anonymous_logins_do_not_wait() {
    let mut h = deferring();
    h.input(b"CONNECT\naccept-version:1.2\nhost:h\n\n\0");
    assert_eq!(h.frame().command, Command::Connected);
    assert!(h.broker.0.lock().unwrap().logins.pending.is_empty());
}
