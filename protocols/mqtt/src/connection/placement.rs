//! The balancer's word on a CONNECT ([`Broker::place_connection`]), asked
//! once the client is authenticated and before its session opens: a v5
//! client that belongs elsewhere gets CONNACK 0x9C (Use another server)
//! or 0x9D (Server moved) with the Server Reference (MQTT 5 §4.11); a
//! 3.1.1 client, which cannot be told, is served here. With no node
//! ready, both are refused as Server unavailable (0x88, 3.1.1 code 3).

use rosetta_neutral::{Broker, Placement, PlacementRequest, Principal, Protocol};

use super::handshake::Refusal;
use super::MqttConnection;
use crate::codec::{ConnectPacket, Version};

/// MQTT 5 reason codes of a placement.
const USE_ANOTHER_SERVER: u8 = 0x9C;
const SERVER_MOVED: u8 = 0x9D;
const SERVER_UNAVAILABLE: u8 = 0x88;

impl MqttConnection {
    /// The refusal the balancer's answer calls for, if any.
    pub(super) fn placement_refusal(
        &self,
        broker: &dyn Broker,
        c: &ConnectPacket,
        principal: &Principal,
    ) -> Option<Refusal> {
        let request = PlacementRequest {
            protocol: Protocol::Mqtt,
            // An empty id gets one assigned here, which no balancer knows.
            client_id: (!c.client_id.is_empty()).then_some(c.client_id.as_str()),
            user: principal.user.as_deref(),
        };
        match broker.place_connection(&request) {
            Placement::Local => None,
            Placement::Redirect(target) if c.version == Version::V5 => {
                let code = if target.permanent {
                    SERVER_MOVED
                } else {
                    USE_ANOTHER_SERVER
                };
                let reference = target.authority();
                Some(
                    Refusal::new(code, format!("this client belongs on {reference}"))
                        .with_server_reference(reference),
                )
            }
            Placement::Redirect(target) => {
                tracing::debug!(
                    conn_id = self.conn_id,
                    target = %target.authority(),
                    "MQTT 3.1.1 cannot be redirected; serving the client here"
                );
                None
            }
            Placement::Unavailable => Some(Refusal::new(
                SERVER_UNAVAILABLE,
                "no broker of the cluster is ready to take this client",
            )),
        }
    }
}
