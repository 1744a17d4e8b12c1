//! A receiver's selector filter, `exclusive`/`priority` link properties
//! and `distribution-mode = copy` reach the core's consumer options; the
//! selector is echoed only when applied; a refused selector refuses the
//! link; a browser's deliveries go out settled and its end drains the
//! link's credit.

use fe2o3_amqp_types::definitions::Fields;
use fe2o3_amqp_types::messaging::{DistributionMode, FilterSet};
use fe2o3_amqp_types::primitives::Value;
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;

use super::*;

fn selector(text: &str) -> Value {
    Value::Described(Box::new(Described {
        descriptor: Descriptor::Name(Symbol::from("apache.org:selector-filter:string")),
        value: Value::String(text.into()),
    }))
}

fn with_filter(mut a: Attach, key: &str, value: Value) -> Attach {
    let mut f = FilterSet::new();
    f.insert(Symbol::from(key), value);
    a.source.as_mut().unwrap().filter = Some(f);
    a
}

#[test]
fn selector_and_link_properties_reach_the_consumer_and_the_selector_is_echoed() {
    let mut p = Peer::new(true);
    p.open();
    let mut a = with_filter(
        attach("sel", 0, Role::Receiver, Some("/queue/q")),
        "jms-selector",
        selector("colour = 'green'"),
    );
    let mut props = Fields::new();
    props.insert(Symbol::from("exclusive"), Value::Bool(true));
    props.insert(Symbol::from("priority"), Value::Int(3));
    props.insert(Symbol::from("visibility-timeout"), Value::Uint(30_000));
    a.properties = Some(props);
    let reply = attach_receiver(&mut p, 0, a);
    let got = p.log().consumers[0].options.clone();
    // Every receiver names its group (container/link) in case its queue
    // is a stream; without an offset filter it asks for no stream.
    let stream = got.stream.clone().expect("a group hint");
    assert_eq!((stream.offset, stream.declare), (None, false));
    assert!(stream.group.is_some_and(|g| g.contains('/')));
    assert_eq!(
        got,
        ConsumerOptions {
            selector: Some("colour = 'green'".into()),
            exclusive: true,
            priority: 3,
            browse: false,
            visibility_timeout_ms: Some(30_000),
            stream: got.stream.clone(),
        }
    );
    let echoed = reply.source.unwrap().filter.unwrap();
    assert_eq!(
        echoed.get(&Symbol::from("jms-selector")),
        Some(&selector("colour = 'green'"))
    );
}

#[test]
fn a_selector_on_a_topic_subscription_is_echoed_next_to_no_local() {
    let mut p = Peer::new(true);
    p.open();
    let mut a = with_filter(
        attach("t", 0, Role::Receiver, Some("/topic/a/b")),
        "selector",
        selector("n > 1"),
    );
    a.source.as_mut().unwrap().filter.as_mut().unwrap().insert(
        Symbol::from("no-local"),
        Value::Described(Box::new(Described {
            descriptor: Descriptor::Name(Symbol::from("apache.org:no-local-filter:list")),
            value: Value::List(Vec::new()),
        })),
    );
    let reply = attach_receiver(&mut p, 0, a);
    assert_eq!(
        p.log().consumers[0].options.selector.as_deref(),
        Some("n > 1")
    );
    let echoed = reply.source.unwrap().filter.unwrap();
    assert!(echoed.get(&Symbol::from("selector")).is_some());
    assert!(echoed.get(&Symbol::from("no-local")).is_some());
}

#[test]
fn a_selector_the_core_refuses_refuses_the_link_with_invalid_field() {
    let mut p = Peer::new(true);
    p.open();
    let a = with_filter(
        attach("bad", 0, Role::Receiver, Some("/queue/q")),
        "selector",
        selector("((a = 1"),
    );
    p.send(0, &a, &[]);
    let out = p.perfs();
    let [Performative::Attach(r), Performative::Detach(d)] = &out[..] else {
        panic!("{out:?}")
    };
    assert!(r.source.is_none(), "refused: null source");
    let e = d.error.as_ref().unwrap();
    assert_eq!(condition_symbol(e), "amqp:invalid-field");
    assert!(e
        .description
        .as_deref()
        .unwrap()
        .contains("unbalanced parenthesis"));
    // On a topic, the subscription queue made for the link goes too.
    let a = with_filter(
        attach("bad-t", 1, Role::Receiver, Some("/topic/x")),
        "selector",
        selector("((a = 1"),
    );
    p.send(0, &a, &[]);
    p.perfs();
    let log = p.log();
    assert_eq!(log.declared.len(), 1);
    assert_eq!(log.deleted.len(), 1, "the unused queue is dropped");
    assert!(log.consumers.is_empty());
}

#[test]
fn link_properties_of_the_wrong_type_refuse_the_link_before_anything_is_declared() {
    let mut p = Peer::new(true);
    p.open();
    let mut a = attach("x", 0, Role::Receiver, Some("/topic/x"));
    let mut props = Fields::new();
    props.insert(Symbol::from("priority"), Value::String("high".into()));
    a.properties = Some(props);
    p.send(0, &a, &[]);
    let out = p.perfs();
    let Some(Performative::Detach(d)) = out.get(1) else {
        panic!("{out:?}")
    };
    assert_eq!(
        condition_symbol(d.error.as_ref().unwrap()),
        "amqp:invalid-field"
    );
    assert!(p.log().declared.is_empty());
}

fn browser(p: &mut Peer) -> Attach {
    let mut a = attach("browser", 0, Role::Receiver, Some("/queue/q"));
    a.source.as_mut().unwrap().distribution_mode = Some(DistributionMode::Copy);
    attach_receiver(p, 0, a)
}

#[test]
fn copy_distribution_browses_with_settled_deliveries() {
    let mut p = Peer::new(true);
    p.open();
    let reply = browser(&mut p);
    {
        let log = p.log();
        assert!(log.consumers[0].options.browse);
        assert!(log.consumers[0].auto_settle, "copies need no settlement");
    }
    assert_eq!(reply.snd_settle_mode, SenderSettleMode::Settled);
    assert_eq!(
        reply.source.unwrap().distribution_mode,
        Some(DistributionMode::Copy)
    );
    p.send(0, &flow(0, 0, 10, false), &[]);
    p.event(delivery(1, 7, b"peek"));
    let out = p.recv();
    let Out::Perf(0, Performative::Transfer(t), _) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(t.settled, Some(true));
}

#[test]
fn browse_end_drains_the_remaining_credit_now_and_later() {
    let mut p = Peer::new(true);
    p.open();
    browser(&mut p);
    p.send(0, &flow(0, 0, 10, false), &[]);
    for tag in 1..=3 {
        p.event(delivery(1, tag, b"peek"));
    }
    assert_eq!(p.perfs().len(), 3);
    p.event(SessionEvent::BrowseEnded {
        consumer: ConsumerId(1),
    });
    let out = p.perfs();
    let [Performative::Flow(f)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(f.handle, Some(Handle(0)));
    assert_eq!(f.delivery_count, Some(10), "3 sent + 7 drained");
    assert_eq!(f.link_credit, Some(0));
    // Credit the client grants afterwards is drained at once, without
    // asking the core for deliveries it will never send.
    let credits_before = p.log().credits.len();
    p.send(0, &flow(0, 10, 5, false), &[]);
    let out = p.perfs();
    let [Performative::Flow(f)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(f.delivery_count, Some(15));
    assert_eq!(f.link_credit, Some(0));
    assert_eq!(p.log().credits.len(), credits_before);
}
