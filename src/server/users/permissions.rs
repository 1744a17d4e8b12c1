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
//! ## Deny rules
//! Each list has a deny counterpart (`deny_publish`, `deny_subscribe`), and
//! a deny wins over any allow, as in mosquitto's ACL file ("deny topics are
//! handled before topics that grant read/write access"): with
//! `subscribe = ["#"]` and `deny_subscribe = ["/topic/test/nosubscribe"]`
//! everything but that topic may be subscribed to.
//!
//! A deny pattern refuses a subscription whose filter it *covers* (every
//! topic the filter can match is denied): with the deny above,
//! `/topic/test/nosubscribe` is refused. A filter it only *overlaps*
//! (some topics denied, some not: `test/#`, `test/+`, `+/+`, `#`) is
//! granted, and the binding excludes the denied topics
//! ([`Permissions::excluded_topics`], kept by the core with the binding
//! and in the journal): it never delivers them, as published or as
//! retained messages. That is mosquitto's behaviour (a wildcard
//! subscription is granted and each message is checked against the
//! reader's ACL), which clients and test suites written against it
//! expect: the Paho interoperability suite denies `test/nosubscribe`
//! and then subscribes to `+/+` and `#`. The check runs once, at bind, not
//! per delivery.
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

    /// True if at least one destination matched by `filter` (a canonical
    /// destination, possibly with wildcards) is matched by this pattern.
    /// For a concrete destination this is plain matching too.
    pub fn overlaps(&self, filter: &str) -> bool {
        overlaps(&self.0, filter)
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

/// See [`Pattern::overlaps`]. The two are walked level by level as in
/// [`covers`], but symmetrically: a wildcard on either side meets anything
/// on the other, except that no first-level topic wildcard meets a `$`
/// name (neither side can match `$SYS/x` with `+` or `#` there), and a
/// trailing `#` on either side also matches the parent level itself.
fn overlaps(pattern: &str, filter: &str) -> bool {
    if pattern == "#" {
        return true;
    }
    let is_topic = filter.starts_with(rosetta_neutral::address::TOPIC_PREFIX);
    let dollar =
        |level: &str, i: usize| is_topic && i == TOPIC_FIRST_LEVEL && level.starts_with('$');
    let mut p = pattern.split('/').enumerate();
    let mut f = filter.split('/');
    loop {
        match (p.next(), f.next()) {
            (None, None) => return true,
            // `a/#` matches `a`: a side that ends meets a `#` that follows.
            (None, Some(rest)) => return rest == "#" && f.next().is_none(),
            (Some((_, rest)), None) => return rest == "#" && p.next().is_none(),
            (Some((i, a)), Some(b)) => {
                let wild = |l: &str| l == "#" || l == "+";
                match (wild(a), wild(b)) {
                    // Two wildcards meet on a name neither side rules out.
                    (true, true) => {}
                    (true, false) if dollar(b, i) => return false,
                    (false, true) if dollar(a, i) => return false,
                    (true, false) | (false, true) => {}
                    (false, false) if a != b => return false,
                    (false, false) => {}
                }
                // After a `#` (always last) anything deeper is matched.
                if a == "#" || b == "#" {
                    return true;
                }
            }
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
    /// Destinations the user may not publish to, whatever `publish` allows.
    pub deny_publish: Vec<Pattern>,
    /// Destinations the user may not subscribe to or consume from,
    /// whatever `subscribe` allows: a filter one covers is refused, a
    /// filter one overlaps is granted without the denied topics.
    pub deny_subscribe: Vec<Pattern>,
}

impl Permissions {
    /// Everything allowed: the default for users and for anonymous access.
    pub fn everything() -> Self {
        Self {
            publish: vec![Pattern::everything()],
            subscribe: vec![Pattern::everything()],
            deny_publish: Vec::new(),
            deny_subscribe: Vec::new(),
        }
    }

    /// Nothing allowed.
    pub const fn nothing() -> Self {
        Self {
            publish: Vec::new(),
            subscribe: Vec::new(),
            deny_publish: Vec::new(),
            deny_subscribe: Vec::new(),
        }
    }

    /// May a message be published to `address` (a concrete topic or a
    /// queue)?
    pub fn may_publish(&self, address: &Address) -> bool {
        // A published address is concrete: to overlap it is to match it.
        allowed(
            &self.publish,
            &self.deny_publish,
            address,
            Pattern::overlaps,
        )
    }

    /// May the user subscribe to `address` (a topic filter, wildcards
    /// allowed) or consume from it (a queue)? A deny refuses only a filter
    /// it covers; see [`Self::excluded_topics`] for the rest.
    pub fn may_subscribe(&self, address: &Address) -> bool {
        allowed(
            &self.subscribe,
            &self.deny_subscribe,
            address,
            Pattern::covers,
        )
    }

    /// The topic filters a granted subscription to `filter` must not
    /// deliver: the deny patterns that overlap it without covering it, in
    /// topic filter form (`/topic/test/x` as `test/x`).
    pub fn excluded_topics(&self, filter: &str) -> Vec<String> {
        if self.deny_subscribe.is_empty() {
            return Vec::new();
        }
        let dest = Address::Topic(filter.to_owned()).to_destination();
        self.deny_subscribe
            .iter()
            .filter(|p| p.overlaps(&dest) && !p.covers(&dest))
            .filter_map(|p| {
                p.as_str()
                    .strip_prefix(rosetta_neutral::address::TOPIC_PREFIX)
            })
            .map(str::to_owned)
            .collect()
    }
}

/// Whether one of `allow` covers `address` and no pattern of `deny`
/// refuses it (`refuses`: [`Pattern::covers`] or [`Pattern::overlaps`]). This runs for every publish, so the common grant of everything
/// (`#`, the default, with no deny rules) is answered without building the
/// destination string.
fn allowed(
    allow: &[Pattern],
    deny: &[Pattern],
    address: &Address,
    refuses: fn(&Pattern, &str) -> bool,
) -> bool {
    let everything = allow.iter().any(|p| p.0 == "#");
    if everything && deny.is_empty() {
        return true;
    }
    let dest = address.to_destination();
    (everything || allow.iter().any(|p| p.covers(&dest))) && !deny.iter().any(|p| refuses(p, &dest))
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

    /// Filters and topics for the exhaustive tests: every filter of up to
    /// three levels over `a`, `$s` and `+` (with or without a last `#`),
    /// and every topic of up to five levels over `a`, `$s` and `z` (a name
    /// that appears in no filter, standing for "any other name").
    fn small_universe() -> (Vec<String>, Vec<String>) {
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
        (filters, topics)
    }

    /// Covering must mean exactly: every topic the filter matches, the
    /// pattern matches.
    #[test]
    fn coverage_is_exact_over_a_small_universe() {
        let (filters, topics) = small_universe();
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

    /// Overlapping must mean exactly: some topic is matched by both the
    /// pattern and the filter (what a deny rule refuses).
    #[test]
    fn overlap_is_exact_over_a_small_universe() {
        let (filters, topics) = small_universe();
        let matches = rosetta_neutral::address::topic_matches;
        for p in &filters {
            let pattern = Pattern::parse(&format!("/topic/{p}")).expect(p);
            for f in &filters {
                let truth = topics.iter().any(|t| matches(f, t) && matches(p, t));
                let got = pattern.overlaps(&format!("/topic/{f}"));
                assert_eq!(got, truth, "pattern {p} overlaps filter {f}");
            }
            // And for concrete topics it is matching.
            for t in &topics {
                let got = pattern.overlaps(&format!("/topic/{t}"));
                assert_eq!(got, matches(p, t), "pattern {p} overlaps topic {t}");
            }
        }
        let everything = Pattern::everything();
        assert!(everything.overlaps("/topic/$SYS/x") && everything.overlaps("/queue/q"));
        let queues = Pattern::parse("/queue/#").expect("p");
        assert!(queues.overlaps("/queue/a") && !queues.overlaps("/topic/#"));
    }

    #[test]
    fn a_deny_wins_over_an_allow() {
        let nosub = Pattern::parse("/topic/test/nosubscribe").expect("p");
        let p = Permissions {
            publish: vec![Pattern::everything()],
            subscribe: vec![Pattern::everything()],
            deny_publish: vec![Pattern::parse("/queue/audit").expect("p")],
            deny_subscribe: vec![nosub],
        };
        let topic = |t: &str| Address::Topic(t.into());
        assert!(!p.may_subscribe(&topic("test/nosubscribe")));
        assert!(p.excluded_topics("test/nosubscribe").is_empty());
        // Filters that could match the denied topic are granted without it.
        for f in ["test/+", "test/#", "#", "+/nosubscribe", "+/+"] {
            assert!(p.may_subscribe(&topic(f)), "{f}");
            assert_eq!(p.excluded_topics(f), ["test/nosubscribe"], "{f}");
        }
        // A deny that covers a wildcard filter refuses it.
        let branch = Permissions {
            deny_subscribe: vec![Pattern::parse("/topic/test/#").expect("p")],
            ..Permissions::everything()
        };
        for f in ["test/+", "test/#", "test/a/b"] {
            assert!(!branch.may_subscribe(&topic(f)), "{f}");
        }
        assert!(branch.may_subscribe(&topic("#")));
        assert_eq!(branch.excluded_topics("#"), ["test/#"]);
        for f in [
            "test/other",
            "test/nosubscribe/deeper",
            "other/#",
            "+/x",
            "$SYS/#",
        ] {
            assert!(p.may_subscribe(&topic(f)), "{f}");
            assert!(p.excluded_topics(f).is_empty(), "{f}");
        }
        assert!(p.may_subscribe(&Address::Queue("audit".into())));
        assert!(!p.may_publish(&Address::Queue("audit".into())));
        assert!(p.may_publish(&Address::Queue("audit2".into())));
        assert!(p.may_publish(&topic("test/nosubscribe")));
        // A deny of everything leaves nothing, whatever is allowed.
        let shut = Permissions {
            deny_publish: vec![Pattern::everything()],
            ..Permissions::everything()
        };
        assert!(!shut.may_publish(&topic("a")));
        assert!(shut.may_subscribe(&topic("a")));
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
            ..Permissions::nothing()
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
