//! Wiring of the protocol adapters to transports: which state machine a
//! listener runs, built from which configuration section.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use rosetta_neutral::{Broker, SessionEvent};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::config::ListenerKind;

use super::driver::{self, ProtocolConnection};
use super::Shared;

/// The wire protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    Mqtt,
    Stomp,
    Amqp,
}

impl Wire {
    fn name(self) -> &'static str {
        match self {
            Wire::Mqtt => "mqtt",
            Wire::Stomp => "stomp",
            Wire::Amqp => "amqp",
        }
    }
}

macro_rules! forward_protocol_connection {
    ($ty:ty) => {
        impl ProtocolConnection for $ty {
            fn handle_input(&mut self, now: Instant, data: &[u8]) {
                <$ty>::handle_input(self, now, data)
            }
            fn handle_event(&mut self, now: Instant, event: SessionEvent) {
                <$ty>::handle_event(self, now, event)
            }
            fn handle_timeout(&mut self, now: Instant) {
                <$ty>::handle_timeout(self, now)
            }
            fn poll_timeout(&self) -> Option<Instant> {
                <$ty>::poll_timeout(self)
            }
            fn poll_transmit(&mut self, out: &mut Vec<u8>) {
                <$ty>::poll_transmit(self, out)
            }
            fn wants_input(&self) -> bool {
                <$ty>::wants_input(self)
            }
            fn is_closed(&self) -> bool {
                <$ty>::is_closed(self)
            }
            fn handle_transport_closed(&mut self, now: Instant) {
                <$ty>::handle_transport_closed(self, now)
            }
        }
    };
}

forward_protocol_connection!(rosetta_stomp::StompConnection);

/// Serves one accepted TCP connection on a listener of `kind`.
pub(crate) async fn serve(
    kind: ListenerKind,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    conn_id: u64,
    shared: Arc<Shared>,
) {
    let wire = match kind {
        ListenerKind::Mqtt | ListenerKind::Mqtts => Wire::Mqtt,
        ListenerKind::Stomp | ListenerKind::Stomps => Wire::Stomp,
        ListenerKind::Amqp | ListenerKind::Amqps => Wire::Amqp,
        ListenerKind::WebSocket | ListenerKind::Wss | ListenerKind::Any => {
            tracing::warn!(listener = kind.key(), %peer, "listener kind not served yet; closing");
            return;
        }
    };
    run_wire(wire, stream, peer, conn_id, shared).await;
}

/// Runs the state machine of `wire` over any byte transport.
pub(crate) async fn run_wire<T>(
    wire: Wire,
    io: T,
    peer: SocketAddr,
    conn_id: u64,
    shared: Arc<Shared>,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    let span = tracing::info_span!("conn", id = conn_id, proto = wire.name(), %peer);
    let (sink, events) = driver::event_channel();
    let broker: Arc<dyn Broker> = Arc::new(shared.core.clone());
    let now = Instant::now();
    match wire {
        Wire::Stomp => {
            let config = stomp_config(&shared.config);
            let conn = rosetta_stomp::StompConnection::new(config, broker, sink, conn_id, now);
            driver::drive(conn, io, events, span).await;
        }
        Wire::Mqtt | Wire::Amqp => {
            tracing::warn!(parent: &span, "protocol not wired yet; closing");
        }
    }
}

fn stomp_config(_config: &crate::config::Config) -> rosetta_stomp::StompConfig {
    rosetta_stomp::StompConfig::default()
}
