//! AMQP 1.0 receiver-settle-mode `second` (spec 2.8.2.2) over real sockets,
//! both ways:
//! - a client sender asking for it gets it: the broker's outcome comes
//!   unsettled, after the commit, and the sender settles;
//! - a client receiver in mode second leaves its outcome unsettled, and the
//!   broker answers with its settling disposition.
//!
//! fe2o3-amqp runs the whole exchange (it supports `ReceiverSettleMode::Second`);
//! a raw client checks the `settled` flags on the wire, which fe2o3 hides.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::amqp::{
    self, durable, enc, frame, send_accepted, RawAmqp, ATTACH, DISPOSITION, FLOW, TRANSFER, WAIT,
};
use common::TestBroker;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::definitions::ReceiverSettleMode;
use fe2o3_amqp::{Receiver, Sender};

/// The broker's credit window for client senders in these tests: small, so
/// that a few dozen messages cross it many times.
const WINDOW: u32 = 8;

async fn small_window_broker() -> TestBroker {
    TestBroker::start_with(
        |c| c.amqp.link_credit_window = WINDOW,
        Arc::new(rosetta::core::AllowAll),
    )
    .await
}

// ------------------------------------------------------- tiny wire reader

/// Splits off the encoded AMQP value at the start of `b` (the primitive
/// encodings these performatives use before their first described field).
fn split_value(b: &[u8]) -> (&[u8], &[u8]) {
    let len = match b[0] {
        0x40..=0x45 => 1,
        0x50..=0x56 => 2,
        0x60 => 3,
        0x70..=0x73 => 5,
        0x80..=0x84 => 9,
        0xa0 | 0xa1 | 0xa3 => 2 + usize::from(b[1]),
        0xb0 | 0xb1 | 0xb3 => {
            5 + usize::try_from(u32::from_be_bytes([b[1], b[2], b[3], b[4]])).expect("len")
        }
        code => panic!("unexpected format code {code:#x}"),
    };
    b.split_at(len)
}

/// The first `n` fields of a performative body (a described list); fields
/// past the end of the list are `None`.
fn fields(body: &[u8], n: usize) -> Vec<Option<Vec<u8>>> {
    assert_eq!(&body[..2], &[0x00, 0x53], "described performative");
    let (count, mut rest) = match body[3] {
        0x45 => (0, &body[4..]),
        0xc0 => (usize::from(body[5]), &body[6..]),
        0xd0 => (
            usize::try_from(u32::from_be_bytes([body[8], body[9], body[10], body[11]]))
                .expect("count"),
            &body[12..],
        ),
        code => panic!("not a list: {code:#x}"),
    };
    (0..n)
        .map(|i| {
            (i < count).then(|| {
                let (v, r) = split_value(rest);
                rest = r;
                v.to_vec()
            })
        })
        .collect()
}

fn as_bool(v: &Option<Vec<u8>>) -> Option<bool> {
    match v.as_deref() {
        Some([0x41]) | Some([0x56, 1]) => Some(true),
        Some([0x42]) | Some([0x56, 0]) => Some(false),
        _ => None,
    }
}

fn as_uint(v: &Option<Vec<u8>>) -> Option<u32> {
    match v.as_deref() {
        Some([0x43]) => Some(0),
        Some([0x52, n]) => Some(u32::from(*n)),
        Some([0x70, a, b, c, d]) => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// Role (true: receiver), first, settled of a disposition, and whether its
/// state is `accepted`.
fn disposition(f: &common::amqp::RawFrame) -> (bool, u32, bool, bool) {
    let v = fields(&f.body, 4);
    let role = as_bool(&v[0]).expect("role");
    let first = as_uint(&v[1]).expect("first");
    let settled = as_bool(&v[3]).unwrap_or(false);
    // The state follows `settled`: accepted is descriptor 0x24.
    let accepted = f.body.windows(3).any(|w| w == [0x00, 0x53, 0x24]);
    (role, first, settled, accepted)
}

/// Attach with rcv-settle-mode `second` (ubyte 1).
fn attach_second(name: &str, handle: u32, role_receiver: bool, address: &str) -> Vec<u8> {
    let source = enc::described(0x28, &[enc::str8(address)]);
    let target = enc::described(0x29, &[enc::str8(address)]);
    enc::described(
        ATTACH,
        &[
            enc::str8(name),
            enc::uint(handle),
            enc::boolean(role_receiver),
            enc::ubyte(0), // snd-settle-mode unsettled
            enc::ubyte(1), // rcv-settle-mode second
            source,
            target,
            enc::null(),
            enc::null(),
            if role_receiver {
                enc::null()
            } else {
                enc::uint(0)
            },
        ],
    )
}

/// A disposition: role (true: receiver), first, settled, state accepted.
fn disposition_body(role_receiver: bool, first: u32, settled: bool) -> Vec<u8> {
    enc::described(
        DISPOSITION,
        &[
            enc::boolean(role_receiver),
            enc::uint(first),
            enc::null(),
            enc::boolean(settled),
            enc::described(0x24, &[]),
        ],
    )
}

fn durable_value(text: &str) -> Vec<u8> {
    // header(durable = true), then an amqp-value string.
    let mut p = enc::described(0x70, &[enc::boolean(true)]);
    p.extend(amqp::value_section(text));
    p
}

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn fe2o3_sender_in_mode_second_across_many_credit_windows() {
    let broker = small_window_broker().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "second-snd").await;
    let mut s = Sender::builder()
        .name("s")
        .target("/queue/second-in")
        .receiver_settle_mode(ReceiverSettleMode::Second)
        .attach(&mut session)
        .await
        .expect("sender in mode second");
    // Five windows' worth: each send completes only on the broker's
    // (unsettled) outcome, and credit keeps coming although fe2o3-amqp 0.18
    // never sends the settling disposition for the last id of a disposition
    // (its session drops the last run of ids it should echo).
    let n = WINDOW * 5;
    for i in 0..n {
        let outcome = tokio::time::timeout(WAIT, s.send(durable(&format!("m{i}"))))
            .await
            .unwrap_or_else(|_| panic!("send {i} completes in time"))
            .expect("send");
        outcome.accepted_or_else(|o| o).expect("accepted");
    }
    assert_eq!(broker.depth("second-in"), (u64::from(n), 0));
    s.close().await.expect("close");
    conn.close().await.expect("close");
    broker.stop().await;
}

#[tokio::test]
async fn sender_in_mode_second_on_the_wire() {
    let broker = small_window_broker().await;
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open_and_begin().await;
    assert!(
        raw.write(&frame(
            0,
            0,
            &attach_second("raw-snd", 0, false, "/queue/wire")
        ))
        .await
    );
    let reply = raw.expect(ATTACH).await;
    let v = fields(&reply.body, 5);
    assert_eq!(as_bool(&v[2]), Some(true), "the broker is the receiver");
    assert_eq!(
        v[4].as_deref(),
        Some(&[0x50, 1][..]),
        "rcv-settle-mode second"
    );
    let flow = raw.expect(FLOW).await;
    // Link-credit is flow field 6.
    assert_eq!(as_uint(&fields(&flow.body, 7)[6]), Some(WINDOW));

    // A whole window, unsettled.
    for id in 0..WINDOW {
        let mut body = amqp::transfer_body(0, id, false);
        body.extend(durable_value(&format!("w{id}")));
        assert!(raw.write(&frame(0, 0, &body)).await);
    }
    let mut answered = Vec::new();
    while answered.len() < WINDOW as usize {
        let f = raw.expect(DISPOSITION).await;
        let (role_receiver, first, settled, accepted) = disposition(&f);
        assert!(role_receiver && accepted, "{:?}", f.body);
        assert!(!settled, "mode second: the broker does not settle first");
        let last = as_uint(&fields(&f.body, 3)[2]).unwrap_or(first);
        answered.extend(first..=last);
    }
    assert_eq!(broker.depth("wire").0, u64::from(WINDOW), "committed first");
    // We settle, as mode second asks of us; the broker has nothing to add.
    for id in answered {
        assert!(
            raw.write(&frame(0, 0, &disposition_body(false, id, true)))
                .await
        );
    }
    match raw.read_frame_within(amqp::QUIET).await {
        Err(common::amqp::RawEnd::Timeout) | Ok(common::amqp::RawFrame { .. }) => {}
        Err(e) => panic!("connection ended: {e:?}"),
    }
    // And the link goes on.
    let mut body = amqp::transfer_body(0, WINDOW, false);
    body.extend(durable_value("after"));
    assert!(raw.write(&frame(0, 0, &body)).await);
    let f = raw.expect(DISPOSITION).await;
    assert_eq!(disposition(&f), (true, WINDOW, false, true));
    broker.stop().await;
}

#[tokio::test]
async fn receiver_in_mode_second_is_settled_by_the_broker() {
    let broker = TestBroker::start().await;
    let (mut conn, mut session) = amqp::connect_session(&broker, "second-rcv").await;
    let mut s = amqp::sender(&mut session, "s", "/queue/second-out").await;
    for i in 0..4 {
        send_accepted(&mut s, durable(&format!("m{i}"))).await;
    }

    // fe2o3 in mode second: its accept goes out unsettled.
    let mut r = Receiver::builder()
        .name("r")
        .source("/queue/second-out")
        .receiver_settle_mode(ReceiverSettleMode::Second)
        .credit_mode(CreditMode::Manual)
        .attach(&mut session)
        .await
        .expect("receiver in mode second");
    r.set_credit(2).await.expect("credit");
    for i in 0..2 {
        let d = amqp::recv::<String>(&mut r).await;
        assert_eq!(d.body(), &format!("m{i}"));
        r.accept(&d).await.expect("accept");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("second-out"), (2, 0), "outcomes applied");
    r.close().await.expect("close");

    // On the wire: the broker answers the unsettled outcome with a settled
    // disposition of its own (role sender).
    let mut raw = RawAmqp::connect(broker.amqp()).await;
    raw.open_and_begin().await;
    assert!(
        raw.write(&frame(
            0,
            0,
            &attach_second("raw-rcv", 0, true, "/queue/second-out")
        ))
        .await
    );
    let reply = raw.expect(ATTACH).await;
    assert_eq!(fields(&reply.body, 5)[4].as_deref(), Some(&[0x50, 1][..]));
    let credit = enc::described(
        FLOW,
        &[
            enc::uint(0),
            enc::uint(1000),
            enc::uint(0),
            enc::uint(1000),
            enc::uint(0),
            enc::uint(0),
            enc::uint(1),
        ],
    );
    assert!(raw.write(&frame(0, 0, &credit)).await);
    let t = raw.expect(TRANSFER).await;
    let id = as_uint(&fields(&t.body, 2)[1]).expect("delivery-id");
    assert!(
        raw.write(&frame(0, 0, &disposition_body(true, id, false)))
            .await
    );
    let f = raw.expect(DISPOSITION).await;
    assert_eq!(
        disposition(&f),
        (false, id, true, true),
        "settled by the sender"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.depth("second-out"), (1, 0));
    conn.close().await.expect("close");
    broker.stop().await;
}
