//! A producer's acknowledgement (MQTT PUBACK, STOMP RECEIPT, AMQP
//! `accepted`) is sent only after the `fdatasync` that covers its message.
//!
//! The real MQTT and STOMP connection state machines run over the core,
//! over the journal, over a simulated disk. The journal runs a manual
//! writer, so nothing reaches the disk until the test steps it. At the
//! moment the core reports the commit to the session (what the adapter
//! turns into its acknowledgement), the sink checks that the message's
//! bytes are in the synced part of a journal file, the part a power loss
//! keeps; and the acknowledgement must not be on the wire before the step
//! that synced. Remove the `sync_data` call from the journal writer and
//! all three tests fail.

mod common;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rosetta::core::{AllowAll, Core, CoreConfig};
use rosetta::store::sim::SimDisk;
use rosetta::store::{Store, StoreConfig};
use rosetta_neutral::{Broker, EventSink, SessionEvent};

const DIR: &str = "/sim/ack/journal";

/// Records every event for the connection; at each commit, whether the
/// payload was durable at that moment.
struct CheckingSink {
    disk: SimDisk,
    payload: Vec<u8>,
    events: Mutex<VecDeque<SessionEvent>>,
    durable_at_commit: Mutex<Vec<bool>>,
}

impl EventSink for CheckingSink {
    fn send(&self, event: SessionEvent) {
        if matches!(event, SessionEvent::Committed { .. }) {
            let durable = self.disk.durably_contains(Path::new(DIR), &self.payload);
            self.durable_at_commit.lock().push(durable);
        }
        self.events.lock().push_back(event);
    }
}

struct Rig {
    disk: SimDisk,
    store: Arc<Store>,
    core: Core,
    sink: Arc<CheckingSink>,
}

fn rig(payload: &[u8]) -> Rig {
    let disk = SimDisk::new(11);
    let mut config = StoreConfig::new(PathBuf::from(DIR));
    config.storage = Arc::new(disk.attach());
    config.background_writer = false;
    let (store, recovered) = match Store::open(config) {
        Ok(x) => x,
        Err(e) => panic!("open: {e}"),
    };
    let store = Arc::new(store);
    let core = Core::new(
        CoreConfig::default(),
        store.clone(),
        Arc::new(AllowAll),
        Some(recovered),
    );
    let sink = Arc::new(CheckingSink {
        disk: disk.clone(),
        payload: payload.to_vec(),
        events: Mutex::new(VecDeque::new()),
        durable_at_commit: Mutex::new(Vec::new()),
    });
    Rig {
        disk,
        store,
        core,
        sink,
    }
}

/// The parts of an adapter the test drives.
trait Adapter {
    fn input(&mut self, now: Instant, bytes: &[u8]);
    fn event(&mut self, now: Instant, event: SessionEvent);
    fn transmit(&mut self, out: &mut Vec<u8>);
}

/// The three adapters' entry points have the same names and shapes.
macro_rules! adapter {
    ($($connection:ty),*) => {$(
        impl Adapter for $connection {
            fn input(&mut self, now: Instant, bytes: &[u8]) {
                self.handle_input(now, bytes);
            }
            fn event(&mut self, now: Instant, event: SessionEvent) {
                self.handle_event(now, event);
            }
            fn transmit(&mut self, out: &mut Vec<u8>) {
                self.poll_transmit(out);
            }
        }
    )*};
}

adapter!(
    rosetta_mqtt::MqttConnection,
    rosetta_stomp::StompConnection,
    rosetta_amqp::AmqpConnection
);

impl Rig {
    /// Hands the core's events to the connection and returns what it
    /// writes. The journal is not stepped.
    fn pump(&self, conn: &mut dyn Adapter, now: Instant) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let next = self.sink.events.lock().pop_front();
            match next {
                Some(e) => conn.event(now, e),
                None => break,
            }
        }
        conn.transmit(&mut out);
        out
    }

    /// Steps the journal and pumps until nothing more happens.
    fn settle(&self, conn: &mut dyn Adapter, now: Instant) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..16 {
            self.store.step();
            out.extend(self.pump(conn, now));
        }
        out
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// MQTT 3.1.1 remaining length.
fn remaining_length(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
}

fn mqtt_str(s: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

fn mqtt_connect(client_id: &str) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_str(b"MQTT", &mut body);
    body.push(4); // 3.1.1
    body.push(0x02); // clean session
    body.extend_from_slice(&60u16.to_be_bytes());
    mqtt_str(client_id.as_bytes(), &mut body);
    let mut p = vec![0x10];
    remaining_length(body.len(), &mut p);
    p.extend(body);
    p
}

fn mqtt_publish_qos1(topic: &str, packet_id: u16, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_str(topic.as_bytes(), &mut body);
    body.extend_from_slice(&packet_id.to_be_bytes());
    body.extend_from_slice(payload);
    let mut p = vec![0x32];
    remaining_length(body.len(), &mut p);
    p.extend(body);
    p
}

#[test]
fn mqtt_puback_is_sent_only_once_the_message_is_synced() {
    let payload = b"mqtt payload that must be on disk before its PUBACK";
    let rig = rig(payload);
    let now = Instant::now();
    let broker: Arc<dyn Broker> = Arc::new(rig.core.clone());
    let mut conn = rosetta_mqtt::MqttConnection::new(
        rosetta_mqtt::MqttConfig::default(),
        broker,
        rig.sink.clone(),
        1,
        now,
    );
    conn.input(now, &mqtt_connect("producer"));
    let out = rig.settle(&mut conn, now);
    assert_eq!(out.first(), Some(&0x20), "CONNACK: {out:?}");
    // Commits of the session's own state, if any, are not the point.
    rig.sink.durable_at_commit.lock().clear();

    // A QoS 1 publish to a durable queue: the core journals it.
    conn.input(now, &mqtt_publish_qos1("$queue/orders", 7, payload));
    let out = rig.pump(&mut conn, now);
    let puback = [0x40, 0x02, 0x00, 0x07];
    assert!(
        !contains(&out, &puback),
        "PUBACK before the journal ran: {out:?}"
    );
    assert!(!rig.disk.durably_contains(Path::new(DIR), payload));
    assert!(
        rig.sink.durable_at_commit.lock().is_empty(),
        "no commit yet"
    );

    let out = rig.settle(&mut conn, now);
    assert!(contains(&out, &puback), "PUBACK after the sync: {out:?}");
    assert_eq!(
        *rig.sink.durable_at_commit.lock(),
        vec![true],
        "at the commit (the PUBACK's cause) the message was in the synced part of the journal"
    );
    assert_eq!(rig.core.queue_stats("orders").map(|s| s.depth), Some(1));
}

#[test]
fn stomp_receipt_is_sent_only_once_the_message_is_synced() {
    let payload = b"stomp body that must be on disk before its RECEIPT";
    let rig = rig(payload);
    let now = Instant::now();
    let broker: Arc<dyn Broker> = Arc::new(rig.core.clone());
    let mut conn = rosetta_stomp::StompConnection::new(
        rosetta_stomp::StompConfig::default(),
        broker,
        rig.sink.clone(),
        1,
        now,
    );
    conn.input(now, b"CONNECT\naccept-version:1.2\nhost:/\n\n\0");
    let out = rig.settle(&mut conn, now);
    assert!(
        out.starts_with(b"CONNECTED"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    rig.sink.durable_at_commit.lock().clear();

    let mut send = b"SEND\ndestination:/queue/orders\npersistent:true\nreceipt:r-1\n\n".to_vec();
    send.extend_from_slice(payload);
    send.push(0);
    conn.input(now, &send);
    let out = rig.pump(&mut conn, now);
    assert!(
        !contains(&out, b"RECEIPT"),
        "RECEIPT before the journal ran: {}",
        String::from_utf8_lossy(&out)
    );
    assert!(!rig.disk.durably_contains(Path::new(DIR), payload));

    let out = rig.settle(&mut conn, now);
    assert!(
        contains(&out, b"RECEIPT\nreceipt-id:r-1"),
        "RECEIPT after the sync: {}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(*rig.sink.durable_at_commit.lock(), vec![true]);
    assert_eq!(rig.core.queue_stats("orders").map(|s| s.depth), Some(1));
}

#[test]
fn amqp_accepted_is_sent_only_once_the_message_is_synced() {
    use common::amqp::{self as raw, enc};
    let payload = "amqp body that must be on disk before its accepted outcome";
    let rig = rig(payload.as_bytes());
    let now = Instant::now();
    let broker: Arc<dyn Broker> = Arc::new(rig.core.clone());
    let mut conn = rosetta_amqp::AmqpConnection::new(
        rosetta_amqp::AmqpConfig::default(),
        broker,
        rig.sink.clone(),
        1,
        now,
    );
    let mut handshake = raw::protocol_header(0).to_vec();
    handshake.extend(raw::frame(0, 0, &raw::open_body("producer", 65_536, None)));
    handshake.extend(raw::frame(0, 0, &raw::begin_body()));
    handshake.extend(raw::frame(
        0,
        0,
        &raw::attach_sender_body("orders-sender", 0, "orders"),
    ));
    conn.input(now, &handshake);
    let out = rig.settle(&mut conn, now);
    assert!(
        out.starts_with(&raw::protocol_header(0)),
        "protocol header, open, begin, attach: {out:?}"
    );
    rig.sink.durable_at_commit.lock().clear();

    // One unsettled transfer of a durable message: header (durable = true)
    // and an amqp-value body.
    let mut transfer = raw::transfer_body(0, 0, false);
    transfer.extend(enc::described(0x70, &[enc::boolean(true)]));
    transfer.extend(raw::value_section(payload));
    conn.input(now, &raw::frame(0, 0, &transfer));
    let out = rig.pump(&mut conn, now);
    // disposition (0x15) with the accepted outcome (0x24).
    let accepted =
        |out: &[u8]| contains(out, &[0x00, 0x53, 0x15]) && contains(out, &[0x00, 0x53, 0x24]);
    assert!(!accepted(&out), "accepted before the journal ran: {out:?}");
    assert!(!rig
        .disk
        .durably_contains(Path::new(DIR), payload.as_bytes()));
    assert!(
        rig.sink.durable_at_commit.lock().is_empty(),
        "no commit yet"
    );

    let out = rig.settle(&mut conn, now);
    assert!(accepted(&out), "accepted after the sync: {out:?}");
    assert_eq!(
        *rig.sink.durable_at_commit.lock(),
        vec![true],
        "at the commit (the outcome's cause) the message was in the synced part of the journal"
    );
    assert_eq!(rig.core.queue_stats("orders").map(|s| s.depth), Some(1));
}
