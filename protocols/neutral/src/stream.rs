//! Streams as adapters name them: where a reader starts, its group, and
//! the position a delivery carries.
//!
//! A stream is a queue whose messages are kept in a log and read without
//! being consumed (see `docs/streams.md`). A consumer asks for one by
//! giving [`ConsumerOptions::stream`](crate::ConsumerOptions::stream); the
//! core declares the stream at first use, as RabbitMQ does for a consumer
//! that asks for queue type `stream`.

/// The name of the partition of a partitioned stream's delivery, in every
/// protocol (STOMP header, AMQP message annotation, MQTT 5 user property).
pub const STREAM_PARTITION: &str = "x-stream-partition";

/// The name of a stream delivery's timestamp (when it was appended, ms
/// since the Unix epoch), in every protocol: STOMP header and MQTT 5 user
/// property in decimal, AMQP message annotation as an AMQP timestamp.
pub const STREAM_TIMESTAMP: &str = "x-stream-timestamp";

/// Where a stream reader starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOffset {
    /// The oldest record still kept.
    First,
    /// The newest record (the last one written), then everything after it.
    Last,
    /// Only what is written from now on (the default).
    Next,
    /// This offset (the first one kept when it is older; an offset past
    /// the end is refused).
    Offset(u64),
    /// The first record written at or after this time, in milliseconds
    /// since the Unix epoch.
    TimestampMs(u64),
}

/// Longest offset spec text accepted (`timestamp=` and 20 digits fit).
pub const STREAM_OFFSET_SPEC_BYTES_MAX: usize = 64;
/// Longest consumer group name accepted, in bytes: an AMQP container id
/// and link name together fit.
pub const STREAM_GROUP_BYTES_MAX: usize = 512;

/// Why an offset spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid stream offset spec '{0}': expected first, last, next, offset=N or timestamp=T (POSIX seconds)")]
pub struct StreamOffsetError(pub String);

impl StreamOffset {
    /// Parses the text spelling STOMP's `x-stream-offset` header and
    /// MQTT's user property and topic suffix share: `first`, `last`,
    /// `next`, `offset=N`, `timestamp=T` with T in POSIX seconds (as
    /// RabbitMQ reads the STOMP header). A bare number is taken as an
    /// offset, as RabbitMQ's STOMP plugin does.
    pub fn parse(text: &str) -> Result<StreamOffset, StreamOffsetError> {
        let bad = || StreamOffsetError(text.chars().take(STREAM_OFFSET_SPEC_BYTES_MAX).collect());
        if text.len() > STREAM_OFFSET_SPEC_BYTES_MAX {
            return Err(bad());
        }
        let number = |s: &str| -> Result<u64, StreamOffsetError> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        match text {
            "first" => Ok(StreamOffset::First),
            "last" => Ok(StreamOffset::Last),
            "next" => Ok(StreamOffset::Next),
            _ => {
                if let Some(n) = text.strip_prefix("offset=") {
                    Ok(StreamOffset::Offset(number(n)?))
                } else if let Some(t) = text.strip_prefix("timestamp=") {
                    let s = number(t)?;
                    Ok(StreamOffset::TimestampMs(
                        s.checked_mul(1000).ok_or_else(bad)?,
                    ))
                } else {
                    Ok(StreamOffset::Offset(number(text)?))
                }
            }
        }
    }
}

/// A consumer's request to read a stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamRead {
    /// Where to start; `None`: the group's committed offset if it has one,
    /// else `next`.
    pub offset: Option<StreamOffset>,
    /// A consumer group: acknowledgements commit its offset durably, and a
    /// reader of the same group resumes from it.
    pub group: Option<String>,
    /// The client asked for a stream (STOMP `x-queue-type:stream` or an
    /// offset header, an AMQP offset filter, MQTT `$stream/`): the core
    /// declares it at first use and refuses a plain queue of that name.
    /// When `false` (an AMQP link that names a group by its link name
    /// only), the read applies if the queue is a stream and is ignored if
    /// it is a plain queue.
    pub declare: bool,
}

/// Where a delivered stream message is in its stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamPosition {
    /// The message's offset.
    pub offset: u64,
    /// When it was appended (ms since the Unix epoch).
    pub timestamp_ms: u64,
    /// Records this reader was owed before this one that retention
    /// deleted first (0 almost always): a reader cut by retention skips to
    /// the first kept offset and learns here how many it missed.
    pub missed: u64,
    /// Its partition, for a partitioned stream's reader (STOMP header, AMQP
    /// annotation, MQTT 5 user property `x-stream-partition`); its offset
    /// is the offset in that partition.
    pub partition: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spellings_parse_and_anything_else_is_refused() {
        assert_eq!(StreamOffset::parse("first"), Ok(StreamOffset::First));
        assert_eq!(StreamOffset::parse("last"), Ok(StreamOffset::Last));
        assert_eq!(StreamOffset::parse("next"), Ok(StreamOffset::Next));
        assert_eq!(
            StreamOffset::parse("offset=42"),
            Ok(StreamOffset::Offset(42))
        );
        assert_eq!(StreamOffset::parse("7"), Ok(StreamOffset::Offset(7)));
        assert_eq!(
            StreamOffset::parse("timestamp=1700000000"),
            Ok(StreamOffset::TimestampMs(1_700_000_000_000))
        );
        for bad in [
            "",
            "First",
            "offset=",
            "offset=-1",
            "offset=1x",
            "timestamp=abc",
            "timestamp=99999999999999999999",
            "offset=+3",
            &"9".repeat(100),
        ] {
            assert!(StreamOffset::parse(bad).is_err(), "{bad}");
        }
    }
}
