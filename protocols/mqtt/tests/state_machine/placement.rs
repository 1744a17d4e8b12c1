//! The balancer's answer at CONNECT (`Broker::place_connection`): a v5
//! client that belongs elsewhere gets 0x9C/0x9D with the Server Reference
//! and no session; 3.1.1 is served here; no node ready is 0x88 / code 3.

use mqttbytes::{v4, v5};
use rosetta_neutral::{Placement, RedirectTarget};

use crate::harness::{connect_v4, connect_v5, Harness};

fn redirect(permanent: bool) -> Placement {
    Placement::Redirect(RedirectTarget {
        host: "10.0.0.2".into(),
        port: 1884,
        permanent,
    })
}

fn connack5(h: &mut Harness, id: &str) -> v5::ConnAck {
    let mut c = v5::Connect::new(id);
    c.keep_alive = 30;
    h.input(&connect_v5(c));
    match h.v5_packets().as_slice() {
        [v5::Packet::ConnAck(a)] => a.clone(),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

#[test]
fn a_v5_client_that_belongs_elsewhere_gets_use_another_server_and_no_session() {
    let mut h = Harness::new(true);
    h.broker.state().placement = Some(redirect(false));
    let ack = connack5(&mut h, "dev-1");
    assert_eq!(ack.code, v5::ConnectReturnCode::UseAnotherServer);
    let props = ack.properties.expect("properties");
    assert_eq!(props.server_reference.as_deref(), Some("10.0.0.2:1884"));
    assert!(h.conn.is_closed());
    let s = h.broker.state();
    assert!(s.sessions.is_empty(), "no session opened");
    assert_eq!(s.placement_asked, [(Some("dev-1".to_owned()), None)]);
}

#[test]
fn server_moved_when_the_redirect_is_permanent() {
    let mut h = Harness::new(true);
    h.broker.state().placement = Some(redirect(true));
    let ack = connack5(&mut h, "dev-1");
    assert_eq!(ack.code, v5::ConnectReturnCode::ServerMoved);
}

#[test]
fn no_node_ready_is_server_unavailable_in_both_versions() {
    let mut h = Harness::new(true);
    h.broker.state().placement = Some(Placement::Unavailable);
    assert_eq!(
        connack5(&mut h, "dev-1").code,
        v5::ConnectReturnCode::ServerUnavailable
    );

    let mut h = Harness::new(false);
    h.broker.state().placement = Some(Placement::Unavailable);
    h.input(&connect_v4("dev-1", true, 30, None));
    match h.v4_packets().as_slice() {
        [v4::Packet::ConnAck(a)] => assert_eq!(a.code, v4::ConnectReturnCode::ServiceUnavailable),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    assert!(h.broker.state().sessions.is_empty());
}

#[test]
fn a_v311_client_that_belongs_elsewhere_is_served_here() {
    let mut h = Harness::new(false);
    h.broker.state().placement = Some(redirect(false));
    h.connect_ok("dev-1", true);
    assert_eq!(h.broker.state().sessions.len(), 1);
}

#[test]
fn an_assigned_client_id_is_no_key() {
    let mut h = Harness::new(true);
    let _ = connack5(&mut h, "");
    assert_eq!(h.broker.state().placement_asked, [(None, None)]);
}
