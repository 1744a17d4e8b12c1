//! Bindings with excluded topics (a subscriber's deny rules that overlap
//! its filter): the binding is made and never receives those topics,
//! neither as they are published nor as retained messages at bind, and it
//! keeps them across a restart from the journal, where no access rule is
//! asked again.

use super::*;
use crate::{AccessControl, AuthError, Principal, ScramCredentials};

/// Everything allowed, and every subscription excludes `denied`.
struct DenyOne(&'static str);

impl AccessControl for DenyOne {
    fn authenticate(&self, user: Option<&str>, _: Option<&[u8]>) -> Result<Principal, AuthError> {
        Ok(Principal {
            user: user.map(Box::from),
        })
    }
    fn scram_credentials(&self, _: &str) -> Option<ScramCredentials> {
        None
    }
    fn anonymous_allowed(&self) -> bool {
        true
    }
    fn authenticate_certificate(&self, subject: &str) -> Result<Principal, AuthError> {
        self.authenticate(Some(subject), None)
    }
    fn may_publish(&self, _: &Principal, _: &Address) -> bool {
        true
    }
    fn may_subscribe(&self, _: &Principal, _: &Address) -> bool {
        true
    }
    fn excluded_topics(&self, _: &Principal, filter: &str) -> Vec<String> {
        // Only where the filter reaches the denied topic, as the users
        // file's rules answer.
        if rosetta_neutral::address::topic_matches(filter, self.0) {
            vec![self.0.to_owned()]
        } else {
            Vec::new()
        }
    }
}

fn core_denying(denied: &'static str) -> Core {
    Core::new(
        CoreConfig::default(),
        Arc::new(NoJournal),
        Arc::new(DenyOne(denied)),
        None,
    )
}

fn texts(e: &Events) -> Vec<String> {
    e.deliveries().iter().map(text).collect()
}

#[test]
fn a_wildcard_binding_skips_its_excluded_topics_and_only_those() {
    let core = core_denying("test/nosubscribe");
    let (mut s, e) = open(&core, "s");
    let (mut other, eo) = open(&core, "other");
    let (mut p, _) = open(&core, "p");
    subscribe(&mut s, "test/#", 10);
    // Another subscriber's binding that does not reach the topic has no
    // exclusion to keep.
    subscribe(&mut other, "x/#", 10);
    assert_eq!(
        publish(&mut p, topic("test/nosubscribe"), "denied").routed,
        0
    );
    assert_eq!(publish(&mut p, topic("test/other"), "a").routed, 1);
    // The exclusion is the denied topic, not what lies below it.
    assert_eq!(
        publish(&mut p, topic("test/nosubscribe/deeper"), "b").routed,
        1
    );
    assert_eq!(publish(&mut p, topic("x/y"), "c").routed, 1);
    assert_eq!(texts(&e), ["a", "b"]);
    assert_eq!(texts(&eo), ["c"]);
}

#[test]
fn retained_messages_of_excluded_topics_are_not_sent_at_bind() {
    let core = core_denying("test/nosubscribe");
    let (mut p, _) = open(&core, "p");
    for (t, body) in [("test/nosubscribe", "denied"), ("test/a", "a")] {
        let mut m = Message::text(body);
        m.retain = true;
        p.publish(&topic(t), m, PublishOptions::default())
            .expect("publish");
    }
    let (mut s, e) = open(&core, "s");
    let q = retained_consumer(&mut s);
    let opts = BindingOptions {
        retained: RetainedOnBind::Send,
        ..BindingOptions::default()
    };
    let bound = s.bind(&q, "#", opts).expect("bind");
    assert_eq!(bound.retained_sent, 1);
    assert_eq!(texts(&e), ["a"]);
}

#[test]
fn a_recovered_binding_keeps_its_exclusions_without_asking_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(crate::ManualClock::new(T0_MS));
    {
        let denying = Arc::new(DenyOne("test/nosubscribe"));
        let (core, store) = core_on_store_with(dir.path(), CoreConfig::default(), &clock, denying);
        let (mut s, _) = open(&core, "s");
        s.declare_queue(QueueSpec {
            name: Some("session-q".into()),
            durable: true,
            lifetime: QueueLifetime::Permanent,
            bindings_max: None,
        })
        .expect("declare");
        s.bind("session-q", "test/#", BindingOptions::default())
            .expect("bind");
        store.flush().expect("flush");
    }
    // Started again with rules that exclude nothing: what the binding was
    // made under comes from the journal.
    let (core, _store) = core_on_store(dir.path(), CoreConfig::default(), &clock);
    let (mut p, _) = open(&core, "p");
    assert_eq!(
        publish(&mut p, topic("test/nosubscribe"), "denied").routed,
        0
    );
    assert_eq!(publish(&mut p, topic("test/other"), "a").routed, 1);
}
