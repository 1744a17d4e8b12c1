//! A CONNECT whose password the broker checks elsewhere
//! (`Broker::start_login` answered `Pending`): the connection parses
//! nothing more and wants no input until `SessionEvent::LoginChecked`
//! brings the result, then answers the CONNECT and handles what was
//! pipelined behind it, in order.

use std::time::Duration;

use mqttbytes::{v4, v5, QoS};
use rosetta_mqtt::MqttConfig;
use rosetta_neutral::*;

use crate::fake::FakeBroker;
use crate::harness::*;

const PINGREQ: [u8; 2] = [0xC0, 0x00];

fn alice() -> Principal {
    Principal {
        user: Some("alice".into()),
    }
}

/// A harness whose fake core defers every password check.
fn deferring(v5: bool) -> Harness {
    let h = Harness::new(v5);
    h.broker.state().logins.defer_passwords = true;
    h
}

/// CONNECT as alice, then a SUBSCRIBE and a PINGREQ, in one read.
fn connect_subscribe_ping(v5: bool) -> Vec<u8> {
    let mut bytes = if v5 {
        let mut c = v5::Connect::new("waiter");
        c.set_login("alice", "secret");
        connect_v5(c)
    } else {
        connect_v4("waiter", true, 30, Some(("alice", "secret")))
    };
    if v5 {
        let mut s = v5::Subscribe::new("wait/#", QoS::AtLeastOnce);
        s.pkid = 1;
        bytes.extend(subscribe_v5(s));
    } else {
        bytes.extend(subscribe_v4(1, &[("wait/#", 1)]));
    }
    bytes.extend_from_slice(&PINGREQ);
    bytes
}

/// (CONNACK code, SUBACK seen, PINGRESP seen), in the order checked.
fn answers(h: &mut Harness) -> Vec<String> {
    h.packets()
        .into_iter()
        .map(|p| match p {
            Pkt::V4(v4::Packet::ConnAck(a)) => format!("connack {:?}", a.code),
            Pkt::V5(v5::Packet::ConnAck(a)) => format!("connack {:?}", a.code),
            Pkt::V4(v4::Packet::SubAck(_)) | Pkt::V5(v5::Packet::SubAck(_)) => "suback".into(),
            Pkt::V4(v4::Packet::PingResp) | Pkt::V5(v5::Packet::PingResp) => "pingresp".into(),
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn packets_pipelined_behind_connect_wait_for_the_login_result() {
    for v5 in [false, true] {
        let mut h = deferring(v5);
        h.input(&connect_subscribe_ping(v5));
        assert!(h.raw_output().is_empty(), "v5={v5}: nothing answered yet");
        assert!(!h.conn.wants_input(), "no reading while the check runs");
        assert!(!h.conn.is_closed());
        {
            let s = h.broker.state();
            assert!(s.sessions.is_empty(), "no session before the result");
            assert_eq!(s.logins.pending.len(), 1);
            assert_eq!(s.logins.pending[0].user(), Some("alice"));
            assert_eq!(s.logins.pending[0].password(), b"secret");
        }
        // More bytes while waiting (a driver that read before it looked at
        // wants_input) are kept, not parsed and not lost.
        h.input(&PINGREQ);
        assert!(h.raw_output().is_empty());

        h.event(SessionEvent::LoginChecked {
            result: Ok(alice()),
        });
        let got = answers(&mut h);
        assert_eq!(got.len(), 4, "v5={v5}: {got:?}");
        assert!(got[0].starts_with("connack Success"), "{got:?}");
        assert_eq!(&got[1..], ["suback", "pingresp", "pingresp"]);
        assert!(h.conn.wants_input());
        let s = h.broker.state();
        assert_eq!(s.sessions.len(), 1);
        assert_eq!(s.sessions[0].principal, alice());
        assert_eq!(s.consumers.len(), 1, "the SUBSCRIBE ran after the CONNACK");
    }
}

#[test]
fn a_refused_check_refuses_the_connect_and_ignores_what_followed() {
    for (v5, code) in [
        (false, "connack BadUserNamePassword"),
        (true, "connack BadUserNamePassword"),
    ] {
        let mut h = deferring(v5);
        h.input(&connect_subscribe_ping(v5));
        h.event(SessionEvent::LoginChecked {
            result: Err(AuthError::BadCredentials),
        });
        assert_eq!(answers(&mut h), [code], "v5={v5}");
        assert!(h.conn.is_closed());
        let s = h.broker.state();
        assert!(s.sessions.is_empty() && s.consumers.is_empty());
    }
}

#[test]
fn a_full_check_queue_is_server_unavailable_or_busy() {
    for (v5, code) in [
        (false, "connack ServiceUnavailable"),
        (true, "connack ServerBusy"),
    ] {
        let mut h = Harness::new(v5);
        h.broker.state().logins.refuse_all = Some(AuthError::ServerBusy);
        h.input(&connect_subscribe_ping(v5));
        assert_eq!(answers(&mut h), [code], "v5={v5}");
        assert!(h.conn.is_closed());
    }
}

#[test]
fn a_connection_closed_while_its_check_is_pending_does_no_harm() {
    let mut h = deferring(false);
    h.input(&connect_subscribe_ping(false));
    h.conn.handle_transport_closed(h.now);
    assert!(h.conn.is_closed());
    // The result arrives anyway: nobody is there to open a session for.
    h.event(SessionEvent::LoginChecked {
        result: Ok(alice()),
    });
    assert!(h.raw_output().is_empty());
    assert!(h.broker.state().sessions.is_empty());
    // Once the connection is gone, its pending check says so, and its
    // result goes nowhere.
    let Harness { conn, broker, .. } = h;
    drop(conn);
    let check = broker.state().logins.pending.pop().expect("recorded");
    assert!(check.is_abandoned());
    check.finish(Ok(alice()));
}

#[test]
fn the_connect_deadline_runs_while_the_check_is_pending() {
    let config = MqttConfig::default();
    let timeout = Duration::from_millis(config.connect_timeout_ms);
    let broker = FakeBroker::new();
    broker.state().logins.defer_passwords = true;
    let mut h = Harness::with(config, broker, false);
    h.input(&connect_subscribe_ping(false));
    assert!(h.conn.poll_timeout().is_some(), "the deadline is armed");
    h.advance(timeout + Duration::from_millis(1));
    assert!(h.conn.is_closed());
    assert!(h.raw_output().is_empty(), "3.1.1: a timeout just closes");
    h.event(SessionEvent::LoginChecked {
        result: Ok(alice()),
    });
    assert!(h.raw_output().is_empty() && h.broker.state().sessions.is_empty());
}

#[test]
fn logins_without_a_password_do_not_wait() {
    let mut h = deferring(false);
    h.input(&connect_v4("anon", true, 30, None));
    assert_eq!(answers(&mut h), ["connack Success"]);
    assert!(h.broker.state().logins.pending.is_empty());
}
