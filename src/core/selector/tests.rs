//! Selector tests: literals, operators, three-valued logic, headers,
//! malformed input, limits, and property tests that nothing panics.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use rosetta_neutral::{Message, MessageId, Value};

use super::*;

fn msg(props: &[(&str, Value)]) -> Message {
    let mut m = Message::text("body");
    for (name, value) in props {
        m.properties.push(*name, value.clone());
    }
    m
}

/// Whether `selector` matches `message`; panics on a parse error, naming it.
fn sel_matches(selector: &str, message: &Message) -> bool {
    match Selector::parse(selector) {
        Ok(s) => s.matches(message),
        Err(e) => panic!("{selector:?} does not parse: {e}"),
    }
}

fn err(selector: &str) -> SelectorError {
    match Selector::parse(selector) {
        Ok(_) => panic!("{selector:?} parsed but must not"),
        Err(e) => e,
    }
}

/// TRUE, FALSE or UNKNOWN of a condition, told apart by the selector alone:
/// UNKNOWN is neither matched by `c` nor by `NOT (c)`.
fn truth_of(condition: &str, m: &Message) -> Option<bool> {
    let yes = sel_matches(condition, m);
    let no = sel_matches(&format!("NOT ({condition})"), m);
    match (yes, no) {
        (true, false) => Some(true),
        (false, true) => Some(false),
        (false, false) => None,
        (true, true) => panic!("{condition:?} is both TRUE and FALSE"),
    }
}

// ---- the Proton example -------------------------------------------------

#[test]
fn colour_green_matches_exactly_the_fifty_green_of_a_hundred() {
    let selector = Selector::parse("colour = 'green'").expect("parses");
    let messages: Vec<Message> = (0..100)
        .map(|i| {
            let colour = if i % 2 == 0 { "green" } else { "red" };
            let mut m = msg(&[("colour", Value::from(colour))]);
            m.message_id = Some(MessageId::Ulong(i));
            m
        })
        .collect();
    let matched: Vec<u64> = messages
        .iter()
        .filter(|m| selector.matches(m))
        .filter_map(|m| match m.message_id {
            Some(MessageId::Ulong(i)) => Some(i),
            _ => None,
        })
        .collect();
    assert_eq!(matched, (0..100).step_by(2).collect::<Vec<_>>());
}

// ---- literals -----------------------------------------------------------

#[test]
fn exact_literals_in_every_form() {
    let m = msg(&[("n", Value::Long(31))]);
    for s in [
        "n = 31",
        "n = 31L",
        "n = 31l",
        "n = 0x1F",
        "n = 0X1f",
        "n = 037",
        "n = 0x1FL",
        "n = +31",
        "-n = -31",
    ] {
        assert!(sel_matches(s, &m), "{s}");
    }
    let zero = msg(&[("n", Value::Int(0))]);
    assert!(sel_matches("n = 0", &zero));
    assert!(sel_matches("n = 00", &zero));
    let min = msg(&[("n", Value::Long(i64::MIN))]);
    assert!(sel_matches("n = -9223372036854775808", &min));
    let max = msg(&[("n", Value::Long(i64::MAX))]);
    assert!(sel_matches("n = 9223372036854775807", &max));
}

#[test]
fn approximate_literals_in_every_form() {
    let m = msg(&[("x", Value::Double(7.0))]);
    for s in [
        "x = 7.",
        "x = 7.0",
        "x = 7E0",
        "x = 0.7e1",
        "x = .7E1",
        "x = 70E-1",
        "x = 7.0D",
        "x = 7d",
        "x = 7F",
        "x = 7.0f",
        "x = 0.07e+2",
    ] {
        assert!(sel_matches(s, &m), "{s}");
    }
    let half = msg(&[("x", Value::Double(0.5))]);
    assert!(sel_matches("x = .5", &half));
    // A float literal is rounded to float, as Java does: 1.1F is not 1.1.
    let d = msg(&[("x", Value::Double(1.1))]);
    assert!(sel_matches("x = 1.1", &d));
    assert!(!sel_matches("x = 1.1F", &d));
    let f = msg(&[("x", Value::Float(1.1))]);
    assert!(sel_matches("x = 1.1F", &f));
    assert!(!sel_matches("x = 1.1", &f));
}

#[test]
fn string_literals_double_their_quotes() {
    let m = msg(&[("s", Value::from("it's"))]);
    assert!(sel_matches("s = 'it''s'", &m));
    assert!(!sel_matches("s = 'its'", &m));
    let empty = msg(&[("s", Value::from(""))]);
    assert!(sel_matches("s = ''", &empty));
    let quote = msg(&[("s", Value::from("'"))]);
    assert!(sel_matches("s = ''''", &quote));
    let unicode = msg(&[("s", Value::from("grün"))]);
    assert!(sel_matches("s = 'grün'", &unicode));
}

#[test]
fn boolean_literals_and_boolean_properties() {
    let m = msg(&[
        ("t", Value::Bool(true)),
        ("f", Value::Bool(false)),
        ("n", Value::Int(1)),
    ]);
    assert!(sel_matches("TRUE", &m));
    assert!(!sel_matches("FALSE", &m));
    assert!(sel_matches("t", &m));
    assert!(!sel_matches("f", &m));
    assert!(sel_matches("t = TRUE AND f = false", &m));
    assert!(sel_matches("t <> f", &m));
    // A non-boolean property used as a condition is FALSE (Artemis' cast).
    assert_eq!(truth_of("n", &m), Some(false));
    assert_eq!(truth_of("missing", &m), None);
}

#[test]
fn keywords_are_case_insensitive_identifiers_are_not() {
    let m = msg(&[("a", Value::Int(5)), ("s", Value::from("x"))]);
    for s in [
        "a between 1 and 9",
        "a BeTwEeN 1 AnD 9",
        "not a not between 1 and 9",
        "s in ('x') or false",
        "s Like 'x' escape '!'",
        "s is not null And a Is Not Null",
        "True",
    ] {
        assert!(sel_matches(s, &m), "{s}");
    }
    assert_eq!(
        truth_of("A = 5", &m),
        None,
        "identifiers are case-sensitive"
    );
}

#[test]
fn identifiers_follow_java_rules() {
    let m = msg(&[
        ("_x", Value::Int(1)),
        ("$y", Value::Int(2)),
        ("a1_$", Value::Int(3)),
        ("größe", Value::Int(4)),
    ]);
    assert!(sel_matches(
        "_x = 1 AND $y = 2 AND a1_$ = 3 AND größe = 4",
        &m
    ));
}

// ---- operators and three-valued logic -----------------------------------

const TRUTHS: [(&str, Option<bool>); 3] =
    [("TRUE", Some(true)), ("FALSE", Some(false)), ("u", None)];

#[test]
fn and_or_not_truth_tables() {
    // `u` is a missing property: UNKNOWN as a condition.
    let m = msg(&[]);
    let and = |a: Option<bool>, b: Option<bool>| match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    };
    let or = |a: Option<bool>, b: Option<bool>| match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    };
    for (a, ta) in TRUTHS {
        assert_eq!(truth_of(&format!("NOT {a}"), &m), ta.map(|t| !t), "NOT {a}");
        for (b, tb) in TRUTHS {
            assert_eq!(
                truth_of(&format!("{a} AND {b}"), &m),
                and(ta, tb),
                "{a} AND {b}"
            );
            assert_eq!(
                truth_of(&format!("{a} OR {b}"), &m),
                or(ta, tb),
                "{a} OR {b}"
            );
        }
    }
    // Spelled out, the rows SQL users trip on.
    assert_eq!(truth_of("u AND FALSE", &m), Some(false));
    assert_eq!(truth_of("u OR TRUE", &m), Some(true));
    assert_eq!(truth_of("u AND TRUE", &m), None);
    assert_eq!(truth_of("u OR FALSE", &m), None);
}

#[test]
fn precedence_is_jms_order() {
    let m = msg(&[("a", Value::Int(1)), ("b", Value::Int(2))]);
    // AND binds tighter than OR.
    assert!(sel_matches("TRUE OR TRUE AND FALSE", &m));
    assert!(!sel_matches("(TRUE OR TRUE) AND FALSE", &m));
    // NOT binds looser than comparison: NOT (a = 2).
    assert!(sel_matches("NOT a = 2", &m));
    // * / before + -, left to right.
    assert!(sel_matches("1 + 2 * 3 = 7", &m));
    assert!(sel_matches("(1 + 2) * 3 = 9", &m));
    assert!(sel_matches("8 / 4 / 2 = 1", &m));
    assert!(sel_matches("8 - 4 - 2 = 2", &m));
    assert!(sel_matches("-a + b = 1", &m));
    assert!(sel_matches("- - a = 1", &m));
}

#[test]
fn comparisons_of_numbers_by_value_across_types() {
    let m = msg(&[
        ("i", Value::Int(10)),
        ("l", Value::Long(10)),
        ("b", Value::Byte(10)),
        ("ub", Value::UByte(10)),
        ("d", Value::Double(10.0)),
        ("f", Value::Float(10.0)),
        ("big", Value::ULong(u64::MAX)),
        ("ts", Value::Timestamp(10)),
    ]);
    for s in [
        "i = l",
        "i = b",
        "ub = d",
        "f = 10",
        "d = 10",
        "i = 10.0",
        "ts = 10",
        "i < 11",
        "i <= 10",
        "i > 9.5",
        "i >= 10",
        "i <> 11",
        "big > 9223372036854775807",
    ] {
        assert_eq!(truth_of(s, &m), Some(true), "{s}");
    }
    for s in ["i < 10", "i > 10", "i <> 10", "d <> 10", "i = 11"] {
        assert_eq!(truth_of(s, &m), Some(false), "{s}");
    }
}

#[test]
fn strings_and_booleans_compare_only_for_equality() {
    let m = msg(&[("s", Value::from("b")), ("t", Value::Bool(true))]);
    assert_eq!(truth_of("s = 'b'", &m), Some(true));
    assert_eq!(truth_of("s <> 'b'", &m), Some(false));
    // Ordering on strings is refused at parse time when a side is a literal ...
    assert!(matches!(err("s < 'c'").kind, SelectorErrorKind::Type(_)));
    // ... and FALSE between two string properties.
    let two = msg(&[("s", Value::from("a")), ("r", Value::from("b"))]);
    assert_eq!(truth_of("s < r", &two), Some(false));
    assert_eq!(truth_of("t = TRUE", &m), Some(true));
    assert!(matches!(err("t > TRUE").kind, SelectorErrorKind::Type(_)));
}

#[test]
fn different_types_compare_false_not_unknown() {
    // JMS 2.0 §3.8.1.2: "If the comparison of non-like type values is
    // attempted, the value of the operation is false."
    let m = msg(&[
        ("s", Value::from("1")),
        ("n", Value::Int(1)),
        ("t", Value::Bool(true)),
        ("u", Value::Uuid([0; 16])),
    ]);
    for s in [
        "s = 1",
        "s <> 1",
        "n = '1'",
        "n <> '1'",
        "t = 1",
        "t = 'true'",
        "s > 0",
        "u = 'x'",
        "u <> 'x'",
        "n IN ('1')",
        "n NOT IN ('1')",
        "n LIKE '1'",
        "n NOT LIKE '1'",
    ] {
        assert_eq!(truth_of(s, &m), Some(false), "{s}");
    }
    assert_eq!(truth_of("u IS NULL", &m), Some(false));
}

#[test]
fn null_and_missing_values_are_unknown() {
    let m = msg(&[("nul", Value::Null), ("n", Value::Int(1))]);
    for s in [
        "missing = 1",
        "missing <> 1",
        "nul = 1",
        "missing > 1",
        "missing + 1 = 2",
        "n + missing = 2",
        "-missing = 1",
        "missing BETWEEN 1 AND 2",
        "n BETWEEN missing AND 2",
        "missing IN ('a')",
        "missing NOT IN ('a')",
        "missing LIKE 'a%'",
        "missing NOT LIKE 'a%'",
        "missing = missing",
    ] {
        assert_eq!(truth_of(s, &m), None, "{s}");
    }
    assert_eq!(truth_of("missing IS NULL", &m), Some(true));
    assert_eq!(truth_of("nul IS NULL", &m), Some(true));
    assert_eq!(truth_of("n IS NULL", &m), Some(false));
    assert_eq!(truth_of("n IS NOT NULL", &m), Some(true));
    assert_eq!(truth_of("missing + 1 IS NULL", &m), Some(true));
    // BETWEEN with one bound unknown can still be decided by the other.
    assert_eq!(truth_of("n BETWEEN missing AND 0", &m), Some(false));
    assert_eq!(truth_of("n NOT BETWEEN missing AND 0", &m), Some(true));
}

#[test]
fn arithmetic_and_division() {
    let m = msg(&[
        ("a", Value::Int(7)),
        ("z", Value::Int(0)),
        ("d", Value::Double(2.0)),
    ]);
    assert!(sel_matches("a / 2 = 3", &m), "exact division truncates");
    assert!(sel_matches("-a / 2 = -3", &m), "toward zero");
    assert!(sel_matches("a / d = 3.5", &m));
    assert!(sel_matches("a * 2 - 4 = 10", &m));
    assert_eq!(
        truth_of("a / z = 0", &m),
        None,
        "integer division by zero is UNKNOWN"
    );
    assert_eq!(truth_of("a / z IS NULL", &m), Some(true));
    // Floating division by zero follows IEEE, as Java's double does.
    assert_eq!(truth_of("a / 0.0 > 1000000", &m), Some(true));
    // Overflow is NULL, never a wrapped value.
    let big = msg(&[("b", Value::Long(i64::MAX))]);
    assert_eq!(truth_of("b * b > 0", &big), Some(true), "i128 holds b*b");
    assert!(sel_matches("b * b * b IS NULL", &big));
    let max = msg(&[("b", Value::ULong(u64::MAX))]);
    assert!(sel_matches("b > 0 AND b * b * b IS NULL", &max));
    // Arithmetic on a string property is NULL.
    let s = msg(&[("s", Value::from("3"))]);
    assert_eq!(truth_of("s + 1 = 4", &s), None);
}

#[test]
fn between_and_not_between() {
    let m = msg(&[("age", Value::Int(17)), ("s", Value::from("17"))]);
    assert_eq!(truth_of("age BETWEEN 15 AND 19", &m), Some(true));
    assert_eq!(truth_of("age BETWEEN 17 AND 17", &m), Some(true));
    assert_eq!(truth_of("age BETWEEN 18 AND 19", &m), Some(false));
    assert_eq!(truth_of("age NOT BETWEEN 15 AND 19", &m), Some(false));
    assert_eq!(truth_of("age NOT BETWEEN 18 AND 19", &m), Some(true));
    assert_eq!(truth_of("age BETWEEN 16.5 AND 17.5", &m), Some(true));
    assert_eq!(truth_of("age BETWEEN 1 + 15 AND 2 * 9", &m), Some(true));
    // A string is of another type: FALSE both ways (JMS's equivalences).
    assert_eq!(truth_of("s BETWEEN 15 AND 19", &m), Some(false));
    assert_eq!(truth_of("s NOT BETWEEN 15 AND 19", &m), Some(false));
}

#[test]
fn in_and_not_in() {
    let m = msg(&[
        ("c", Value::from("UK")),
        ("sym", Value::Symbol("FR".into())),
        ("ch", Value::Char('x')),
    ]);
    assert_eq!(truth_of("c IN ('US', 'UK', 'FR')", &m), Some(true));
    assert_eq!(truth_of("c IN ('US')", &m), Some(false));
    assert_eq!(truth_of("c NOT IN ('US', 'FR')", &m), Some(true));
    assert_eq!(truth_of("c NOT IN ('UK')", &m), Some(false));
    assert_eq!(truth_of("sym IN ('FR')", &m), Some(true));
    assert_eq!(truth_of("ch IN ('x')", &m), Some(true));
    assert_eq!(
        truth_of("c IN ('uk')", &m),
        Some(false),
        "string comparison is exact"
    );
}

#[test]
fn like_with_wildcards_and_escape() {
    let m = msg(&[
        ("w", Value::from("phone")),
        ("u", Value::from("under_score")),
        ("p", Value::from("100%")),
    ]);
    for (s, expected) in [
        ("w LIKE 'ph%'", true),
        ("w LIKE '%one'", true),
        ("w LIKE '%ho%'", true),
        ("w LIKE 'ph_ne'", true),
        ("w LIKE 'ph_n'", false),
        ("w LIKE '_____'", true),
        ("w LIKE '%'", true),
        ("w LIKE 'phone'", true),
        ("w LIKE 'Phone'", false),
        ("w LIKE 'p%h%o%n%e'", true),
        ("w LIKE 'p%%e'", true),
        ("w LIKE 'ph%x'", false),
        ("w NOT LIKE 'ph%'", false),
        ("w NOT LIKE 'x%'", true),
        ("u LIKE 'under\\_%' ESCAPE '\\'", true),
        ("w LIKE 'ph\\_ne' ESCAPE '\\'", false),
        ("p LIKE '100!%' ESCAPE '!'", true),
        ("p LIKE '1!%' ESCAPE '!'", false),
        ("p LIKE '%!%' ESCAPE '!'", true),
        ("u LIKE 'under!!%' ESCAPE '!'", false),
    ] {
        assert_eq!(truth_of(s, &m), Some(expected), "{s}");
    }
    let overlap = msg(&[("v", Value::from("aXbXc"))]);
    assert!(sel_matches("v LIKE '%X%X%'", &overlap));
    assert!(sel_matches("v LIKE 'a%c'", &overlap));
    assert!(!sel_matches("v LIKE '%X%X%X%'", &overlap));
    let short = msg(&[("v", Value::from("ab"))]);
    assert!(
        !sel_matches("v LIKE 'ab%b'", &short),
        "prefix and suffix must not overlap"
    );
    let unicode = msg(&[("v", Value::from("ñu"))]);
    assert!(
        sel_matches("v LIKE '_u'", &unicode),
        "_ is one character, not one byte"
    );
}

#[test]
fn like_does_not_backtrack() {
    let value = "a".repeat(100_000);
    let m = msg(&[("v", Value::from(value.as_str()))]);
    let selector = Selector::parse("v LIKE '%a%a%a%a%a%a%a%a%a%a%b'").expect("parses");
    let started = Instant::now();
    assert!(!selector.matches(&m));
    // A backtracking matcher takes (100k)^10 steps; this one about 1M.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

// ---- JMS headers ----------------------------------------------------------

#[test]
fn jms_headers_read_message_fields() {
    let mut m = Message::text("x");
    m.priority = 7;
    m.message_id = Some(MessageId::String("ID:42".into()));
    m.correlation_id = Some(MessageId::Ulong(9));
    m.subject = Some("order".into());
    m.creation_time = Some(1_700_000_000_000);
    m.durable = true;
    for s in [
        "JMSPriority = 7",
        "JMSPriority > 4",
        "JMSMessageID = 'ID:42'",
        "JMSCorrelationID = '9'",
        "JMSType = 'order'",
        "JMSTimestamp = 1700000000000",
        "JMSTimestamp > 0",
        "JMSDeliveryMode = 'PERSISTENT'",
    ] {
        assert_eq!(truth_of(s, &m), Some(true), "{s}");
    }
    // Properties of the same names do not shadow the headers.
    m.properties.push("JMSPriority", Value::Int(1));
    assert!(sel_matches("JMSPriority = 7", &m));
    let plain = Message::text("x");
    assert!(sel_matches("JMSDeliveryMode = 'NON_PERSISTENT'", &plain));
    assert!(
        sel_matches("JMSPriority = 4", &plain),
        "the default priority"
    );
    for s in [
        "JMSMessageID",
        "JMSCorrelationID",
        "JMSType",
        "JMSTimestamp",
    ] {
        assert!(sel_matches(&format!("{s} IS NULL"), &plain), "{s} unset");
    }
    // Other names, JMS-like or not, are properties.
    let mut p = Message::text("x");
    p.properties.push("JMSXGroupID", "g");
    assert!(sel_matches("JMSXGroupID = 'g'", &p));
}

#[test]
fn empty_selector_matches_everything() {
    for s in ["", "   ", "\t\n"] {
        let selector = Selector::parse(s).expect("empty parses");
        assert!(selector.is_empty());
        assert!(selector.matches(&Message::text("x")));
    }
    let s = Selector::parse("a = 1").expect("parses");
    assert!(!s.is_empty());
    assert_eq!(s.as_str(), "a = 1");
}

// ---- malformed selectors ------------------------------------------------

#[test]
fn malformed_selectors_say_where_and_why() {
    use SelectorErrorKind as K;
    type IsKind = fn(&K) -> bool;
    let cases: Vec<(&str, usize, IsKind)> = vec![
        ("(a = 1", 6, |k| {
            matches!(
                k,
                K::Unexpected {
                    expected: "')'",
                    ..
                }
            )
        }),
        ("a = 1)", 5, |k| matches!(k, K::Unexpected { .. })),
        ("((a = 1)", 8, |k| matches!(k, K::Unexpected { .. })),
        ("a = 1 b", 6, |k| matches!(k, K::Unexpected { .. })),
        ("a = 1 AND", 9, |k| matches!(k, K::Unexpected { .. })),
        (
            "a != 1",
            2,
            |k| matches!(k, K::UnknownOperator(op) if op == "!="),
        ),
        (
            "a == 1",
            2,
            |k| matches!(k, K::UnknownOperator(op) if op == "=="),
        ),
        ("a ~ 1", 2, |k| matches!(k, K::UnexpectedCharacter('~'))),
        ("a = \"x\"", 4, |k| matches!(k, K::UnexpectedCharacter('"'))),
        ("a = 'x", 4, |k| matches!(k, K::UnterminatedString)),
        ("a = 09", 4, |k| matches!(k, K::MalformedNumber(_))),
        ("a = 12abc", 4, |k| matches!(k, K::MalformedNumber(_))),
        ("a = 1e", 4, |k| matches!(k, K::MalformedNumber(_))),
        ("a = 0x", 4, |k| matches!(k, K::MalformedNumber(_))),
        ("a = 1.5.5", 4, |k| matches!(k, K::MalformedNumber(_))),
        ("a = 9223372036854775808", 4, |k| {
            matches!(k, K::NumberOutOfRange(_))
        }),
        ("a = 99999999999999999999", 4, |k| {
            matches!(k, K::NumberOutOfRange(_))
        }),
        ("a = 1e999", 4, |k| matches!(k, K::NumberOutOfRange(_))),
        ("a = 1e39F", 4, |k| matches!(k, K::NumberOutOfRange(_))),
        (
            "AND = 1",
            0,
            |k| matches!(k, K::ReservedWord(w) if w == "AND"),
        ),
        (
            "between = 1",
            0,
            |k| matches!(k, K::ReservedWord(w) if w == "BETWEEN"),
        ),
        ("a = 1 OR escape > 2", 9, |k| {
            matches!(k, K::ReservedWord(_))
        }),
        ("a = NULL", 4, |k| matches!(k, K::Type(_))),
        ("NULL = a", 0, |k| matches!(k, K::Type(_))),
        ("'a' > 1", 0, |k| matches!(k, K::Type(_))),
        ("1 + TRUE = 2", 4, |k| matches!(k, K::Type(_))),
        ("'x' = 1", 6, |k| matches!(k, K::Type(_))),
        ("1 + 2", 0, |k| matches!(k, K::Type(_))),
        ("'s'", 0, |k| matches!(k, K::Type(_))),
        ("NOT 5", 4, |k| matches!(k, K::Type(_))),
        ("a = 1 AND 5", 10, |k| matches!(k, K::Type(_))),
        ("1 IN ('a')", 0, |k| matches!(k, K::Type(_))),
        ("a IN (1, 2)", 6, |k| matches!(k, K::Unexpected { .. })),
        ("a IN ()", 6, |k| matches!(k, K::Unexpected { .. })),
        ("a IN 'x'", 5, |k| matches!(k, K::Unexpected { .. })),
        ("a LIKE b", 7, |k| matches!(k, K::Unexpected { .. })),
        ("a LIKE 'x' ESCAPE 'ab'", 18, |k| {
            matches!(k, K::BadEscape(_))
        }),
        ("a LIKE 'x' ESCAPE ''", 18, |k| matches!(k, K::BadEscape(_))),
        ("a LIKE 'x!' ESCAPE '!'", 7, |k| {
            matches!(k, K::BadEscape(_))
        }),
        ("a BETWEEN 1", 11, |k| matches!(k, K::Unexpected { .. })),
        ("a BETWEEN 'a' AND 'b'", 10, |k| matches!(k, K::Type(_))),
        ("a NOT 1", 6, |k| matches!(k, K::Unexpected { .. })),
        ("a IS 1", 5, |k| matches!(k, K::Unexpected { .. })),
        ("a IS NOT", 8, |k| matches!(k, K::Unexpected { .. })),
        ("()", 1, |k| matches!(k, K::Unexpected { .. })),
        ("a = ", 4, |k| matches!(k, K::Unexpected { .. })),
    ];
    for (selector, position, kind) in cases {
        let e = err(selector);
        assert!(kind(&e.kind), "{selector:?}: wrong kind {:?}", e.kind);
        assert_eq!(e.position, position, "{selector:?}: {e}");
        assert!(
            e.to_string().starts_with("invalid selector at byte "),
            "{e}"
        );
    }
}

#[test]
fn error_messages_read_well() {
    assert_eq!(
        err("(a = 1").to_string(),
        "invalid selector at byte 6: expected ')', found end of selector"
    );
    assert_eq!(
        err("a != 1").to_string(),
        "invalid selector at byte 2: unknown operator '!=' (JMS writes not-equal as '<>' and equality as '=')"
    );
    assert_eq!(
        err("NOT = 1").to_string(),
        "invalid selector at byte 4: expected an identifier, a literal or '(', found '='"
    );
}

// ---- limits -------------------------------------------------------------

#[test]
fn selector_length_is_limited() {
    let at_limit = format!("a = '{}'", "x".repeat(SELECTOR_BYTES_MAX - 6));
    assert_eq!(at_limit.len(), SELECTOR_BYTES_MAX);
    assert!(Selector::parse(&at_limit).is_ok());
    let over = format!("a = '{}'", "x".repeat(SELECTOR_BYTES_MAX - 5));
    assert_eq!(
        err(&over).kind,
        SelectorErrorKind::TooLong {
            bytes: SELECTOR_BYTES_MAX + 1,
            max: SELECTOR_BYTES_MAX
        }
    );
}

#[test]
fn nesting_depth_is_limited_before_the_stack_is() {
    let m = msg(&[("a", Value::Int(1))]);
    let nested = |n: usize| format!("{}a = 1{}", "(".repeat(n), ")".repeat(n));
    assert!(sel_matches(&nested(EXPRESSION_DEPTH_MAX - 1), &m));
    let too_deep = SelectorErrorKind::TooDeep {
        max: EXPRESSION_DEPTH_MAX,
    };
    assert_eq!(err(&nested(EXPRESSION_DEPTH_MAX + 1)).kind, too_deep);
    // Far past the limit, still an error and not a stack overflow.
    assert_eq!(err(&"(".repeat(4000)).kind, too_deep);
    assert_eq!(err(&"NOT ".repeat(1000)).kind, too_deep);
    assert_eq!(err(&format!("{}1 = 1", "-".repeat(4000))).kind, too_deep);
    // Left-leaning chains, built without recursion, are bounded too.
    let chain = |n: usize| format!("a{} = {}", " + a".repeat(n), n + 1);
    assert!(sel_matches(&chain(EXPRESSION_DEPTH_MAX - 2), &m));
    assert_eq!(err(&chain(EXPRESSION_DEPTH_MAX)).kind, too_deep);
    let ors = format!("a = 1{}", " OR a = 1".repeat(EXPRESSION_DEPTH_MAX));
    assert_eq!(err(&ors).kind, too_deep);
}

#[test]
fn in_list_length_is_limited() {
    let list = |n: usize| {
        (0..n)
            .map(|i| format!("'{i}'"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let m = msg(&[("a", Value::from("7"))]);
    assert!(sel_matches(
        &format!("a IN ({})", list(IN_LIST_ITEMS_MAX)),
        &m
    ));
    assert_eq!(
        err(&format!("a IN ({})", list(IN_LIST_ITEMS_MAX + 1))).kind,
        SelectorErrorKind::InListTooLong {
            max: IN_LIST_ITEMS_MAX
        }
    );
}

#[test]
fn like_pattern_length_is_limited() {
    let m = msg(&[("a", Value::from("x".repeat(LIKE_PATTERN_CHARS_MAX)))]);
    let pattern = |n: usize| format!("a LIKE '{}'", "x".repeat(n));
    assert!(sel_matches(&pattern(LIKE_PATTERN_CHARS_MAX), &m));
    assert_eq!(
        err(&pattern(LIKE_PATTERN_CHARS_MAX + 1)).kind,
        SelectorErrorKind::LikePatternTooLong {
            chars: LIKE_PATTERN_CHARS_MAX + 1,
            max: LIKE_PATTERN_CHARS_MAX
        }
    );
}

// ---- nothing panics -----------------------------------------------------

/// Selector fragments to build random, mostly-near-valid selectors from.
const FRAGMENTS: &[&str] = &[
    "a",
    "b",
    "s",
    "JMSPriority",
    "JMSType",
    "JMSTimestamp",
    "JMSDeliveryMode",
    "missing",
    "=",
    "<>",
    "<",
    "<=",
    ">",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "(",
    ")",
    ",",
    "AND",
    "OR",
    "NOT",
    "BETWEEN",
    "IN",
    "LIKE",
    "ESCAPE",
    "IS",
    "NULL",
    "TRUE",
    "FALSE",
    "0",
    "1",
    "-1",
    "0x7FFFFFFFFFFFFFFF",
    "9223372036854775808",
    "1.5",
    "1e308",
    "0.0",
    "'x'",
    "'%x_'",
    "'!'",
    "''",
    "'",
    "!=",
    "09",
];

fn arb_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Long),
        any::<u64>().prop_map(Value::ULong),
        any::<i32>().prop_map(Value::Int),
        any::<f64>().prop_map(Value::Double),
        any::<f32>().prop_map(Value::Float),
        any::<char>().prop_map(Value::Char),
        "[x%_!a-c]{0,8}".prop_map(Value::String),
        any::<[u8; 16]>().prop_map(Value::Uuid),
    ]
}

fn arb_message() -> impl Strategy<Value = Message> {
    (
        proptest::collection::vec(("[abs]|missing", arb_value()), 0..4),
        any::<u8>(),
        any::<bool>(),
        proptest::option::of(any::<u64>()),
        proptest::option::of("[a-z]{0,3}"),
    )
        .prop_map(|(props, priority, durable, creation_time, subject)| {
            let mut m = Message::text("x");
            for (name, value) in props {
                m.properties.push(name, value);
            }
            m.priority = priority;
            m.durable = durable;
            m.creation_time = creation_time;
            m.subject = subject;
            m
        })
}

proptest! {
    #[test]
    fn random_text_never_panics_the_parser(text in "\\PC{0,64}") {
        let _ = Selector::parse(&text);
    }

    #[test]
    fn random_fragments_never_panic(
        parts in proptest::collection::vec(proptest::sample::select(FRAGMENTS), 0..24),
        message in arb_message(),
    ) {
        let text = parts.join(" ");
        if let Ok(selector) = Selector::parse(&text) {
            let yes = selector.matches(&message);
            // A selector and its negation never both match.
            if let Ok(not) = Selector::parse(&format!("NOT ({text})")) {
                prop_assert!(!(yes && not.matches(&message)), "{text}");
            }
        }
    }

    #[test]
    fn like_agrees_with_a_reference_matcher(
        pattern in "[ab%_]{0,8}",
        value in "[ab]{0,10}",
    ) {
        let selector = Selector::parse(&format!("v LIKE '{pattern}'")).expect("valid pattern");
        let m = msg(&[("v", Value::from(value.as_str()))]);
        let p: Vec<char> = pattern.chars().collect();
        let v: Vec<char> = value.chars().collect();
        prop_assert_eq!(selector.matches(&m), reference_like(&p, &v), "{} LIKE {}", value, pattern);
    }
}

/// The textbook recursive matcher, exponential but obviously right.
fn reference_like(p: &[char], v: &[char]) -> bool {
    match p.split_first() {
        None => v.is_empty(),
        Some(('%', rest)) => (0..=v.len()).any(|i| reference_like(rest, &v[i..])),
        Some(('_', rest)) => !v.is_empty() && reference_like(rest, &v[1..]),
        Some((c, rest)) => v.first() == Some(c) && reference_like(rest, &v[1..]),
    }
}
