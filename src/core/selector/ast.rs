//! The parsed selector: an expression tree the evaluator walks.
//!
//! The parser guarantees the tree is at most
//! [`super::EXPRESSION_DEPTH_MAX`] deep, so the evaluator may recurse.

use super::like::LikePattern;

/// One node of a parsed selector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Literal(Literal),
    Ident(Ident),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Compare(CompareOp, Box<Expr>, Box<Expr>),
    Arith(ArithOp, Box<Expr>, Box<Expr>),
    /// Unary minus.
    Negate(Box<Expr>),
    /// Unary plus: the operand, when it is a number.
    Plus(Box<Expr>),
    Between {
        value: Box<Expr>,
        low: Box<Expr>,
        high: Box<Expr>,
        negated: bool,
    },
    In {
        ident: Ident,
        /// Sorted and deduplicated, for binary search.
        items: Vec<String>,
        negated: bool,
    },
    Like {
        ident: Ident,
        pattern: LikePattern,
        negated: bool,
    },
    IsNull {
        value: Box<Expr>,
        negated: bool,
    },
}

/// A literal value in the selector text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Literal {
    Null,
    Bool(bool),
    /// Exact numeric (Java `long`).
    Exact(i64),
    /// Approximate numeric (Java `double`; `F` literals widened from `float`).
    Approx(f64),
    Str(String),
}

/// What an identifier names: a JMS header or an application property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ident {
    Header(Header),
    Property(String),
}

/// The JMS headers a selector may name, each read from a field of the
/// neutral message (see the module docs for the mapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Header {
    Priority,
    MessageId,
    CorrelationId,
    Type,
    Timestamp,
    DeliveryMode,
}

impl Ident {
    /// The identifier for `name`: a header for the six JMS header names
    /// (case-sensitive, as JMS identifiers are), a property otherwise.
    pub(crate) fn from_name(name: &str) -> Self {
        let header = match name {
            "JMSPriority" => Header::Priority,
            "JMSMessageID" => Header::MessageId,
            "JMSCorrelationID" => Header::CorrelationId,
            "JMSType" => Header::Type,
            "JMSTimestamp" => Header::Timestamp,
            "JMSDeliveryMode" => Header::DeliveryMode,
            _ => return Ident::Property(name.to_owned()),
        };
        Ident::Header(header)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    /// True for `=` and `<>`, the only comparisons of strings and booleans.
    pub(crate) fn is_equality(self) -> bool {
        matches!(self, CompareOp::Eq | CompareOp::Ne)
    }

    /// Whether an ordering between two operands satisfies the operator.
    pub(crate) fn holds(self, ordering: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::{Equal, Greater, Less};
        match self {
            CompareOp::Eq => ordering == Equal,
            CompareOp::Ne => ordering != Equal,
            CompareOp::Lt => ordering == Less,
            CompareOp::Le => ordering != Greater,
            CompareOp::Gt => ordering == Greater,
            CompareOp::Ge => ordering != Less,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// The static type of an expression, for the checks JMS and Artemis make
/// at parse time (`'a' > 1` and `1 + TRUE` are refused, not evaluated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Bool,
    Number,
    Str,
    Null,
    /// An identifier: its type is known only per message.
    Any,
}

impl Expr {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Expr::Literal(Literal::Null) => Kind::Null,
            Expr::Literal(Literal::Bool(_)) => Kind::Bool,
            Expr::Literal(Literal::Exact(_) | Literal::Approx(_)) => Kind::Number,
            Expr::Literal(Literal::Str(_)) => Kind::Str,
            Expr::Ident(_) => Kind::Any,
            Expr::Arith(..) | Expr::Negate(_) | Expr::Plus(_) => Kind::Number,
            Expr::Not(_)
            | Expr::And(..)
            | Expr::Or(..)
            | Expr::Compare(..)
            | Expr::Between { .. }
            | Expr::In { .. }
            | Expr::Like { .. }
            | Expr::IsNull { .. } => Kind::Bool,
        }
    }
}
