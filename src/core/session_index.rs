//! The core's indexes of live sessions: by session id (shutdown, the admin
//! API's identities) and by protocol and client id (take-over, wills).
//!
//! Each is a table of the sessions themselves, one pointer per slot, with
//! the key read from the session: a `HashMap<u64, Weak<_>>` slot is 16 B
//! and a `HashMap<(Protocol, Arc<str>), Weak<_>>` slot 32, and every
//! connection has one of each (issue 20: about 80 B of an idle connection
//! with the tables' slack; 16 B here). The tables hold strong references:
//! a session is entered when it opens and removed when it closes, which
//! [`super::session::CoreSession`]'s drop guarantees, so no entry outlives
//! its connection. Both tables shrink when a burst of connections has
//! gone, so their memory follows the live count (see [`crate::tables`]).

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;
use rosetta_neutral::id_hash::BuildIdHasher;
use rosetta_neutral::Protocol;

use crate::session::SessionShared;
use crate::tables::{remove_and_shrink, replace_or_insert};

/// Live sessions by session id. Ids come from a counter, so they are
/// hashed by multiplication (see [`rosetta_neutral::id_hash`]).
#[derive(Default)]
pub(crate) struct SessionsById {
    table: HashTable<Arc<SessionShared>>,
}

fn id_hash(id: u64) -> u64 {
    BuildIdHasher::default().hash_one(id)
}

impl SessionsById {
    /// Enters `session`, whose id must be new.
    pub(crate) fn insert(&mut self, session: Arc<SessionShared>) {
        self.table
            .insert_unique(id_hash(session.id), session, |s| id_hash(s.id));
    }

    /// Removes the session with id `id`, if present.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Arc<SessionShared>> {
        remove_and_shrink(
            &mut self.table,
            id_hash(id),
            |s| s.id == id,
            |s| id_hash(s.id),
        )
    }

    /// Every live session, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<SessionShared>> {
        self.table.iter()
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.table.capacity()
    }
}

/// Live sessions with a client id, by protocol and client id. Client ids
/// are chosen by peers, so they are hashed with a keyed hash.
#[derive(Default)]
pub(crate) struct SessionsByClient {
    table: HashTable<Arc<SessionShared>>,
    hasher: RandomState,
}

/// The protocol and client id a session is entered under ("" for none: a
/// session without a client id is never entered).
fn client_key(session: &SessionShared) -> (Protocol, &str) {
    (
        session.info.protocol,
        session.info.client_id.as_deref().unwrap_or(""),
    )
}

impl SessionsByClient {
    fn hash(&self, protocol: Protocol, client_id: &str) -> u64 {
        self.hasher.hash_one((protocol, client_id))
    }

    /// Enters `session` (which has a client id) under its protocol and
    /// client id, and returns the session it replaces there, if any.
    pub(crate) fn insert(&mut self, session: Arc<SessionShared>) -> Option<Arc<SessionShared>> {
        let (protocol, client_id) = client_key(&session);
        let hash = self.hash(protocol, client_id);
        let hasher = &self.hasher;
        replace_or_insert(
            &mut self.table,
            hash,
            Arc::clone(&session),
            |s| client_key(s) == (protocol, client_id),
            |s| hasher.hash_one(client_key(s)),
        )
    }

    /// Removes `session` from under its client id, unless another session
    /// has replaced it there.
    pub(crate) fn remove(&mut self, session: &Arc<SessionShared>) -> Option<Arc<SessionShared>> {
        let (protocol, client_id) = client_key(session);
        let hash = self.hash(protocol, client_id);
        let hasher = &self.hasher;
        remove_and_shrink(
            &mut self.table,
            hash,
            |s| Arc::ptr_eq(s, session),
            |s| hasher.hash_one(client_key(s)),
        )
    }

    /// The live session of `protocol` with `client_id`, if any.
    pub(crate) fn get(&self, protocol: Protocol, client_id: &str) -> Option<&Arc<SessionShared>> {
        self.table.find(self.hash(protocol, client_id), |s| {
            client_key(s) == (protocol, client_id)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rosetta_neutral::{EventSink, Principal, SessionEvent, SessionInfo};

    struct NoSink;
    impl EventSink for NoSink {
        fn send(&self, _event: SessionEvent) {}
    }

    fn session(id: u64, protocol: Protocol, client_id: Option<&str>) -> Arc<SessionShared> {
        Arc::new(SessionShared::new(
            id,
            SessionInfo {
                conn_id: id,
                protocol,
                principal: Principal::anonymous(),
                client_id: client_id.map(Arc::from),
                take_over: true,
            },
            Arc::new(NoSink),
        ))
    }

    #[test]
    fn sessions_are_found_by_id_until_removed() {
        let mut index = SessionsById::default();
        for id in 0..100 {
            index.insert(session(id, Protocol::Mqtt, None));
        }
        assert_eq!(index.iter().count(), 100);
        assert_eq!(index.remove(42).map(|s| s.id), Some(42));
        assert!(index.remove(42).is_none());
        let mut ids: Vec<u64> = index.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..100).filter(|&id| id != 42).collect::<Vec<_>>());
    }

    #[test]
    fn a_client_id_is_kept_apart_per_protocol_and_replaced_by_its_successor() {
        let mut index = SessionsByClient::default();
        let mqtt = session(1, Protocol::Mqtt, Some("c"));
        let stomp = session(2, Protocol::Stomp, Some("c"));
        assert!(index.insert(Arc::clone(&mqtt)).is_none());
        assert!(index.insert(Arc::clone(&stomp)).is_none());
        let successor = session(3, Protocol::Mqtt, Some("c"));
        let replaced = index.insert(Arc::clone(&successor));
        assert!(replaced.is_some_and(|s| Arc::ptr_eq(&s, &mqtt)));
        // The replaced session's close leaves its successor in place.
        assert!(index.remove(&mqtt).is_none());
        assert!(index
            .get(Protocol::Mqtt, "c")
            .is_some_and(|s| Arc::ptr_eq(s, &successor)));
        assert!(index
            .get(Protocol::Stomp, "c")
            .is_some_and(|s| Arc::ptr_eq(s, &stomp)));
        assert!(index.remove(&successor).is_some());
        assert!(index.get(Protocol::Mqtt, "c").is_none());
        assert!(index.get(Protocol::Amqp, "c").is_none());
    }

    /// After a burst of connections has gone, the table gives its memory
    /// back; and it still finds what is left.
    #[test]
    fn a_table_shrinks_when_most_sessions_have_gone() {
        let mut index = SessionsById::default();
        for id in 0..20_000 {
            index.insert(session(id, Protocol::Mqtt, None));
        }
        let peak = index.capacity();
        for id in 0..19_900 {
            assert!(index.remove(id).is_some());
        }
        assert!(
            index.capacity() * 16 < peak,
            "{} of {peak}",
            index.capacity()
        );
        assert_eq!(index.iter().count(), 100);
        assert!(index.remove(19_950).is_some());
    }
}
