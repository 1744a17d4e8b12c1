//! JMS message selectors: the SQL-92 subset of JMS 2.0 §3.8.1, parsed once
//! and evaluated against each [`Message`].
//!
//! ```
//! use rosetta_core::selector::Selector;
//! use rosetta_neutral::Message;
//!
//! let selector = Selector::parse("colour = 'green' AND JMSPriority > 3").unwrap();
//! let mut m = Message::text("hello");
//! m.properties.push("colour", "green");
//! assert!(selector.matches(&m));
//! ```
//!
//! ## What is supported
//! - Conditions: `AND`, `OR`, `NOT`; `=`, `<>`, `<`, `<=`, `>`, `>=`;
//!   `[NOT] BETWEEN a AND b`; `ident [NOT] IN ('a', 'b')` (string literals);
//!   `ident [NOT] LIKE 'pattern' [ESCAPE 'c']` (`%` any run, `_` any one
//!   character); `expr IS [NOT] NULL`; parentheses.
//! - Arithmetic: unary `+`/`-`, then `*` `/`, then `+` `-`, left to right.
//! - Literals: strings `'it''s'`; exact numerics `57`, `57L`, hexadecimal
//!   `0x1F`, octal `017` (Java `long` range); approximate numerics `7.`,
//!   `.5`, `7E3`, `1.5F`, `2D` (Java `double`; a `F` literal is rounded to
//!   `float` first, as Java does); `TRUE`, `FALSE`, `NULL`.
//! - Keywords in any case; identifiers are case-sensitive, start with a
//!   letter, `_` or `$` and go on with those and digits (Unicode letters and
//!   digits, close to Java's identifier rules); reserved words (`NOT AND OR
//!   BETWEEN LIKE ESCAPE IN IS NULL TRUE FALSE`) cannot be identifiers.
//! - An empty (or all-whitespace) selector is no selector: it matches every
//!   message (JMS 2.0 §3.8.1.1).
//!
//! ## Semantics
//! SQL three-valued logic: a message matches only when the selector is
//! TRUE; a missing property, a NULL value, and anything computed from them
//! is UNKNOWN. Numbers of any type compare by value; strings and booleans
//! only with `=` and `<>`; comparing values of different types is FALSE (as
//! JMS 2.0 §3.8.1.2 says); integer overflow and integer division by zero
//! are NULL. The full rules are in `eval.rs`.
//!
//! ## Identifiers
//! These header names read fields of the neutral message; every other
//! identifier is an application property (`Message::properties`, first
//! value of that name):
//!
//! | identifier | neutral field | value |
//! |---|---|---|
//! | `JMSPriority` | `priority` | number 0–9 |
//! | `JMSMessageID` | `message_id` | string (`MessageId::to_text`), NULL if unset |
//! | `JMSCorrelationID` | `correlation_id` | string (`MessageId::to_text`), NULL if unset |
//! | `JMSType` | `subject` | string, NULL if unset |
//! | `JMSTimestamp` | `creation_time` | number (ms since epoch), NULL if unset |
//! | `JMSDeliveryMode` | `durable` | `'PERSISTENT'` or `'NON_PERSISTENT'` |
//!
//! Artemis rewrites these names to its own (`AMQPriority`, `AMQUserID`,
//! `AMQTimestamp`, `AMQDurable` with `'DURABLE'`/`'NON_DURABLE'`) and, for
//! AMQP messages, reads `JMSType` from the `x-opt-jms-type` message
//! annotation that Qpid JMS writes. Rosetta keeps message annotations as
//! opaque bytes, so `JMSType` reads the AMQP `subject`, the field the AMQP
//! JMS mapping used before that annotation (and what a STOMP or MQTT
//! publisher can set). AMQP `uuid` and `binary` property values are never
//! NULL and never equal anything; `char` values are one-character strings.
//!
//! ## Limits
//! [`SELECTOR_BYTES_MAX`], [`EXPRESSION_DEPTH_MAX`] (enforced while parsing,
//! so no input can exhaust the stack), [`IN_LIST_ITEMS_MAX`] and
//! [`LIKE_PATTERN_CHARS_MAX`]. `LIKE` is compiled to a matcher that never
//! backtracks: its cost is at most the value length times the pattern
//! length (`like.rs`).
//!
//! ## Where Rosetta differs from Artemis
//! - Precedence is the JMS one: `NOT a = b` is `NOT (a = b)`. Artemis
//!   parses `NOT` as a unary operator binding tighter than `=`.
//! - Comparing different types is FALSE for every operator, `<>`, `NOT
//!   LIKE` and `NOT IN` included (JMS). Artemis evaluates `<>` as `NOT =`,
//!   so `'1' <> 1` is TRUE there, and gives UNKNOWN for `IN` on a number.
//! - Strings do not order: `s < 'b'` is FALSE (JMS). Artemis compares them.
//! - No `%` (modulo), `--` and `/* */` comments, `XPATH`/`XQUERY`, or
//!   hyphenated identifiers: Artemis extensions JMS does not have.
//! - `LIKE` and `IN` take an identifier on the left, as the JMS grammar
//!   says; Artemis also allows `LIKE` on other expressions.
//! - Exact arithmetic is exact (128-bit) and NULL when even that
//!   overflows, rather than wrapping around at 64 bits as Java's `long`
//!   does.
//! - Artemis sets no length, depth, `IN` or pattern limits.

mod ast;
mod error;
mod eval;
mod lexer;
mod like;
mod parser;

use rosetta_neutral::Message;

pub use error::{SelectorError, SelectorErrorKind};

/// Longest selector accepted, in bytes. Real selectors are a line or two;
/// 4 KiB leaves room for long `IN` lists while capping the parse work and
/// the memory one consumer's selector holds for its lifetime.
pub const SELECTOR_BYTES_MAX: usize = 4096;
/// Deepest expression accepted (parentheses, `NOT`s, signs and operator
/// chains all count). Enforced while parsing, so that the recursive parser
/// and evaluator stay far from the thread's stack limit.
pub const EXPRESSION_DEPTH_MAX: usize = 64;
/// Most strings in one `IN` list: more than any hand-written selector has,
/// and each list is searched by bisection.
pub const IN_LIST_ITEMS_MAX: usize = 256;
/// Longest `LIKE` pattern, in characters: matching costs up to this many
/// comparisons per character of the value.
pub const LIKE_PATTERN_CHARS_MAX: usize = 256;

/// A parsed JMS message selector.
#[derive(Debug, Clone)]
pub struct Selector {
    /// The selector as given, for logs and for handing back to a client.
    text: String,
    /// `None` for an empty selector, which matches everything.
    expr: Option<ast::Expr>,
}

impl Selector {
    /// Parses `text`, or says where and why it is not a valid selector.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        if text.len() > SELECTOR_BYTES_MAX {
            return Err(SelectorError {
                position: SELECTOR_BYTES_MAX,
                kind: SelectorErrorKind::TooLong {
                    bytes: text.len(),
                    max: SELECTOR_BYTES_MAX,
                },
            });
        }
        let tokens = lexer::tokenize(text)?;
        let expr = if tokens.is_empty() {
            None
        } else {
            Some(parser::Parser::new(tokens, text.len()).selector()?)
        };
        Ok(Self {
            text: text.to_owned(),
            expr,
        })
    }

    /// Whether the selector is TRUE for `message` (FALSE and UNKNOWN do
    /// not match).
    pub fn matches(&self, message: &Message) -> bool {
        self.expr
            .as_ref()
            .is_none_or(|expr| eval::matches(expr, message))
    }

    /// True for the empty selector, which matches every message.
    pub fn is_empty(&self) -> bool {
        self.expr.is_none()
    }

    /// The selector text as given to [`Selector::parse`].
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests;
