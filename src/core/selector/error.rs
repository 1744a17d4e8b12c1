//! Why a selector was refused, and where.
//!
//! The `Display` form ("invalid selector at byte 7: expected ')', found end
//! of selector") is meant to go verbatim into an AMQP `amqp:invalid-field`
//! description or a STOMP ERROR `message` header.

/// A selector that cannot be used: a syntax error, a static type error
/// (`'a' > 1`) or a limit exceeded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid selector at byte {position}: {kind}")]
pub struct SelectorError {
    /// Byte offset into the selector text where the problem starts.
    pub position: usize,
    /// What is wrong.
    pub kind: SelectorErrorKind,
}

/// What is wrong with a selector, grouped as malformed text, misused types
/// and limits.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectorErrorKind {
    /// A character that starts no token (`!`, `"`, `#`, ...).
    #[error("unexpected character {0:?}")]
    UnexpectedCharacter(char),
    /// An operator JMS does not have, such as `!=` or `==`.
    #[error("unknown operator '{0}' (JMS writes not-equal as '<>' and equality as '=')")]
    UnknownOperator(String),
    /// A string literal without its closing quote.
    #[error("string literal is not closed with a quote")]
    UnterminatedString,
    /// A numeric literal that is not Java literal syntax (`09`, `1e`, `12ab`).
    #[error("malformed numeric literal '{0}'")]
    MalformedNumber(String),
    /// A numeric literal outside Java `long` or `double` range.
    #[error("numeric literal '{0}' is out of range")]
    NumberOutOfRange(String),
    /// A token where another was required.
    #[error("expected {expected}, found {found}")]
    Unexpected {
        /// What the grammar allows here.
        expected: &'static str,
        /// What the selector has instead.
        found: String,
    },
    /// `NULL`, `TRUE`, `FALSE` or an operator keyword where an identifier
    /// was required.
    #[error("'{0}' is a reserved word and cannot name a property")]
    ReservedWord(String),
    /// An `ESCAPE` literal that is not one character, or a `LIKE` pattern
    /// that ends with its escape character.
    #[error("{0}")]
    BadEscape(&'static str),
    /// An operand whose type the operator never accepts (`'a' > 1`,
    /// `x = NULL`, `1 + TRUE`, a selector that is not a condition).
    #[error("type error: {0}")]
    Type(&'static str),
    /// The selector text is longer than [`super::SELECTOR_BYTES_MAX`].
    #[error("selector is {bytes} bytes, more than the {max} allowed")]
    TooLong {
        /// Length of the selector.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The expression nests deeper than [`super::EXPRESSION_DEPTH_MAX`].
    #[error("expression nests deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// An `IN` list longer than [`super::IN_LIST_ITEMS_MAX`].
    #[error("IN list has more than {max} items")]
    InListTooLong {
        /// The limit.
        max: usize,
    },
    /// A `LIKE` pattern longer than [`super::LIKE_PATTERN_CHARS_MAX`].
    #[error("LIKE pattern is {chars} characters, more than the {max} allowed")]
    LikePatternTooLong {
        /// Length of the pattern.
        chars: usize,
        /// The limit.
        max: usize,
    },
}
