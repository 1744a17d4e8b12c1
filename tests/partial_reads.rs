//! Input that arrives in pieces, with pauses between them, over real
//! sockets. The connection driver reads MQTT and AMQP straight into the
//! adapter's parse buffer and drops that buffer when the connection goes
//! quiet; a buffer holding part of a packet must survive the pause, and a
//! packet cut anywhere must still parse once the rest comes.

// The shared harness is `pub` for every test crate; each uses a subset.
#![allow(unreachable_pub)]

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::mqtt::p4;
use common::TestBroker;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes `bytes` in pieces cut at `cuts`, pausing after each so that the
/// broker reads each piece on its own (and sees the connection go quiet).
async fn write_in_pieces(io: &mut TcpStream, bytes: &[u8], cuts: &[usize]) {
    let mut from = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        io.write_all(&bytes[from..cut]).await.expect("write");
        io.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(30)).await;
        from = cut;
    }
}

async fn read_exact(io: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    tokio::time::timeout(Duration::from_secs(5), io.read_exact(&mut buf))
        .await
        .expect("reply within 5 s")
        .expect("read");
    buf
}

fn v4_bytes(p: p4::Packet) -> Vec<u8> {
    let mut b = BytesMut::new();
    p.write(&mut b, 1 << 28).expect("encode");
    b.to_vec()
}

#[tokio::test]
async fn mqtt_packets_cut_anywhere_parse_after_pauses() {
    let broker = TestBroker::start().await;
    let mut io = TcpStream::connect(broker.mqtt()).await.expect("connect");
    let connect = v4_bytes(p4::Packet::Connect(p4::Connect::new("dribbler")));
    // Byte by byte through the fixed header, then the rest.
    write_in_pieces(&mut io, &connect, &[1, 2, 3, 4]).await;
    assert_eq!(
        read_exact(&mut io, 4).await,
        [0x20, 0x02, 0x00, 0x00],
        "CONNACK"
    );

    // A 3 KiB QoS 1 publish in three pieces: larger than the smallest read,
    // so the buffer grows while it is still incomplete.
    let mut publish = p4::Publish::new("dribble/t", rumqttc::QoS::AtLeastOnce, vec![7u8; 3 * 1024]);
    publish.pkid = 9;
    let publish = v4_bytes(p4::Packet::Publish(publish));
    write_in_pieces(&mut io, &publish, &[3, 700, 2_000]).await;
    assert_eq!(
        read_exact(&mut io, 4).await,
        [0x40, 0x02, 0x00, 0x09],
        "PUBACK"
    );
    broker.stop().await;
}

#[tokio::test]
async fn amqp_header_byte_by_byte_gets_the_sasl_header() {
    let broker = TestBroker::start().await;
    let mut io = TcpStream::connect(broker.amqp()).await.expect("connect");
    let header = *b"AMQP\x03\x01\x00\x00";
    write_in_pieces(&mut io, &header, &[1, 2, 3, 4, 5, 6, 7]).await;
    assert_eq!(
        read_exact(&mut io, 8).await,
        header,
        "SASL protocol header back"
    );
    broker.stop().await;
}
