//! Address permissions: which destinations a user may publish to, and which
//! it may subscribe to or consume from.
//!
//! A permission is a list of patterns in MQTT wildcard syntax over the
//! *canonical destination* of an address (see [`Address::to_destination`]):
//!
//! | pattern              | allows                                         |
//! |----------------------|------------------------------------------------|
//! | `#`                  | everything                                     |
//! | `/topic/sensors/#`   | topic `sensors` and everything below it        |
//! | `/topic/+/temp`      | `a/temp`, `b/temp`, … (one level)              |
//! | `/queue/orders`      | the queue `orders`                             |
//! | `/queue/#`           | every queue                                    |
//!
//! Publishing needs a pattern that matches the destination. Subscribing
//! with a filter needs a pattern that *covers* the filter, i.e. matches
//! every topic the filter can match: `/topic/a/#` allows the filter
//! `/topic/a/+/c` but not `/topic/#`.
//!
//! As in MQTT, a wildcard in the first level of a topic does not reach
//! topics starting with `$`: `/topic/#` does not allow `$SYS/x`; write
//! `/topic/$SYS/#` for that. Only the bare pattern `#` allows everything.
//!
//! Adapters check the address after resolving it to the core's terms: an
//! MQTT `$share/group/f` subscription is checked as the filter `f`, and a
//! connection's own temporary queue is not checked at all.

use std::fmt;

use rosetta_neutral::address::validate_topic_filter;
use rosetta_neutral::Address;

/// Why a permission pattern is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Not `#` and not a canonical destination (`/topic/…`, `/queue/…`).
    #[error("`{0}`: patterns name canonical destinations, e.g. `/topic/sensors/#`, `/queue/orders`, or `#` for everything")]
    NotCanonical(String),
    /// Wildcards used wrongly (`a#`, `#/a`, `a+`).
    #[error("`{0}`: `+` must fill a whole level and `#` must be the whole last level")]
    Malformed(String),
}

/// One validated permission pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pattern(String);

impl Pattern {
    /// The pattern allowing everything.
    pub fn everything() -> Self {
        Pattern("#".to_owned())
    }

    /// Parses a pattern: `#`, or a canonical destination that may contain
    /// `+` and `#` levels.
    pub fn parse(s: &str) -> Result<Self, PatternError> {
        if s != "#" && !s.starts_with('/') {
            return Err(PatternError::NotCanonical(s.to_owned()));
        }
        validate_topic_filter(s).map_err(|_| PatternError::Malformed(s.to_owned()))?;
        Ok(Pattern(s.to_owned()))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True if every destination that `filter` (a canonical destination,
    /// possibly with wildcards) can match is matched by this pattern. For a
    /// concrete destination this is plain matching.
    pub fn covers(&self, filter: &str) -> bool {
        covers(&self.0, filter)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Index of the first name level in a canonical destination split on `/`
/// (`["", "topic", first, …]`, `["", "queue", first, …]`).
const TOPIC_FIRST_LEVEL: usize = 2;

/// See [`Pattern::covers`]. Both arguments are split into `/` levels and
/// walked together:
/// - pattern `#` covers whatever remains of the filter (also nothing: `a/#`
///   matches `a`);
/// - pattern `+` covers one filter level that is a name or `+`; it covers
///   a filter `#` only as `+/#` in the first name level (a `#` may span
///   several levels, or none);
/// - a literal covers only the same literal;
/// - and a pattern wildcard never covers a `$` level in a topic's first
///   position (MQTT's rule for `$SYS`), except the bare pattern `#`.
fn covers(pattern: &str, filter: &str) -> bool {
    if pattern == "#" {
        return true;
    }
    let is_topic = filter.starts_with(rosetta_neutral::address::TOPIC_PREFIX);
    let mut p = pattern.split('/');
    let mut f = filter.split('/').enumerate();
    loop {
        let next = f.next();
        let dollar_guard =
            |level: &str, i: usize| is_topic && i == TOPIC_FIRST_LEVEL && level.starts_with('$');
        match (p.next(), next) {
            (Some("#"), Some((i, level))) => return !dollar_guard(level, i),
            (Some("#"), None) => return true,
            // `+/#` means "one or more levels". A filter `#` means that too
            // where it stands for the whole name (a name has at least one
            // level); deeper down, `a/#` also matches `a` itself.
            (Some("+"), Some((i, "#"))) => return i == TOPIC_FIRST_LEVEL && p.eq(["#"]),
            (Some("+"), Some((i, level))) => {
                if dollar_guard(level, i) {
                    return false;
                }
            }
            (Some(lit), Some((_, level))) => {
                if lit != level {
                    return false;
                }
            }
            (None, None) => return true,
            (Some(_), None) | (None, Some(_)) => return false,
        }
    }
}

/// What one user (or the anonymous user) may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Destinations the user may publish or send to.
    pub publish: Vec<Pattern>,
    /// Destinations the user may subscribe to or consume from.
    pub subscribe: Vec<Pattern>,
}

impl Permissions {
    /// Everything allowed: the default for users and for anonymous access.
    pub fn everything() -> Self {
        Self {
            publish: vec![Pattern::everything()],
            subscribe: vec![Pattern::everything()],
        }
    }

    /// Nothing allowed.
    pub const fn nothing() -> Self {
        Self {
            publish: Vec::new(),
            subscribe: Vec::new(),
        }
    }

    /// May a message be published to `address` (a concrete topic or a
    /// queue)?
    pub fn may_publish(&self, address: &Address) -> bool {
        allowed(&self.publish, address)
    }

    /// May the user subscribe to `address` (a topic filter, wildcards
    /// allowed) or consume from it (a queue)?
    pub fn may_subscribe(&self, address: &Address) -> bool {
        allowed(&self.subscribe, address)
    }
}

/// Whether one of `patterns` covers `address`. This runs for every
/// publish, so the common grant of everything (`#`, the default) is
/// answered without building the destination string.
fn allowed(patterns: &[Pattern], address: &Address) -> bool {
    if patterns.iter().any(|p| p.0 == "#") {
        return true;
    }
    let dest = address.to_destination();
    patterns.iter().any(|p| p.covers(&dest))
}

impl Default for Permissions {
    fn default() -> Self {
        Self::everything()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (pattern, filter or destination, covered)
    const TABLE: &[(&str, &str, bool)] = &[
        ("#", "/topic/a/b", true),
        ("#", "/topic/#", true),
        ("#", "/queue/q", true),
        ("#", "/topic/$SYS/x", true),
        ("/topic/a/#", "/topic/a", true),
        ("/topic/a/#", "/topic/a/b", true),
        ("/topic/a/#", "/topic/a/b/c", true),
        ("/topic/a/#", "/topic/a/+/c", true),
        ("/topic/a/#", "/topic/a/#", true),
        ("/topic/a/#", "/topic/#", false),
        ("/topic/a/#", "/topic/+/b", false),
        ("/topic/a/#", "/topic/ab", false),
        ("/topic/a/#", "/queue/a", false),
        ("/topic/a/+", "/topic/a/b", true),
        ("/topic/a/+", "/topic/a/+", true),
        ("/topic/a/+", "/topic/a/#", false),
        ("/topic/a/+/#", "/topic/a/#", false),
        ("/topic/+/#", "/topic/#", true),
        ("/topic/+/#", "/topic/$SYS/#", false),
        ("/topic/a/+", "/topic/a", false),
        ("/topic/a/+", "/topic/a/b/c", false),
        ("/topic/+/temp", "/topic/x/temp", true),
        ("/topic/+/temp", "/topic/+/temp", true),
        ("/topic/+/temp", "/topic/x/hum", false),
        ("/topic/a/b", "/topic/a/b", true),
        ("/topic/a/b", "/topic/a/+", false),
        ("/topic/a/b", "/topic/a", false),
        ("/topic/a", "/topic/a/b", false),
        ("/topic/#", "/topic/a", true),
        ("/topic/#", "/topic/+/x", true),
        ("/topic/#", "/topic/#", true),
        ("/topic/#", "/topic/$SYS/broker", false),
        ("/topic/+/broker", "/topic/$SYS/broker", false),
        ("/topic/$SYS/#", "/topic/$SYS/broker", true),
        ("/topic/a/#", "/topic/a/$x", true),
        ("/topic/#", "/queue/q", false),
        ("/queue/orders", "/queue/orders", true),
        ("/queue/orders", "/queue/orders2", false),
        ("/queue/#", "/queue/orders", true),
        ("/queue/#", "/queue/$temp/x", true),
        ("/queue/+", "/queue/a/b", false),
        ("/topic/a//b", "/topic/a//b", true),
        ("/topic/a/+/b", "/topic/a//b", true),
    ];

    #[test]
    fn coverage_table() {
        for (pattern, filter, want) in TABLE {
            let p = Pattern::parse(pattern).expect(pattern);
            assert_eq!(p.covers(filter), *want, "{pattern} covers {filter}");
        }
    }

    #[test]
    fn coverage_agrees_with_matching_on_concrete_topics() {
        // For a concrete topic, covering is the neutral crate's matching.
        let topics = ["a", "a/b", "a/b/c", "$SYS/x", "b/a", "", "a/"];
        let filters = ["#", "a/#", "a/+", "+/b", "a/b", "+", "$SYS/#", "+/+/c"];
        for f in filters {
            let p = Pattern::parse(&format!("/topic/{f}")).expect(f);
            for t in topics {
                let want = rosetta_neutral::address::topic_matches(f, t);
                assert_eq!(p.covers(&format!("/topic/{t}")), want, "{f} vs {t}");
            }
        }
    }

    /// Covering must mean exactly: every topic the filter matches, the
    /// pattern matches. Checked exhaustively over small filters and a
    /// universe of topics that includes a `$` level and a name that appears
    /// in no filter (standing for "any other name").
    #[test]
    fn coverage_is_exact_over_a_small_universe() {
        fn build(
            levels: &[&str],
            depth: usize,
            out: &mut Vec<String>,
            prefix: &str,
            hash_last: bool,
        ) {
            if depth == 0 {
                return;
            }
            for l in levels {
                let t = if prefix.is_empty() {
                    (*l).to_owned()
                } else {
                    format!("{prefix}/{l}")
                };
                out.push(t.clone());
                build(levels, depth - 1, out, &t, hash_last);
            }
            if hash_last {
                out.push(if prefix.is_empty() {
                    "#".to_owned()
                } else {
                    format!("{prefix}/#")
                });
            }
        }
        let mut filters = Vec::new();
        build(&["a", "$s", "+"], 3, &mut filters, "", true);
        let mut topics = Vec::new();
        build(&["a", "$s", "z"], 5, &mut topics, "", false);
        let matches = rosetta_neutral::address::topic_matches;
        for p in &filters {
            let pattern = Pattern::parse(&format!("/topic/{p}")).expect(p);
            for f in &filters {
                let truth = topics.iter().all(|t| !matches(f, t) || matches(p, t));
                let got = pattern.covers(&format!("/topic/{f}"));
                assert_eq!(got, truth, "pattern {p} covers filter {f}");
            }
        }
    }

    #[test]
    fn patterns_validate() {
        for ok in [
            "#",
            "/topic/a/#",
            "/topic/+/x",
            "/queue/q",
            "/#",
            "/topic/a",
        ] {
            assert!(Pattern::parse(ok).is_ok(), "{ok}");
        }
        assert!(matches!(
            Pattern::parse("sensors/#"),
            Err(PatternError::NotCanonical(_))
        ));
        assert!(matches!(
            Pattern::parse(""),
            Err(PatternError::NotCanonical(_))
        ));
        assert!(matches!(
            Pattern::parse("+"),
            Err(PatternError::NotCanonical(_))
        ));
        assert!(matches!(
            Pattern::parse("/topic/a#"),
            Err(PatternError::Malformed(_))
        ));
        assert!(matches!(
            Pattern::parse("/topic/#/a"),
            Err(PatternError::Malformed(_))
        ));
    }

    #[test]
    fn permissions_check_addresses() {
        let p = Permissions {
            publish: vec![
                Pattern::parse("/topic/sensors/#").expect("p"),
                Pattern::parse("/queue/orders").expect("p"),
            ],
            subscribe: vec![Pattern::parse("/topic/sensors/+/temp").expect("p")],
        };
        assert!(p.may_publish(&Address::Topic("sensors/kitchen/temp".into())));
        assert!(p.may_publish(&Address::Queue("orders".into())));
        assert!(!p.may_publish(&Address::Queue("payments".into())));
        assert!(!p.may_publish(&Address::Topic("actuators/x".into())));
        assert!(p.may_subscribe(&Address::Topic("sensors/+/temp".into())));
        assert!(p.may_subscribe(&Address::Topic("sensors/hall/temp".into())));
        assert!(!p.may_subscribe(&Address::Topic("sensors/#".into())));
        assert!(!p.may_subscribe(&Address::Queue("orders".into())));
        let all = Permissions::everything();
        assert!(all.may_publish(&Address::Topic("$SYS/x".into())));
        assert!(all.may_subscribe(&Address::Topic("#".into())));
        let none = Permissions::nothing();
        assert!(!none.may_publish(&Address::Topic("a".into())));
        assert!(!none.may_subscribe(&Address::Topic("a".into())));
    }
}
