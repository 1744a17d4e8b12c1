//! Evaluates a parsed selector against one message, in SQL three-valued
//! logic: a condition is TRUE (`Some(true)`), FALSE (`Some(false)`) or
//! UNKNOWN (`None`), and a value may be NULL.
//!
//! The rules, from JMS 2.0 §3.8.1.2 where it speaks and Artemis where it
//! does not:
//! - a missing property or header, and a `Value::Null`, is NULL; comparing,
//!   testing or computing with NULL gives UNKNOWN/NULL (`IS NULL` excepted);
//! - numbers compare by value across types (Java numeric promotion); exact
//!   arithmetic is exact, an overflow or an integer division by zero is NULL;
//! - strings and booleans compare with `=` and `<>` only;
//! - "If the comparison of non-like type values is attempted, the value of
//!   the operation is false" (JMS): `'1' = 1`, `s < 'b'`, a `LIKE` or `IN`
//!   on a number are FALSE, and so are their `NOT` forms, which are one
//!   operation each;
//! - a property used as a condition is its boolean value, FALSE when it is
//!   not a boolean (Artemis' boolean cast), UNKNOWN when it is NULL.

use std::borrow::Cow;

use rosetta_neutral::{Message, Value};

use super::ast::{ArithOp, CompareOp, Expr, Header, Ident, Literal};

/// A selector value during evaluation.
#[derive(Debug, Clone, PartialEq)]
enum Val<'m> {
    Null,
    Bool(bool),
    /// Exact numeric; wide enough for every AMQP integer type, `ulong`
    /// included.
    Exact(i128),
    Approx(f64),
    Str(Cow<'m, str>),
    /// A type selectors cannot express (AMQP `uuid`, `binary`): not NULL,
    /// and equal to nothing.
    Opaque,
}

type Truth = Option<bool>;

fn truth_to_val(t: Truth) -> Val<'static> {
    t.map_or(Val::Null, Val::Bool)
}

/// Whether `expr` is TRUE for `message`.
pub(crate) fn matches(expr: &Expr, message: &Message) -> bool {
    truth(expr, message) == Some(true)
}

fn truth(expr: &Expr, m: &Message) -> Truth {
    match expr {
        Expr::Not(inner) => truth(inner, m).map(|t| !t),
        // Short-circuit: FALSE AND anything, TRUE OR anything.
        Expr::And(a, b) => match truth(a, m) {
            Some(false) => Some(false),
            left => and(left, truth(b, m)),
        },
        Expr::Or(a, b) => match truth(a, m) {
            Some(true) => Some(true),
            left => or(left, truth(b, m)),
        },
        Expr::Compare(op, a, b) => compare(*op, &value(a, m), &value(b, m)),
        Expr::Between {
            value: v,
            low,
            high,
            negated,
        } => {
            let v = value(v, m);
            let (low, high) = (value(low, m), value(high, m));
            if *negated {
                // JMS: "age NOT BETWEEN 15 AND 19" is "age < 15 OR age > 19".
                or(
                    compare(CompareOp::Lt, &v, &low),
                    compare(CompareOp::Gt, &v, &high),
                )
            } else {
                and(
                    compare(CompareOp::Ge, &v, &low),
                    compare(CompareOp::Le, &v, &high),
                )
            }
        }
        Expr::In {
            ident,
            items,
            negated,
        } => match identifier(ident, m) {
            Val::Null => None,
            Val::Str(s) => Some(items.binary_search_by(|i| i.as_str().cmp(&s)).is_ok() != *negated),
            _ => Some(false),
        },
        Expr::Like {
            ident,
            pattern,
            negated,
        } => match identifier(ident, m) {
            Val::Null => None,
            Val::Str(s) => Some(pattern.matches(&s) != *negated),
            _ => Some(false),
        },
        Expr::IsNull { value: v, negated } => Some((value(v, m) == Val::Null) != *negated),
        Expr::Literal(_) | Expr::Ident(_) | Expr::Arith(..) | Expr::Negate(_) | Expr::Plus(_) => {
            match value(expr, m) {
                Val::Null => None,
                Val::Bool(b) => Some(b),
                _ => Some(false),
            }
        }
    }
}

fn and(a: Truth, b: Truth) -> Truth {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn or(a: Truth, b: Truth) -> Truth {
    match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

fn value<'m>(expr: &'m Expr, m: &'m Message) -> Val<'m> {
    match expr {
        Expr::Literal(lit) => match lit {
            Literal::Null => Val::Null,
            Literal::Bool(b) => Val::Bool(*b),
            Literal::Exact(v) => Val::Exact(i128::from(*v)),
            Literal::Approx(v) => Val::Approx(*v),
            Literal::Str(s) => Val::Str(Cow::Borrowed(s)),
        },
        Expr::Ident(ident) => identifier(ident, m),
        Expr::Arith(op, a, b) => arith(*op, value(a, m), value(b, m)),
        Expr::Negate(inner) => match value(inner, m) {
            Val::Exact(v) => v.checked_neg().map_or(Val::Null, Val::Exact),
            Val::Approx(v) => Val::Approx(-v),
            _ => Val::Null,
        },
        Expr::Plus(inner) => match value(inner, m) {
            v @ (Val::Exact(_) | Val::Approx(_)) => v,
            _ => Val::Null,
        },
        _ => truth_to_val(truth(expr, m)),
    }
}

fn as_approx(v: &Val<'_>) -> Option<f64> {
    match v {
        // Java numeric promotion: long to double, rounding past 2^53.
        Val::Exact(x) => Some(*x as f64),
        Val::Approx(x) => Some(*x),
        _ => None,
    }
}

fn arith<'m>(op: ArithOp, a: Val<'m>, b: Val<'m>) -> Val<'m> {
    if let (Val::Exact(x), Val::Exact(y)) = (&a, &b) {
        let result = match op {
            ArithOp::Add => x.checked_add(*y),
            ArithOp::Sub => x.checked_sub(*y),
            ArithOp::Mul => x.checked_mul(*y),
            // Truncates toward zero, as Java's long division; `None` on /0.
            ArithOp::Div => x.checked_div(*y),
        };
        return result.map_or(Val::Null, Val::Exact);
    }
    match (as_approx(&a), as_approx(&b)) {
        (Some(x), Some(y)) => Val::Approx(match op {
            ArithOp::Add => x + y,
            ArithOp::Sub => x - y,
            ArithOp::Mul => x * y,
            ArithOp::Div => x / y,
        }),
        _ => Val::Null,
    }
}

fn compare(op: CompareOp, a: &Val<'_>, b: &Val<'_>) -> Truth {
    let ordering = match (a, b) {
        (Val::Null, _) | (_, Val::Null) => return None,
        (Val::Exact(x), Val::Exact(y)) => x.cmp(y),
        (Val::Str(x), Val::Str(y)) if op.is_equality() => x.cmp(y),
        (Val::Bool(x), Val::Bool(y)) if op.is_equality() => x.cmp(y),
        _ => match (as_approx(a), as_approx(b)) {
            (Some(x), Some(y)) => match x.partial_cmp(&y) {
                Some(o) => o,
                // NaN is unordered: only `<>` holds.
                None => return Some(op == CompareOp::Ne),
            },
            // Non-like types: FALSE.
            _ => return Some(false),
        },
    };
    Some(op.holds(ordering))
}

fn identifier<'m>(ident: &Ident, m: &'m Message) -> Val<'m> {
    match ident {
        Ident::Property(name) => m.properties.get(name).map_or(Val::Null, property),
        Ident::Header(header) => match header {
            Header::Priority => Val::Exact(i128::from(m.priority)),
            Header::MessageId => m
                .message_id
                .as_ref()
                .map_or(Val::Null, |id| Val::Str(Cow::Owned(id.to_text()))),
            Header::CorrelationId => m
                .correlation_id
                .as_ref()
                .map_or(Val::Null, |id| Val::Str(Cow::Owned(id.to_text()))),
            Header::Type => m
                .subject
                .as_deref()
                .map_or(Val::Null, |s| Val::Str(Cow::Borrowed(s))),
            Header::Timestamp => m
                .creation_time
                .map_or(Val::Null, |t| Val::Exact(i128::from(t))),
            Header::DeliveryMode => Val::Str(Cow::Borrowed(if m.durable {
                "PERSISTENT"
            } else {
                "NON_PERSISTENT"
            })),
        },
    }
}

fn property(v: &Value) -> Val<'_> {
    match v {
        Value::Null => Val::Null,
        Value::Bool(b) => Val::Bool(*b),
        Value::UByte(x) => Val::Exact(i128::from(*x)),
        Value::UShort(x) => Val::Exact(i128::from(*x)),
        Value::UInt(x) => Val::Exact(i128::from(*x)),
        Value::ULong(x) => Val::Exact(i128::from(*x)),
        Value::Byte(x) => Val::Exact(i128::from(*x)),
        Value::Short(x) => Val::Exact(i128::from(*x)),
        Value::Int(x) => Val::Exact(i128::from(*x)),
        Value::Long(x) | Value::Timestamp(x) => Val::Exact(i128::from(*x)),
        Value::Float(x) => Val::Approx(f64::from(*x)),
        Value::Double(x) => Val::Approx(*x),
        Value::Char(c) => Val::Str(Cow::Owned(c.to_string())),
        Value::String(s) | Value::Symbol(s) => Val::Str(Cow::Borrowed(s)),
        Value::Uuid(_) | Value::Binary(_) => Val::Opaque,
    }
}
