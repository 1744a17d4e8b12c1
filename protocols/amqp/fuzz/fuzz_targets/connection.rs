//! Arbitrary bytes into a whole connection (after a valid or fuzzed
//! protocol header), with a core that accepts everything: no input may
//! panic, and the output must stay framed.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rosetta_amqp::{AmqpConfig, AmqpConnection};
use rosetta_neutral::*;

struct Core;
impl Broker for Core {
    fn authenticate(&self, _: Option<&str>, _: Option<&[u8]>) -> Result<Principal, AuthError> {
        Ok(Principal::anonymous())
    }
    fn scram_credentials(&self, _: &str) -> Option<ScramCredentials> {
        None
    }
    fn anonymous_allowed(&self) -> bool {
        true
    }
    fn authenticate_certificate(&self, _: &str) -> Result<Principal, AuthError> {
        Err(AuthError::BadCredentials)
    }
    fn open_session(&self, _: SessionInfo, _: Arc<dyn EventSink>) -> Box<dyn Session> {
        Box::new(S(0))
    }
}

struct S(u64);
impl S {
    fn next(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}
impl Session for S {
    fn declare_queue(&mut self, spec: QueueSpec) -> Result<QueueInfo, BrokerError> {
        let name = spec.name.unwrap_or_else(|| format!("$temp/{}", self.next()));
        Ok(QueueInfo { name, existed: true, depth: 0 })
    }
    fn delete_queue(&mut self, _: &str) -> Result<(), BrokerError> {
        Ok(())
    }
    fn bind(&mut self, _: &str, _: &str, _: BindingOptions) -> Result<BindInfo, BrokerError> {
        Ok(BindInfo { existed: false, retained_sent: 0 })
    }
    fn unbind(&mut self, _: &str, _: &str) -> Result<bool, BrokerError> {
        Ok(false)
    }
    fn publish(&mut self, _: &Address, _: Message, o: PublishOptions) -> Result<PublishReceipt, BrokerError> {
        let pending = o.confirm.then(|| Ticket(self.next()));
        Ok(PublishReceipt { routed: 1, pending })
    }
    fn consume(&mut self, _: ConsumerSpec) -> Result<ConsumerId, BrokerError> {
        Ok(ConsumerId(self.next()))
    }
    fn cancel(&mut self, _: ConsumerId) -> Result<(), BrokerError> {
        Ok(())
    }
    fn set_credit(&mut self, _: ConsumerId, _: u32, _: bool) -> Result<(), BrokerError> {
        Ok(())
    }
    fn settle(&mut self, _: ConsumerId, _: DeliveryTag, _: Outcome, _: Option<TxnId>, _: bool) -> Result<Option<Ticket>, BrokerError> {
        Ok(None)
    }
    fn annotate(&mut self, _: ConsumerId, _: DeliveryTag, _: Bytes) -> Result<(), BrokerError> {
        Ok(())
    }
    fn begin(&mut self) -> TxnId {
        TxnId(self.next())
    }
    fn commit(&mut self, _: TxnId) -> Result<Ticket, BrokerError> {
        Ok(Ticket(self.next()))
    }
    fn rollback(&mut self, _: TxnId) -> Result<(), BrokerError> {
        Ok(())
    }
    fn get_state(&mut self, _: &str) -> Option<Bytes> {
        None
    }
    fn put_state(&mut self, _: &str, _: Option<Bytes>) -> Result<Option<Ticket>, BrokerError> {
        Ok(None)
    }
    fn set_will(&mut self, _: Option<Will>) -> Result<(), BrokerError> {
        Ok(())
    }
    fn producer_blocked(&self) -> bool {
        false
    }
    fn resume_deliveries(&mut self) {}

    fn close(&mut self, _: CloseKind) {}
}

struct Sink;
impl EventSink for Sink {
    fn send(&self, _: SessionEvent) {}
}

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let mut conn = AmqpConnection::new(AmqpConfig::default(), Arc::new(Core), Arc::new(Sink), 1, now);
    // Half the inputs start with a valid AMQP header so the fuzzer reaches
    // the performatives quickly.
    if data.first().is_some_and(|b| b & 1 == 0) {
        conn.handle_input(now, b"AMQP\x00\x01\x00\x00");
    }
    let mut out = Vec::new();
    for (i, piece) in data.chunks(64).enumerate() {
        conn.handle_input(now, piece);
        // Feed a delivery to consumer 1..3 now and then to exercise sends.
        if i % 3 == 2 {
            conn.handle_event(
                now,
                SessionEvent::Delivery(Delivery {
                    consumer: ConsumerId(i as u64 % 4),
                    tag: DeliveryTag(i as u64),
                    message: Arc::new(Message::binary(Bytes::from_static(b"fuzz"))),
                    delivery_count: 0,
                    redelivered: false,
                    from_retained: false,
                    matched: MatchInfo::default(),
                    annotation: None,
                    charge: rosetta_neutral::DeliveryCharge::none(),
                    stream: None,
                }),
            );
            conn.handle_event(now, SessionEvent::Committed { ticket: Ticket(i as u64), result: Ok(()) });
        }
        conn.poll_transmit(&mut out);
    }
    conn.handle_timeout(now + Duration::from_secs(120));
    conn.poll_transmit(&mut out);
    conn.handle_transport_closed(now);
});
