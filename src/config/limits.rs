//! Message size limits: one payload limit (`broker.payload_size_max_bytes`)
//! from which every protocol's and transport's wire limit is derived, so a
//! payload that one client can send, every other can send and receive.
//! Each wire limit can still be set on its own (`mqtt.packet_size_max_bytes`,
//! `stomp.frame_size_max_bytes`, `amqp.message_size_max_bytes`,
//! `websocket.message_size_max_bytes`), and then wins: a deployment may
//! well want smaller MQTT packets than AMQP messages. The broker warns at
//! start about each one that cannot carry the payload limit.

use super::{
    Config, HEADERS_ALLOWANCE_BYTES, MQTT_PACKET_SIZE_PROTOCOL_MAX_BYTES,
    WEBSOCKET_BATCH_HEADROOM_BYTES,
};

/// Bytes of a STOMP frame besides its headers and body: the command line,
/// the blank line and the NUL, with room to spare.
const STOMP_FRAMING_BYTES: u32 = 64;

impl Config {
    /// Largest payload accepted, in bytes.
    pub fn payload_size_max(&self) -> u32 {
        self.broker.payload_size_max_bytes
    }

    /// MQTT Maximum Packet Size, in bytes.
    pub fn mqtt_packet_size_max(&self) -> u32 {
        self.mqtt.packet_size_max_bytes.unwrap_or_else(|| {
            self.payload_size_max()
                .saturating_add(HEADERS_ALLOWANCE_BYTES)
                .min(MQTT_PACKET_SIZE_PROTOCOL_MAX_BYTES)
        })
    }

    /// Largest STOMP frame, in bytes.
    pub fn stomp_frame_size_max(&self) -> u32 {
        self.stomp.frame_size_max_bytes.unwrap_or_else(|| {
            let headers = self
                .stomp
                .header_count_max
                .saturating_mul(self.stomp.header_size_max_bytes);
            self.payload_size_max()
                .saturating_add(headers)
                .saturating_add(STOMP_FRAMING_BYTES)
        })
    }

    /// Largest STOMP body, in bytes: the payload limit, within the frame.
    pub fn stomp_body_size_max(&self) -> u32 {
        self.payload_size_max().min(self.stomp_frame_size_max())
    }

    /// Largest AMQP message (all sections), in bytes.
    pub fn amqp_message_size_max(&self) -> u32 {
        self.amqp.message_size_max_bytes.unwrap_or_else(|| {
            self.payload_size_max()
                .saturating_add(HEADERS_ALLOWANCE_BYTES)
        })
    }

    /// Largest WebSocket message, in bytes: one maximal frame of any
    /// protocol, plus headroom for packets batched with it.
    pub fn websocket_message_size_max(&self) -> usize {
        self.websocket.message_size_max_bytes.unwrap_or_else(|| {
            let largest_frame = self
                .mqtt_packet_size_max()
                .max(self.stomp_frame_size_max())
                .max(self.amqp.frame_size_max_bytes);
            largest_frame as usize + WEBSOCKET_BATCH_HEADROOM_BYTES
        })
    }

    /// The wire limits set so low that they cannot carry a payload at the
    /// payload limit: key, value, and what the payload limit needs.
    pub fn limits_below_payload(&self) -> Vec<(&'static str, u64, u64)> {
        let payload = u64::from(self.payload_size_max());
        let mqtt_need = (payload + 5 + 2).min(u64::from(MQTT_PACKET_SIZE_PROTOCOL_MAX_BYTES));
        let stomp_need = payload + u64::from(STOMP_FRAMING_BYTES);
        // Smallest AMQP message with this body: a data section's header.
        let amqp_need = payload + 8;
        let ws_need = [
            u64::from(self.mqtt_packet_size_max()),
            u64::from(self.stomp_frame_size_max()),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
        .min(payload + u64::from(STOMP_FRAMING_BYTES));
        let mut low = Vec::new();
        let mut check = |key, set: Option<u64>, need: u64| {
            if let Some(value) = set.filter(|v| *v < need) {
                low.push((key, value, need));
            }
        };
        check(
            "mqtt.packet_size_max_bytes",
            self.mqtt.packet_size_max_bytes.map(u64::from),
            mqtt_need,
        );
        check(
            "stomp.frame_size_max_bytes",
            self.stomp.frame_size_max_bytes.map(u64::from),
            stomp_need,
        );
        check(
            "amqp.message_size_max_bytes",
            self.amqp.message_size_max_bytes.map(u64::from),
            amqp_need,
        );
        check(
            "websocket.message_size_max_bytes",
            self.websocket.message_size_max_bytes.map(|v| v as u64),
            ws_need,
        );
        low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_carry_a_16_mib_payload_on_every_protocol_and_transport() {
        let c = Config::default();
        let payload = 16 * 1024 * 1024;
        assert_eq!(c.payload_size_max(), payload);
        assert!(c.mqtt_packet_size_max() > payload + 65_535 + 7);
        assert!(c.stomp_frame_size_max() > payload + 128 * 8192);
        assert_eq!(c.stomp_body_size_max(), payload);
        assert!(c.amqp_message_size_max() > payload);
        assert!(c.websocket_message_size_max() > c.mqtt_packet_size_max() as usize);
        assert!(c.websocket_message_size_max() > c.stomp_frame_size_max() as usize);
        assert!(c.limits_below_payload().is_empty());
    }

    #[test]
    fn a_256_mib_payload_is_as_far_as_mqtt_goes() {
        let mut c = Config::default();
        c.broker.payload_size_max_bytes = 256 * 1024 * 1024;
        assert_eq!(
            c.mqtt_packet_size_max(),
            MQTT_PACKET_SIZE_PROTOCOL_MAX_BYTES
        );
        assert!(c.stomp_frame_size_max() > 256 * 1024 * 1024);
    }

    #[test]
    fn an_explicit_wire_limit_wins_and_is_checked_against_the_payload() {
        let mut c = Config::default();
        c.mqtt.packet_size_max_bytes = Some(2048);
        assert_eq!(c.mqtt_packet_size_max(), 2048);
        let low = c.limits_below_payload();
        assert_eq!(low.len(), 1);
        assert_eq!(low[0].0, "mqtt.packet_size_max_bytes");
        c.broker.payload_size_max_bytes = 1024;
        assert!(c.limits_below_payload().is_empty());
    }
}
