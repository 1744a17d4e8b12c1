//! Delayed publish, as EMQX spells it: a PUBLISH to
//! `$delayed/<seconds>/<topic>` goes to `<topic>` (which may be
//! `$queue/<q>`) and is delivered `<seconds>` after it arrived.
//!
//! The delay is whole seconds, ASCII digits only (no sign, no fraction, no
//! spaces), at most [`DELIVERY_DELAY_MAX_MS`] / 1000 (a year; EMQX's own
//! bound is about 497 days). EMQX's other form, an absolute Unix time in
//! the same place, is not taken: every number is an interval. Where EMQX
//! drops a malformed `$delayed/` topic silently, Rosetta refuses it as an
//! invalid topic name (MQTT 5 reason code 0x90; MQTT 3.1.1 closes the
//! connection, having no negative acknowledgement), so a publisher learns
//! of its mistake.

use rosetta_neutral::message::DELIVERY_DELAY_MAX_MS;

/// The topic prefix of a delayed publish.
pub(crate) const DELAYED_PREFIX: &str = "$delayed/";

/// Longest delay in seconds a `$delayed/` topic may ask for.
const DELAYED_SECONDS_MAX: u64 = DELIVERY_DELAY_MAX_MS / 1000;

/// Digits the delay may have: enough for [`DELAYED_SECONDS_MAX`], a bound
/// before parsing.
const DELAYED_SECONDS_DIGITS_MAX: usize = 10;

/// A `$delayed/` topic taken apart.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Delayed<'a> {
    /// The delay, in ms.
    pub(crate) delay_ms: u64,
    /// Where the message goes.
    pub(crate) topic: &'a str,
}

/// `Ok(None)` for a topic that is not a delayed publish, `Err(())` for a
/// malformed or out-of-range `$delayed/` topic.
pub(crate) fn parse(topic: &str) -> Result<Option<Delayed<'_>>, ()> {
    let Some(rest) = topic.strip_prefix(DELAYED_PREFIX) else {
        return Ok(None);
    };
    let (seconds, target) = rest.split_once('/').ok_or(())?;
    if seconds.is_empty()
        || seconds.len() > DELAYED_SECONDS_DIGITS_MAX
        || !seconds.bytes().all(|b| b.is_ascii_digit())
        || target.is_empty()
        || target.starts_with(DELAYED_PREFIX)
    {
        return Err(());
    }
    let seconds: u64 = seconds.parse().map_err(|_| ())?;
    if seconds > DELAYED_SECONDS_MAX {
        return Err(());
    }
    Ok(Some(Delayed {
        delay_ms: seconds * 1000,
        topic: target,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delayed_topic_names_its_seconds_and_its_target() {
        assert_eq!(parse("a/b"), Ok(None));
        assert_eq!(parse("$delayed"), Ok(None));
        assert_eq!(
            parse("$delayed/15/x/y"),
            Ok(Some(Delayed {
                delay_ms: 15_000,
                topic: "x/y"
            }))
        );
        assert_eq!(
            parse("$delayed/0/$queue/q"),
            Ok(Some(Delayed {
                delay_ms: 0,
                topic: "$queue/q"
            }))
        );
        let max = format!("$delayed/{DELAYED_SECONDS_MAX}/t");
        assert!(matches!(parse(&max), Ok(Some(_))));
    }

    #[test]
    fn a_malformed_or_too_long_delay_is_refused() {
        let past = format!("$delayed/{}/t", DELAYED_SECONDS_MAX + 1);
        for bad in [
            "$delayed/",
            "$delayed/15",
            "$delayed/15/",
            "$delayed//t",
            "$delayed/-1/t",
            "$delayed/+1/t",
            "$delayed/1.5/t",
            "$delayed/ 1/t",
            "$delayed/ten/t",
            "$delayed/99999999999999999999/t",
            "$delayed/5/$delayed/5/t",
            &past,
        ] {
            assert_eq!(parse(bad), Err(()), "{bad}");
        }
    }
}
