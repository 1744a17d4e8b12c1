//! SUBSCRIBE headers → the neutral [`ConsumerOptions`], spelled as
//! ActiveMQ spells them (Artemis reads the same names):
//!
//! | header                    | option      | values                               |
//! |---------------------------|-------------|--------------------------------------|
//! | `selector`                | `selector`  | JMS selector text, parsed by the core |
//! | `activemq.exclusive`      | `exclusive` | `true` / `false` (any case)           |
//! | `activemq.priority`       | `priority`  | 0–[`CONSUMER_PRIORITY_MAX`]           |
//! | `browser`                 | `browse`    | `true` / `false`, queues only         |
//! | `visibility-timeout`      | `visibility_timeout_ms` | ms, 1–`VISIBILITY_TIMEOUT_MS_MAX` (Rosetta) |
//! | `x-queue-type`            | `stream`    | `stream` (RabbitMQ); `classic`/`quorum` read as a queue |
//! | `x-stream-offset`         | `stream.offset` | `first`, `last`, `next`, `offset=N`, `timestamp=T` (POSIX s), queues only |
//! | `x-stream-group`          | `stream.group`  | a consumer group name (Rosetta), queues only |
//!
//! A value outside these is an ERROR frame (`invalid header`), as every
//! other SUBSCRIBE header error is: ActiveMQ would ignore it silently, and
//! a client that asked for exclusivity and did not get it would never know.

use rosetta_neutral::{
    ConsumerOptions, StreamOffset, StreamRead, STREAM_GROUP_BYTES_MAX, VISIBILITY_TIMEOUT_MS_MAX,
};
/// SUBSCRIBE header giving the consumer's lease (visibility timeout), ms.
pub(crate) const VISIBILITY_TIMEOUT_HEADER: &str = "visibility-timeout";

use crate::error::StompError;
use crate::frame::{Frame, KnownHeader};

/// SUBSCRIBE header carrying a JMS message selector.
pub(crate) const SELECTOR_HEADER: &str = "selector";
/// SUBSCRIBE header asking for an exclusive consumer.
pub(crate) const EXCLUSIVE_HEADER: &str = "activemq.exclusive";
/// SUBSCRIBE header giving the consumer's priority.
pub(crate) const PRIORITY_HEADER: &str = "activemq.priority";
/// SUBSCRIBE header asking for a queue browser; also the MESSAGE header
/// (`browser:end`) that tells the browser it has seen everything.
pub(crate) const BROWSER_HEADER: &str = "browser";

/// Header naming the queue type, as RabbitMQ reads it on every frame.
pub(crate) const QUEUE_TYPE_HEADER: &str = "x-queue-type";
/// SUBSCRIBE header saying where a stream reader starts; also the MESSAGE
/// header carrying a stream message's offset.
pub(crate) const STREAM_OFFSET_HEADER: &str = "x-stream-offset";
/// SUBSCRIBE header naming the stream reader's consumer group.
pub(crate) const STREAM_GROUP_HEADER: &str = "x-stream-group";

/// Highest consumer priority: ActiveMQ keeps it in a byte and documents
/// 0–127, so a client written for it never sends more.
pub(crate) const CONSUMER_PRIORITY_MAX: i32 = 127;

/// The consumer options a SUBSCRIBE asks for. `is_queue`: the destination
/// is a queue (only queues can be browsed).
pub(crate) fn consumer_options(
    frame: &Frame,
    is_queue: bool,
) -> Result<ConsumerOptions, StompError> {
    let browse = flag(frame, BROWSER_HEADER)?;
    if browse && !is_queue {
        return Err(StompError::BrowseNotQueue(
            frame.header("destination").unwrap_or_default().to_owned(),
        ));
    }
    Ok(ConsumerOptions {
        selector: frame.header(SELECTOR_HEADER).map(str::to_owned),
        exclusive: flag(frame, EXCLUSIVE_HEADER)?,
        priority: priority(frame)?,
        browse,
        visibility_timeout_ms: visibility_timeout(frame)?,
        stream: stream_read(frame, is_queue)?,
    })
}

/// Whether a frame names queue type `stream` (`x-queue-type:stream`).
pub(crate) fn wants_stream(frame: &Frame) -> Result<bool, StompError> {
    match frame.known(KnownHeader::QueueType).map(str::trim) {
        None => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("stream") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("classic") || v.eq_ignore_ascii_case("quorum") => {
            Ok(false)
        }
        Some(v) => Err(bad(QUEUE_TYPE_HEADER, v)),
    }
}

/// The stream read a SUBSCRIBE asks for: with `x-queue-type:stream`, an
/// offset spec or a group, on a queue destination.
fn stream_read(frame: &Frame, is_queue: bool) -> Result<Option<StreamRead>, StompError> {
    let typed = wants_stream(frame)?;
    let offset = frame.header(STREAM_OFFSET_HEADER);
    let group = frame.header(STREAM_GROUP_HEADER);
    if !typed && offset.is_none() && group.is_none() {
        return Ok(None);
    }
    if !is_queue {
        let (header, value) = match (offset, group) {
            (Some(v), _) => (STREAM_OFFSET_HEADER, v),
            (None, Some(v)) => (STREAM_GROUP_HEADER, v),
            (None, None) => (QUEUE_TYPE_HEADER, "stream"),
        };
        return Err(bad(header, value));
    }
    let offset = match offset {
        None => None,
        Some(v) => Some(StreamOffset::parse(v.trim()).map_err(|_| bad(STREAM_OFFSET_HEADER, v))?),
    };
    let group = match group {
        Some(g) if g.is_empty() || g.len() > STREAM_GROUP_BYTES_MAX => {
            return Err(bad(STREAM_GROUP_HEADER, g));
        }
        g => g.map(str::to_owned),
    };
    Ok(Some(StreamRead {
        offset,
        group,
        declare: true,
    }))
}

fn visibility_timeout(frame: &Frame) -> Result<Option<u32>, StompError> {
    let Some(v) = frame.header(VISIBILITY_TIMEOUT_HEADER) else {
        return Ok(None);
    };
    match v.trim().parse::<u32>() {
        Ok(ms) if (1..=VISIBILITY_TIMEOUT_MS_MAX).contains(&ms) => Ok(Some(ms)),
        _ => Err(bad(VISIBILITY_TIMEOUT_HEADER, v)),
    }
}

/// A `true`/`false` header; absent is false.
fn flag(frame: &Frame, header: &'static str) -> Result<bool, StompError> {
    match frame.header(header).map(str::trim) {
        None => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(v) => Err(bad(header, v)),
    }
}

fn priority(frame: &Frame) -> Result<i32, StompError> {
    let Some(v) = frame.header(PRIORITY_HEADER) else {
        return Ok(0);
    };
    match v.trim().parse::<i32>() {
        Ok(p) if (0..=CONSUMER_PRIORITY_MAX).contains(&p) => Ok(p),
        _ => Err(bad(PRIORITY_HEADER, v)),
    }
}

fn bad(header: &'static str, value: &str) -> StompError {
    StompError::BadHeader {
        header,
        value: value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Command, Headers};

    fn subscribe(headers: &[(&str, &str)]) -> Frame {
        Frame {
            command: Command::Subscribe,
            headers: headers.iter().copied().collect::<Headers>(),
            body: Default::default(),
            has_content_length: false,
        }
    }

    #[test]
    fn headers_map_to_options() {
        let f = subscribe(&[
            ("destination", "/queue/q"),
            ("selector", "colour = 'green'"),
            ("activemq.exclusive", "TRUE"),
            ("activemq.priority", " 9 "),
            ("browser", "true"),
        ]);
        assert_eq!(
            consumer_options(&f, true).ok(),
            Some(ConsumerOptions {
                selector: Some("colour = 'green'".into()),
                exclusive: true,
                priority: 9,
                browse: true,
                visibility_timeout_ms: None,
                stream: None,
            })
        );
        let none = subscribe(&[("destination", "/queue/q")]);
        assert_eq!(
            consumer_options(&none, true).ok(),
            Some(ConsumerOptions::default())
        );
        let off = subscribe(&[("activemq.exclusive", "false"), ("browser", "False")]);
        assert_eq!(
            consumer_options(&off, true).ok(),
            Some(ConsumerOptions::default())
        );
    }

    #[test]
    fn bad_values_are_header_errors() {
        for (header, value) in [
            ("activemq.priority", "128"),
            ("activemq.priority", "-1"),
            ("activemq.priority", "high"),
            ("activemq.exclusive", "yes"),
            ("browser", "1"),
        ] {
            let f = subscribe(&[(header, value)]);
            assert!(
                matches!(consumer_options(&f, true), Err(StompError::BadHeader { header: h, .. }) if h == header),
                "{header}:{value}"
            );
        }
        let edge = subscribe(&[("activemq.priority", "127")]);
        assert_eq!(consumer_options(&edge, true).map(|o| o.priority), Ok(127));
    }

    #[test]
    fn only_queues_are_browsed() {
        let f = subscribe(&[("destination", "/topic/t"), ("browser", "true")]);
        assert_eq!(
            consumer_options(&f, false),
            Err(StompError::BrowseNotQueue("/topic/t".into()))
        );
        let sel = subscribe(&[("destination", "/topic/t"), ("selector", "a > 1")]);
        assert_eq!(
            consumer_options(&sel, false).map(|o| o.selector),
            Ok(Some("a > 1".into()))
        );
    }
}
