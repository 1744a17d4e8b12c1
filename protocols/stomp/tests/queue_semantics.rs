//! SUBSCRIBE's queue-semantics headers (selector, exclusivity, priority,
//! browsing) reach the core's consumer options, and a browser's end and
//! ACKs are handled as ActiveMQ clients expect: fake core, virtual clock.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns: a panic is a test failure

mod common;

use common::{last_consumer, Call, Harness};
use rosetta_neutral::*;
use rosetta_stomp::Command;

fn subscribe(extra: &str) -> (Harness, u64, ConsumerSpec) {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(format!("SUBSCRIBE\nid:s1\ndestination:/queue/q\n{extra}\n\0").as_bytes());
    let (consumer, spec) = last_consumer(&h.take_calls());
    (h, consumer, spec)
}

#[test]
fn selector_exclusive_and_priority_reach_the_consumer() {
    let (_, _, spec) = subscribe(
        "selector:colour = 'green' AND weight > 5\nactivemq.exclusive:true\nactivemq.priority:7\nvisibility-timeout:30000\n",
    );
    assert_eq!(
        spec.options,
        ConsumerOptions {
            selector: Some("colour = 'green' AND weight > 5".into()),
            exclusive: true,
            priority: 7,
            browse: false,
            visibility_timeout_ms: Some(30_000),
            stream: None,
        }
    );
    let (_, _, plain) = subscribe("");
    assert_eq!(plain.options, ConsumerOptions::default());
}

#[test]
fn an_invalid_selector_is_an_error_frame_with_the_parsers_text() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:s1\ndestination:/queue/q\nselector:((a = 1\nreceipt:r\n\n\0");
    let f = h.frame();
    assert_eq!(f.command, Command::Error);
    assert_eq!(f.header("message"), Some("invalid selector"));
    assert_eq!(f.header("receipt-id"), Some("r"));
    let body = String::from_utf8_lossy(&f.body);
    assert!(body.contains("unbalanced parenthesis"), "{body}");
    assert!(h.conn.is_closed());
}

#[test]
fn bad_option_values_are_refused_before_the_core_is_asked() {
    for extra in [
        "activemq.priority:128\n",
        "activemq.priority:-3\n",
        "activemq.exclusive:maybe\n",
        "browser:yes\n",
        "visibility-timeout:0\n",
        "visibility-timeout:43200001\n",
        "visibility-timeout:soon\n",
    ] {
        let mut h = Harness::new();
        h.connect("1.2", "");
        h.input(format!("SUBSCRIBE\nid:s1\ndestination:/queue/q\n{extra}\n\0").as_bytes());
        let f = h.frame();
        assert_eq!(f.command, Command::Error, "{extra}");
        assert_eq!(f.header("message"), Some("invalid header"), "{extra}");
        assert!(
            !h.calls().iter().any(|c| matches!(c, Call::Consume(..))),
            "{extra}"
        );
    }
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SUBSCRIBE\nid:s1\ndestination:/topic/t\nbrowser:true\n\n\0");
    assert_eq!(h.frame().header("message"), Some("invalid destination"));
}

#[test]
fn a_browser_gets_settled_copies_and_the_end_of_browse_message() {
    let (mut h, consumer, spec) = subscribe("browser:true\nack:client\n");
    assert!(spec.options.browse);
    assert!(spec.auto_settle, "copies need no settlement");
    h.deliver(consumer, 1, Message::text("one"));
    let m = h.frame();
    assert_eq!(m.command, Command::Message);
    assert_eq!(m.header("ack"), None, "nothing to acknowledge");
    let message_id = m.header("message-id").unwrap().to_owned();
    h.event(SessionEvent::BrowseEnded {
        consumer: ConsumerId(consumer),
    });
    let end = h.frame();
    assert_eq!(end.command, Command::Message);
    assert_eq!(end.header("browser"), Some("end"));
    assert_eq!(end.header("subscription"), Some("s1"));
    assert_eq!(end.header("destination"), Some("/queue/q"));
    assert_eq!(end.header("message-id"), Some("0"));
    assert!(end.body.is_empty());
    // ACKs of the copies and of the end marker are taken and do nothing.
    h.input(format!("ACK\nid:{message_id}\nreceipt:a1\n\n\0").as_bytes());
    h.input(b"NACK\nid:0\nsubscription:s1\nreceipt:a2\n\n\0");
    let receipts: Vec<_> = h
        .frames()
        .iter()
        .map(|f| f.header("receipt-id").map(str::to_owned))
        .collect();
    assert_eq!(receipts, [Some("a1".into()), Some("a2".into())]);
    assert!(!h.take_calls().iter().any(|c| matches!(c, Call::Settle(..))));
    assert!(!h.conn.is_closed());
}

#[test]
fn browse_end_for_a_cancelled_subscription_writes_nothing() {
    let (mut h, consumer, _) = subscribe("browser:true\n");
    h.input(b"UNSUBSCRIBE\nid:s1\n\n\0");
    h.event(SessionEvent::BrowseEnded {
        consumer: ConsumerId(consumer),
    });
    assert!(h.frames().is_empty());
    assert!(!h.conn.is_closed());
}

#[test]
fn message_priority_and_group_headers_reach_the_message() {
    let mut h = Harness::new();
    h.connect("1.2", "");
    h.input(b"SEND\ndestination:/queue/q\npriority:8\nJMSXGroupID:g-1\nJMSXGroupSeq:4\n\nx\0");
    let m = h
        .take_calls()
        .into_iter()
        .find_map(|c| match c {
            Call::Publish(_, m, _) => Some(m),
            _ => None,
        })
        .unwrap();
    assert_eq!(m.priority, 8);
    assert_eq!(m.group_id.as_deref(), Some("g-1"));
    assert_eq!(m.group_sequence, Some(4));
    assert!(m.properties.is_empty(), "{:?}", m.properties);
}
