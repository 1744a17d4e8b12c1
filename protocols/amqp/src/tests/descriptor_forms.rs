//! Every described type the broker reads, with its descriptor in each form
//! AMQP 1.0 §1.5 allows (symbol or ulong, short or long encoding), as
//! python-qpid-proton and others write them.

use bytes::Bytes;
use fe2o3_amqp_types::definitions::{
    AmqpError as WireCondition, Error as WireError, ErrorCondition, Fields, Handle, Role,
};
use fe2o3_amqp_types::messaging::annotations::OwnedKey;
use fe2o3_amqp_types::messaging::{
    Accepted, AmqpSequence, AmqpValue, ApplicationProperties, Data, DeleteOnClose,
    DeliveryAnnotations, DeliveryState, FilterSet, Footer, Header, LifetimePolicy,
    MessageAnnotations, Modified, Outcome, Properties, Received, Rejected, Released, Source,
    Target, TargetArchetype,
};
use fe2o3_amqp_types::performatives::{
    Attach, Begin, ChannelMax, Close, Detach, Disposition, End, Flow, MaxFrameSize, Open,
    Performative, Transfer,
};
use fe2o3_amqp_types::primitives::{Array, Binary, OrderedMap, SimpleValue, Symbol, Value};
use fe2o3_amqp_types::sasl::{
    SaslChallenge, SaslCode, SaslInit, SaslMechanisms, SaslOutcome, SaslResponse,
};
use fe2o3_amqp_types::transaction::{
    Coordinator, Declare, Declared, Discharge, TransactionalState,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;

use super::{attach, attach_receiver, attach_sender, transfer, Peer};
use crate::codec;
use crate::descriptor::{self, Form};
use rosetta_neutral::{Address, Body, BodyKind};

/// The forms a peer may write a descriptor in besides `smallulong`.
const FORMS: [Form; 3] = [Form::Symbolic, Form::SymbolicWide, Form::NumericWide];

/// Checks one value in every descriptor form: `codec::decode` (serde_amqp
/// after our size checks) gives the same value as from the numeric form,
/// and `descriptor_code` the same code. Generic values (filters, node
/// properties) keep the form they came in, so "the same" is compared on
/// the value re-encoded with numeric descriptors.
fn check<T: Serialize + DeserializeOwned>(what: &str, v: &T) {
    let numeric = serde_amqp::to_vec(v).unwrap();
    for form in FORMS {
        let (other, used) = descriptor::rewrite(&numeric, form).unwrap();
        assert_eq!(used, numeric.len());
        assert_ne!(other, numeric, "{what}: nothing was rewritten");
        let decoded: T = codec::decode("test", &other)
            .unwrap_or_else(|e| panic!("{what} in form {form:?} refused: {e}"));
        let again = serde_amqp::to_vec(&decoded).unwrap();
        let (again, _) = descriptor::rewrite(&again, Form::Numeric).unwrap();
        assert_eq!(
            again, numeric,
            "{what} in form {form:?} decoded differently"
        );
        assert_eq!(
            descriptor::descriptor_code(&other),
            descriptor::descriptor_code(&numeric),
            "{what} in form {form:?}"
        );
    }
}

fn error() -> WireError {
    WireError {
        condition: ErrorCondition::AmqpError(WireCondition::NotFound),
        description: Some("gone".into()),
        info: None,
    }
}

fn described(descriptor: Descriptor, value: Value) -> Value {
    Value::Described(Box::new(Described { descriptor, value }))
}

fn source() -> Source {
    let mut filter = FilterSet::new();
    filter.insert(
        Symbol::from("no-local"),
        described(Descriptor::Code(0x0000_468C_0000_0003), Value::List(vec![])),
    );
    let mut props = Fields::new();
    props.insert(
        Symbol::from("lifetime-policy"),
        described(Descriptor::Code(0x2b), Value::List(vec![])),
    );
    Source {
        address: Some("/topic/a".into()),
        dynamic_node_properties: Some(props),
        filter: Some(filter),
        default_outcome: Some(Outcome::Released(Released {})),
        ..Source::default()
    }
}

fn annotations() -> OrderedMap<OwnedKey, Value> {
    let mut a = OrderedMap::new();
    a.insert(OwnedKey::from(Symbol::from("x-opt-k")), Value::Int(1));
    a
}

fn states() -> Vec<DeliveryState> {
    vec![
        DeliveryState::Accepted(Accepted {}),
        DeliveryState::Rejected(Rejected {
            error: Some(error()),
        }),
        DeliveryState::Released(Released {}),
        DeliveryState::Modified(Modified {
            delivery_failed: Some(true),
            undeliverable_here: None,
            message_annotations: None,
        }),
        DeliveryState::Received(Received {
            section_number: 1,
            section_offset: 2,
        }),
        DeliveryState::Declared(Declared {
            txn_id: Binary::from(vec![1, 2]),
        }),
        DeliveryState::TransactionalState(TransactionalState {
            txn_id: Binary::from(vec![1, 2]),
            outcome: Some(Outcome::Accepted(Accepted {})),
        }),
    ]
}

fn performatives() -> Vec<Performative> {
    let mut attach = super::attach("l", 0, Role::Receiver, Some("q"));
    attach.source = Some(Box::new(source()));
    let coordinator = Attach {
        target: Some(Box::new(TargetArchetype::Coordinator(Coordinator::new(
            None,
        )))),
        ..attach.clone()
    };
    attach.role = Role::Sender;
    let mut v = vec![
        Performative::Open(Open {
            container_id: "c".into(),
            hostname: None,
            max_frame_size: MaxFrameSize(512),
            channel_max: ChannelMax(1),
            idle_time_out: Some(1000),
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }),
        Performative::Begin(Begin {
            remote_channel: None,
            next_outgoing_id: 0,
            incoming_window: 10,
            outgoing_window: 10,
            handle_max: Handle(7),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }),
        Performative::Attach(attach),
        Performative::Attach(coordinator),
        Performative::Flow(Flow {
            next_incoming_id: Some(0),
            incoming_window: 10,
            next_outgoing_id: 0,
            outgoing_window: 10,
            handle: Some(Handle(0)),
            delivery_count: Some(0),
            link_credit: Some(5),
            available: None,
            drain: false,
            echo: false,
            properties: None,
        }),
        Performative::Detach(Detach {
            handle: Handle(0),
            closed: true,
            error: Some(error()),
        }),
        Performative::End(End {
            error: Some(error()),
        }),
        Performative::Close(Close {
            error: Some(error()),
        }),
    ];
    for state in states() {
        v.push(Performative::Transfer(Transfer {
            handle: Handle(0),
            delivery_id: Some(1),
            delivery_tag: Some(vec![1].into()),
            message_format: Some(0),
            settled: Some(false),
            more: false,
            rcv_settle_mode: None,
            state: Some(state.clone()),
            resume: false,
            aborted: false,
            batchable: false,
        }));
        v.push(Performative::Disposition(Disposition {
            role: Role::Receiver,
            first: 1,
            last: None,
            settled: true,
            state: Some(state),
            batchable: false,
        }));
    }
    v
}

#[test]
fn performatives_in_every_descriptor_form() {
    for p in performatives() {
        let what = format!("{p:?}");
        check(&what, &p);
    }
}

#[test]
fn delivery_states_and_outcomes_in_every_descriptor_form() {
    for s in states() {
        check("delivery-state", &s);
    }
    for o in [
        Outcome::Accepted(Accepted {}),
        Outcome::Rejected(Rejected {
            error: Some(error()),
        }),
        Outcome::Released(Released {}),
        Outcome::Modified(Modified {
            delivery_failed: None,
            undeliverable_here: Some(true),
            message_annotations: Some(Fields::new()),
        }),
    ] {
        check("outcome", &o);
    }
}

#[test]
fn sasl_frames_in_every_descriptor_form() {
    check(
        "sasl-mechanisms",
        &SaslMechanisms {
            sasl_server_mechanisms: Array(vec![Symbol::from("PLAIN")]),
        },
    );
    check(
        "sasl-init",
        &SaslInit {
            mechanism: Symbol::from("PLAIN"),
            initial_response: Some(Binary::from(vec![0, 1])),
            hostname: Some("h".into()),
        },
    );
    check(
        "sasl-challenge",
        &SaslChallenge {
            challenge: Binary::from(vec![1]),
        },
    );
    check(
        "sasl-response",
        &SaslResponse {
            response: Binary::from(vec![1]),
        },
    );
    check(
        "sasl-outcome",
        &SaslOutcome {
            code: SaslCode::Ok,
            additional_data: Some(Binary::from(vec![2])),
        },
    );
}

#[test]
fn message_sections_in_every_descriptor_form() {
    check(
        "header",
        &Header {
            durable: true,
            ..Header::default()
        },
    );
    check("delivery-annotations", &DeliveryAnnotations(annotations()));
    check("message-annotations", &MessageAnnotations(annotations()));
    check(
        "properties",
        &Properties {
            to: Some("q".into()),
            ..Properties::default()
        },
    );
    let mut ap = OrderedMap::new();
    ap.insert("k".to_string(), SimpleValue::Int(1));
    check("application-properties", &ApplicationProperties(ap));
    check("data", &Data(Binary::from(vec![1, 2])));
    check("amqp-sequence", &AmqpSequence(vec![Value::Int(1)]));
    check("amqp-value", &AmqpValue(Value::String("x".into())));
    check("footer", &Footer(annotations()));
}

#[test]
fn terminus_error_and_transaction_types_in_every_descriptor_form() {
    check("source", &source());
    check(
        "target",
        &Target {
            address: Some("q".into()),
            ..Target::default()
        },
    );
    check(
        "coordinator",
        &TargetArchetype::Coordinator(Coordinator::new(None)),
    );
    check("error", &error());
    check("declare", &Declare { global_id: None });
    check(
        "discharge",
        &Discharge {
            txn_id: Binary::from(vec![1]),
            fail: Some(true),
        },
    );
    check(
        "delete-on-close",
        &LifetimePolicy::DeleteOnClose(DeleteOnClose {}),
    );
}

/// What the broker takes from a message is the same whatever form its
/// sections' descriptors are in (section dispatch reads both).
#[test]
fn message_decode_reads_sections_in_every_descriptor_form() {
    let mut numeric = Vec::new();
    codec::encode_into(
        &mut numeric,
        &Header {
            durable: true,
            ..Header::default()
        },
    )
    .unwrap();
    codec::encode_into(&mut numeric, &DeliveryAnnotations(annotations())).unwrap();
    codec::encode_into(&mut numeric, &MessageAnnotations(annotations())).unwrap();
    codec::encode_into(
        &mut numeric,
        &Properties {
            to: Some("/queue/q".into()),
            subject: Some("s".into()),
            ..Properties::default()
        },
    )
    .unwrap();
    let mut ap = OrderedMap::new();
    ap.insert("k".to_string(), SimpleValue::Int(1));
    codec::encode_into(&mut numeric, &ApplicationProperties(ap)).unwrap();
    codec::encode_into(&mut numeric, &AmqpValue("text".to_string())).unwrap();
    codec::encode_into(&mut numeric, &Footer(annotations())).unwrap();
    let want = crate::message::decode(&Bytes::from(numeric.clone()), 0).unwrap();
    for form in FORMS {
        let mut other = Vec::new();
        let mut rest = &numeric[..];
        while !rest.is_empty() {
            let (section, used) = descriptor::rewrite(rest, form).unwrap();
            other.extend_from_slice(&section);
            rest = &rest[used..];
        }
        let got = crate::message::decode(&Bytes::from(other), 0)
            .unwrap_or_else(|e| panic!("form {form:?}: {e}"));
        assert_eq!(got.to, want.to);
        let (g, w) = (&got.message, &want.message);
        assert_eq!(
            (g.durable, &g.subject, &g.properties),
            (w.durable, &w.subject, &w.properties)
        );
        assert_eq!(
            (g.body.kind, &g.body.bytes[..]),
            (w.body.kind, &b"text"[..])
        );
        assert!(g.amqp_annotations.is_some(), "form {form:?}");
    }
}

// ------------------------------------------- whole connections, symbolic

/// A message with every section the spec defines.
fn every_section_payload() -> Vec<u8> {
    fn enc<T: Serialize>(out: &mut Vec<u8>, v: &T) {
        codec::encode_into(out, v).unwrap();
    }
    let mut p = Vec::new();
    enc(
        &mut p,
        &Header {
            durable: true,
            priority: fe2o3_amqp_types::messaging::Priority(7),
            ..Header::default()
        },
    );
    enc(&mut p, &DeliveryAnnotations(annotations()));
    enc(&mut p, &MessageAnnotations(annotations()));
    enc(
        &mut p,
        &Properties {
            subject: Some("subj".into()),
            content_type: Some(Symbol::from("text/plain")),
            ..Properties::default()
        },
    );
    let mut ap = OrderedMap::new();
    ap.insert("k".to_string(), SimpleValue::Int(1));
    enc(&mut p, &ApplicationProperties(ap));
    enc(&mut p, &Data(Binary::from(b"body".to_vec())));
    enc(&mut p, &Footer(annotations()));
    p
}

#[test]
fn publish_with_every_section() {
    let mut p = Peer::opened(|_| {});
    attach_sender(&mut p, Some("/queue/q"));
    p.send(0, &transfer(0, 0, true), &every_section_payload());
    let mut seq = Vec::new();
    codec::encode_into(&mut seq, &AmqpSequence(vec![Value::Int(1)])).unwrap();
    codec::encode_into(&mut seq, &AmqpSequence(vec![Value::Int(2)])).unwrap();
    p.send(0, &transfer(0, 1, true), &seq);
    let mut value = Vec::new();
    codec::encode_into(&mut value, &AmqpValue("text".to_string())).unwrap();
    p.send(0, &transfer(0, 2, true), &value);
    assert!(p.perfs().is_empty(), "no error");
    let log = p.log();
    let [(a0, m0, _), (_, m1, _), (_, m2, _)] = &log.published[..] else {
        panic!("{:?}", log.published.len())
    };
    assert_eq!(*a0, Address::Queue("q".into()));
    assert!(m0.durable);
    assert_eq!(m0.priority, 7);
    assert_eq!(m0.subject.as_deref(), Some("subj"));
    assert_eq!(m0.content_type.as_deref(), Some("text/plain"));
    assert_eq!(
        m0.properties.get("k"),
        Some(&rosetta_neutral::Value::Int(1))
    );
    assert!(m0.amqp_annotations.is_some());
    assert_eq!(m0.body, Body::binary(Bytes::from_static(b"body")));
    assert_eq!(m1.body.kind, BodyKind::AmqpSequence);
    assert_eq!(m2.body, Body::text("text"));
}

#[test]
fn end_and_close_are_answered() {
    let mut p = Peer::opened(|_| {});
    p.send(0, &End { error: None }, &[]);
    assert!(matches!(p.perfs()[..], [Performative::End(_)]));
    p.send(
        0,
        &Close {
            error: Some(error()),
        },
        &[],
    );
    assert!(matches!(p.perfs()[..], [Performative::Close(_)]));
    assert!(p.conn.is_closed());
}

/// A topic receiver whose source carries the JMS no-local filter (by
/// code, then by name) and `rosetta:retained`, and a dynamic receiver
/// asking for a delete-on-close node, as python-qpid-proton's
/// `DynamicNodeProperties` does.
#[test]
fn source_filters_and_lifetime_policy() {
    let mut p = Peer::opened(|_| {});
    let no_local = [
        Descriptor::Code(0x0000_468C_0000_0003),
        Descriptor::Name(Symbol::from("apache.org:no-local-filter:list")),
    ];
    for (h, d) in (0u32..).zip(no_local) {
        let mut filter = FilterSet::new();
        filter.insert(Symbol::from("no-local"), described(d, Value::List(vec![])));
        filter.insert(
            Symbol::from("rosetta:retained"),
            described(
                Descriptor::Name(Symbol::from("rosetta:retained")),
                Value::Bool(true),
            ),
        );
        let mut a = attach(&format!("sub{h}"), h, Role::Receiver, Some("/topic/t"));
        if let Some(src) = a.source.as_mut() {
            src.filter = Some(filter);
        }
        let reply = attach_receiver(&mut p, h, a);
        let echoed = reply.source.and_then(|s| s.filter).expect("filters echoed");
        assert_eq!(echoed.len(), 2, "{echoed:?}");
    }
    let mut props = Fields::new();
    props.insert(
        Symbol::from("lifetime-policy"),
        described(Descriptor::Code(0x2b), Value::List(vec![])),
    );
    let mut a = attach("tmp", 2, Role::Receiver, None);
    if let Some(src) = a.source.as_mut() {
        src.dynamic = true;
        src.dynamic_node_properties = Some(props);
    }
    let reply = attach_receiver(&mut p, 2, a);
    let address = reply
        .source
        .and_then(|s| s.address)
        .expect("a dynamic address");
    assert!(address.starts_with("/queue/$temp/"), "{address}");
}

/// Each scenario again, with every frame its client sends written with
/// symbolic descriptors.
macro_rules! symbolic_twins {
    ($($scenario:ident),* $(,)?) => {
        mod symbolic {
            $(
                #[test]
                fn $scenario() {
                    super::super::with_symbolic_descriptors(super::$scenario);
                }
            )*
        }
    };
}

use super::{
    anonymous_relay_routes_by_to, flow_txn_id_acquires_and_rollback_returns_the_messages,
    jms_subscription_links_map_to_queues, queue_receiver_credit_delivery_and_accept,
    receiver_outcomes_map_to_the_core, receiver_settle_mode_second_for_a_client_sender,
    sasl_plain_ok_then_open, sasl_scram_sha_256_full_exchange,
    topic_subscriptions_plain_durable_and_dynamic, transaction_declare_transfer_discharge,
    transactional_acquisition_and_rollback, unsettled_receiver_outcome_is_settled_by_the_broker,
    unsettled_send_is_accepted_only_after_commit,
};

symbolic_twins!(
    sasl_plain_ok_then_open,
    sasl_scram_sha_256_full_exchange,
    queue_receiver_credit_delivery_and_accept,
    receiver_outcomes_map_to_the_core,
    anonymous_relay_routes_by_to,
    topic_subscriptions_plain_durable_and_dynamic,
    unsettled_send_is_accepted_only_after_commit,
    transaction_declare_transfer_discharge,
    transactional_acquisition_and_rollback,
    flow_txn_id_acquires_and_rollback_returns_the_messages,
    receiver_settle_mode_second_for_a_client_sender,
    unsettled_receiver_outcome_is_settled_by_the_broker,
    jms_subscription_links_map_to_queues,
    publish_with_every_section,
    end_and_close_are_answered,
    source_filters_and_lifetime_policy,
);
