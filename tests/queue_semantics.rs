//! Queue semantics of the core (issue 15) over real STOMP connections:
//! message priority and message groups, whose headers (`priority`,
//! `JMSXGroupID`) the STOMP adapter already maps. Consumer options
//! (selectors, exclusive, browsing) arrive with their adapter mappings.

mod common;

use common::stomp::StompClient;
use common::TestBroker;

/// Higher priority first, FIFO within a priority, whatever the order sent.
#[tokio::test]
async fn a_queue_delivers_higher_priorities_first_fifo_within_each() {
    let broker = TestBroker::start().await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    for (body, priority) in [("a", "4"), ("b", "9"), ("c", "0"), ("d", "9"), ("e", "4")] {
        p.send_persistent("/queue/prio", &[("priority", priority)], body.as_bytes())
            .await;
    }
    let mut c = StompClient::connect(broker.stomp(), &[]).await;
    c.subscribe("s", "/queue/prio", "client-individual", &[])
        .await;
    let got: Vec<String> = c.messages(5).await.iter().map(|m| m.text()).collect();
    assert_eq!(got, vec!["b", "d", "a", "e", "c"]);
}

/// A group sticks to one consumer, in order; when that consumer's
/// connection dies mid-stream, the group moves to the other starting with
/// its first unacknowledged message, nothing lost or reordered.
#[tokio::test]
async fn a_group_moves_in_order_when_its_consumers_connection_dies() {
    let broker = TestBroker::start().await;
    let mut first = StompClient::connect(broker.stomp(), &[]).await;
    first
        .subscribe(
            "s",
            "/queue/groups",
            "client-individual",
            &[("activemq.prefetchSize", "3")],
        )
        .await;
    let mut p = StompClient::connect(broker.stomp(), &[]).await;
    for i in 0..6 {
        p.send_persistent(
            "/queue/groups",
            &[("JMSXGroupID", "g")],
            format!("g-{i}").as_bytes(),
        )
        .await;
    }
    let got = first.messages(3).await;
    let texts: Vec<String> = got.iter().map(|m| m.text()).collect();
    assert_eq!(texts, vec!["g-0", "g-1", "g-2"]);
    first.ack(&got[0]).await;
    assert_eq!(first.message().await.text(), "g-3");
    // The second consumer attaches while the group is the first one's: it
    // gets none of it.
    let mut second = StompClient::connect(broker.stomp(), &[]).await;
    second
        .subscribe("s", "/queue/groups", "client-individual", &[])
        .await;
    assert!(second.message_or_none().await.is_none());
    // The first connection dies with g-1..g-3 unacknowledged.
    drop(first);
    let moved: Vec<String> = second.messages(5).await.iter().map(|m| m.text()).collect();
    assert_eq!(moved, vec!["g-1", "g-2", "g-3", "g-4", "g-5"]);
}
