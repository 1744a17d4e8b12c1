//! Arbitrary bytes into a connection's state machine, behind a minimal core
//! that accepts everything: it must never panic, and once closed it must
//! stay closed and write nothing more.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rosetta_neutral::*;
use rosetta_stomp::{StompConfig, StompConnection};

struct Core;
struct Sess(u64);
struct Sink;

impl EventSink for Sink {
    fn send(&self, _event: SessionEvent) {}
}

impl Broker for Core {
    fn authenticate(&self, user: Option<&str>, _p: Option<&[u8]>) -> Result<Principal, AuthError> {
        Ok(Principal {
            user: user.map(str::to_owned),
        })
    }
    fn scram_credentials(&self, _user: &str) -> Option<ScramCredentials> {
        None
    }
    fn anonymous_allowed(&self) -> bool {
        true
    }
    fn authenticate_certificate(&self, _s: &str) -> Result<Principal, AuthError> {
        Err(AuthError::BadCredentials)
    }
    fn open_session(&self, _info: SessionInfo, _sink: Arc<dyn EventSink>) -> Box<dyn Session> {
        Box::new(Sess(0))
    }
}

impl Sess {
    fn next(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

impl Session for Sess {
    fn declare_queue(&mut self, spec: QueueSpec) -> Result<QueueInfo, BrokerError> {
        let n = self.next();
        Ok(QueueInfo {
            name: spec.name.unwrap_or_else(|| format!("$temp/{n}")),
            existed: false,
            depth: 0,
        })
    }
    fn delete_queue(&mut self, _name: &str) -> Result<(), BrokerError> {
        Ok(())
    }
    fn bind(&mut self, _q: &str, _f: &str, _o: BindingOptions) -> Result<BindInfo, BrokerError> {
        Ok(BindInfo {
            existed: false,
            retained_sent: 0,
        })
    }
    fn unbind(&mut self, _q: &str, _f: &str) -> Result<bool, BrokerError> {
        Ok(true)
    }
    fn publish(
        &mut self,
        _a: &Address,
        _m: Message,
        o: PublishOptions,
    ) -> Result<PublishReceipt, BrokerError> {
        let n = self.next();
        Ok(PublishReceipt {
            routed: 1,
            pending: o.confirm.then_some(Ticket(n)),
        })
    }
    fn consume(&mut self, _spec: ConsumerSpec) -> Result<ConsumerId, BrokerError> {
        Ok(ConsumerId(self.next()))
    }
    fn cancel(&mut self, _c: ConsumerId) -> Result<(), BrokerError> {
        Ok(())
    }
    fn set_credit(&mut self, _c: ConsumerId, _n: u32, _d: bool) -> Result<(), BrokerError> {
        Ok(())
    }
    fn settle(
        &mut self,
        _c: ConsumerId,
        _t: DeliveryTag,
        _o: Outcome,
        _x: Option<TxnId>,
        confirm: bool,
    ) -> Result<Option<Ticket>, BrokerError> {
        let n = self.next();
        Ok(confirm.then_some(Ticket(n)))
    }
    fn annotate(&mut self, _c: ConsumerId, _t: DeliveryTag, _a: Bytes) -> Result<(), BrokerError> {
        Ok(())
    }
    fn begin(&mut self) -> TxnId {
        TxnId(self.next())
    }
    fn commit(&mut self, _t: TxnId) -> Result<Ticket, BrokerError> {
        Ok(Ticket(self.next()))
    }
    fn rollback(&mut self, _t: TxnId) -> Result<(), BrokerError> {
        Ok(())
    }
    fn get_state(&mut self, _k: &str) -> Option<Bytes> {
        None
    }
    fn put_state(&mut self, _k: &str, _v: Option<Bytes>) -> Result<Option<Ticket>, BrokerError> {
        Ok(None)
    }
    fn set_will(&mut self, _w: Option<Will>) -> Result<(), BrokerError> {
        Ok(())
    }
    fn producer_blocked(&self) -> bool {
        false
    }
    fn resume_deliveries(&mut self) {}

    fn close(&mut self, _k: CloseKind) {}
}

fuzz_target!(|data: &[u8]| {
    let start = Instant::now();
    let mut conn = StompConnection::new(
        StompConfig::default(),
        Arc::new(Core),
        Arc::new(Sink),
        1,
        start,
    );
    let mut out = Vec::new();
    // Start connected most of the time so the fuzzer explores frame handling.
    let prefix: &[u8] = if data.first().is_some_and(|b| b & 1 == 0) {
        b"CONNECT\naccept-version:1.2\nheart-beat:1000,1000\n\n\0"
    } else {
        b""
    };
    conn.handle_input(start, prefix);
    for (i, chunk) in data.chunks(7).enumerate() {
        let now = start + Duration::from_millis(i as u64 * 300);
        conn.handle_input(now, chunk);
        // Commit every ticket the core might have issued.
        conn.handle_event(
            now,
            SessionEvent::Committed {
                ticket: Ticket(i as u64),
                result: Ok(()),
            },
        );
        conn.handle_timeout(now);
        conn.poll_transmit(&mut out);
        if conn.is_closed() {
            conn.handle_input(now, b"SEND\ndestination:q\n\nx\0");
            let before = out.len();
            conn.poll_transmit(&mut out);
            assert_eq!(out.len(), before, "nothing written after close");
            return;
        }
    }
    conn.handle_transport_closed(start + Duration::from_secs(60));
});
