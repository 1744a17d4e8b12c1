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
forward_protocol_connection!(rosetta_mqtt::MqttConnection);
forward_protocol_connection!(rosetta_amqp::AmqpConnection);

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
            let conn = rosetta_stomp::StompConnection::new(
                stomp_config(&shared.config),
                broker,
                sink,
                conn_id,
                now,
            );
            driver::drive(conn, io, events, span, shared.hard_stop.clone()).await;
        }
        Wire::Mqtt => {
            let conn = rosetta_mqtt::MqttConnection::new(
                mqtt_config(&shared.config),
                broker,
                sink,
                conn_id,
                now,
            );
            driver::drive(conn, io, events, span, shared.hard_stop.clone()).await;
        }
        Wire::Amqp => {
            let conn = rosetta_amqp::AmqpConnection::new(
                amqp_config(&shared.config),
                broker,
                sink,
                conn_id,
                now,
            );
            driver::drive(conn, io, events, span, shared.hard_stop.clone()).await;
        }
    }
}

/// The `[stomp]` section applied over the adapter's defaults.
fn stomp_config(config: &crate::config::Config) -> rosetta_stomp::StompConfig {
    let c = &config.stomp;
    let mut s = rosetta_stomp::StompConfig::default();
    s.frame_size_max_bytes = c.frame_size_max_bytes as usize;
    s.headers_max = c.header_count_max as usize;
    s.header_line_max_bytes = c.header_size_max_bytes as usize;
    s.heart_beat_send_min_ms = u64::from(c.heartbeat_send_ms);
    s.heart_beat_receive_min_ms = u64::from(c.heartbeat_receive_ms);
    s.prefetch_default = c.prefetch_default;
    s.prefetch_max = c.prefetch_max;
    s.subscriptions_max = c.subscriptions_max as usize;
    s.transactions_max = c.transactions_max as usize;
    s
}

/// The `[mqtt]` section applied over the adapter's defaults.
fn mqtt_config(config: &crate::config::Config) -> rosetta_mqtt::MqttConfig {
    let c = &config.mqtt;
    let mut m = rosetta_mqtt::MqttConfig::default();
    m.keep_alive_max_s = c.keep_alive_max_s;
    m.receive_maximum = c.receive_maximum;
    m.packet_size_max_bytes = c.packet_size_max_bytes;
    m.qos_max = c.qos_max;
    m.retain_available = c.retain_available;
    m.wildcard_subscriptions_available = c.wildcard_available;
    m.shared_subscriptions_available = c.shared_available;
    m.topic_alias_max = c.topic_alias_max;
    m.session_expiry_max_s = c.session_expiry_max_s;
    m
}

/// The `[amqp]` section applied over the adapter's defaults.
fn amqp_config(config: &crate::config::Config) -> rosetta_amqp::AmqpConfig {
    let c = &config.amqp;
    let mut a = rosetta_amqp::AmqpConfig::default();
    a.frame_size_max_bytes = c.frame_size_max_bytes;
    a.message_size_max_bytes = u64::from(c.message_size_max_bytes);
    a.channel_max = c.channel_max;
    a.links_per_session_max = c.handle_max;
    a.idle_timeout_ms = c.idle_timeout_ms;
    a.sender_credit_window = c.link_credit_window;
    a
}
