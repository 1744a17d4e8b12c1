//! Recursive descent over the tokens, in JMS precedence order:
//!
//! ```text
//! selector   := or EOF
//! or         := and ( OR and )*
//! and        := not ( AND not )*
//! not        := NOT not | predicate
//! predicate  := sum [ ( = | <> | < | <= | > | >= ) sum
//!                   | [NOT] BETWEEN sum AND sum
//!                   | [NOT] IN ( string {, string} )      -- identifier on the left
//!                   | [NOT] LIKE string [ESCAPE string]   -- identifier on the left
//!                   | IS [NOT] NULL ]
//! sum        := product ( ( + | - ) product )*
//! product    := unary ( ( * | / ) unary )*
//! unary      := ( + | - ) unary | primary
//! primary    := literal | identifier | ( or )
//! ```
//!
//! Two counters keep the parser and the tree bounded: `nesting` (the
//! parser's own recursion through parentheses, `NOT` and signs) and the
//! depth returned with every subtree (left-leaning chains like `a+a+a` are
//! built in loops, but still deepen the tree the evaluator walks). Both stop
//! at [`EXPRESSION_DEPTH_MAX`].
//!
//! Static type checks follow Artemis: operands whose type can never fit
//! the operator (`'a' > 1`, `x = NULL`, `1 + TRUE`, `NOT 5`) are refused
//! here rather than silently never matching.

use super::ast::{ArithOp, CompareOp, Expr, Ident, Kind, Literal};
use super::error::{SelectorError, SelectorErrorKind};
use super::lexer::{Keyword, Token};
use super::like::LikePattern;
use super::{EXPRESSION_DEPTH_MAX, IN_LIST_ITEMS_MAX, LIKE_PATTERN_CHARS_MAX};

/// A subtree and its depth.
type Parsed = (Expr, usize);

pub(crate) struct Parser {
    tokens: Vec<(Token, usize)>,
    next: usize,
    /// Byte length of the text, the position of "end of selector".
    end: usize,
    nesting: usize,
}

fn boxed(e: Expr) -> Box<Expr> {
    Box::new(e)
}

impl Parser {
    pub(crate) fn new(tokens: Vec<(Token, usize)>, end: usize) -> Self {
        Self {
            tokens,
            next: 0,
            end,
            nesting: 0,
        }
    }

    /// The whole selector: one condition and nothing after it.
    pub(crate) fn selector(mut self) -> Result<Expr, SelectorError> {
        let start = self.position();
        let (expr, _) = self.or()?;
        if let Some((token, at)) = self.tokens.get(self.next) {
            return Err(SelectorError {
                position: *at,
                kind: SelectorErrorKind::Unexpected {
                    expected: "an operator or the end of the selector",
                    found: token.describe(),
                },
            });
        }
        self.condition(&expr, start)?;
        Ok(expr)
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.next).map(|(t, _)| t)
    }

    fn position(&self) -> usize {
        self.tokens.get(self.next).map_or(self.end, |(_, at)| *at)
    }

    fn eat(&mut self, token: &Token) -> bool {
        if self.peek() == Some(token) {
            self.next += 1;
            true
        } else {
            false
        }
    }

    fn eat_keyword(&mut self, k: Keyword) -> bool {
        self.eat(&Token::Keyword(k))
    }

    fn error(&self, kind: SelectorErrorKind) -> SelectorError {
        SelectorError {
            position: self.position(),
            kind,
        }
    }

    fn unexpected(&self, expected: &'static str) -> SelectorError {
        let found = self
            .peek()
            .map_or_else(|| "end of selector".to_owned(), Token::describe);
        self.error(SelectorErrorKind::Unexpected { expected, found })
    }

    fn expect(&mut self, token: &Token, expected: &'static str) -> Result<(), SelectorError> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(self.unexpected(expected))
        }
    }

    /// Fails when a node of `depth` would be too deep.
    fn check_depth(&self, depth: usize, at: usize) -> Result<usize, SelectorError> {
        if depth > EXPRESSION_DEPTH_MAX {
            return Err(SelectorError {
                position: at,
                kind: SelectorErrorKind::TooDeep {
                    max: EXPRESSION_DEPTH_MAX,
                },
            });
        }
        Ok(depth)
    }

    /// Runs `f` one recursion level deeper, refusing past the limit before
    /// the stack grows.
    fn nested<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, SelectorError>,
    ) -> Result<T, SelectorError> {
        self.nesting += 1;
        let at = self.position();
        self.check_depth(self.nesting, at)?;
        let result = f(self);
        self.nesting -= 1;
        result
    }

    fn type_error(at: usize, reason: &'static str) -> SelectorError {
        SelectorError {
            position: at,
            kind: SelectorErrorKind::Type(reason),
        }
    }

    /// An operand of `AND`, `OR`, `NOT` or the whole selector must be a
    /// condition or an identifier (a boolean property).
    fn condition(&self, e: &Expr, at: usize) -> Result<(), SelectorError> {
        match e.kind() {
            Kind::Bool | Kind::Any => Ok(()),
            _ => Err(Self::type_error(
                at,
                "expected a condition (a comparison, a boolean literal or a property)",
            )),
        }
    }

    /// An operand of arithmetic or ordering must be a number or an
    /// identifier.
    fn numeric(e: &Expr, at: usize) -> Result<(), SelectorError> {
        match e.kind() {
            Kind::Number | Kind::Any => Ok(()),
            _ => Err(Self::type_error(
                at,
                "arithmetic, <, <=, >, >= and BETWEEN take numbers only",
            )),
        }
    }

    fn or(&mut self) -> Result<Parsed, SelectorError> {
        self.logic_chain(Keyword::Or, Self::and, Expr::Or)
    }

    fn and(&mut self) -> Result<Parsed, SelectorError> {
        self.logic_chain(Keyword::And, Self::not, Expr::And)
    }

    /// `operand ( keyword operand )*`, left-associative, each side a
    /// condition.
    fn logic_chain(
        &mut self,
        keyword: Keyword,
        operand: fn(&mut Self) -> Result<Parsed, SelectorError>,
        build: fn(Box<Expr>, Box<Expr>) -> Expr,
    ) -> Result<Parsed, SelectorError> {
        let at = self.position();
        let (mut left, mut depth) = operand(self)?;
        while self.eat_keyword(keyword) {
            let right_at = self.position();
            let (right, d) = operand(self)?;
            self.condition(&left, at)?;
            self.condition(&right, right_at)?;
            depth = self.check_depth(depth.max(d) + 1, right_at)?;
            left = build(boxed(left), boxed(right));
        }
        Ok((left, depth))
    }

    fn not(&mut self) -> Result<Parsed, SelectorError> {
        if self.eat_keyword(Keyword::Not) {
            let at = self.position();
            let (inner, d) = self.nested(Self::not)?;
            self.condition(&inner, at)?;
            let depth = self.check_depth(d + 1, at)?;
            return Ok((Expr::Not(boxed(inner)), depth));
        }
        self.predicate()
    }

    fn predicate(&mut self) -> Result<Parsed, SelectorError> {
        let at = self.position();
        let (left, depth) = self.sum()?;
        let compare = match self.peek() {
            Some(Token::Eq) => Some(CompareOp::Eq),
            Some(Token::Ne) => Some(CompareOp::Ne),
            Some(Token::Lt) => Some(CompareOp::Lt),
            Some(Token::Le) => Some(CompareOp::Le),
            Some(Token::Gt) => Some(CompareOp::Gt),
            Some(Token::Ge) => Some(CompareOp::Ge),
            _ => None,
        };
        if let Some(op) = compare {
            self.next += 1;
            let right_at = self.position();
            let (right, d) = self.sum()?;
            Self::comparable(op, &left, at, &right, right_at)?;
            let depth = self.check_depth(depth.max(d) + 1, right_at)?;
            return Ok((Expr::Compare(op, boxed(left), boxed(right)), depth));
        }
        if self.eat_keyword(Keyword::Is) {
            let negated = self.eat_keyword(Keyword::Not);
            if !self.eat_keyword(Keyword::Null) {
                return Err(self.unexpected("NULL after IS [NOT]"));
            }
            let depth = self.check_depth(depth + 1, at)?;
            let value = boxed(left);
            return Ok((Expr::IsNull { value, negated }, depth));
        }
        let negated = self.peek() == Some(&Token::Keyword(Keyword::Not));
        let keyword_at = if negated { self.next + 1 } else { self.next };
        match self.tokens.get(keyword_at).map(|(t, _)| t) {
            Some(Token::Keyword(Keyword::Between)) => {
                self.next = keyword_at + 1;
                self.between(left, at, depth, negated)
            }
            Some(Token::Keyword(Keyword::In)) => {
                self.next = keyword_at + 1;
                let ident = Self::identifier_operand(left, at, "IN")?;
                self.in_list(ident, depth, negated)
            }
            Some(Token::Keyword(Keyword::Like)) => {
                self.next = keyword_at + 1;
                let ident = Self::identifier_operand(left, at, "LIKE")?;
                self.like(ident, depth, negated)
            }
            _ if negated => Err(self.unexpected_after_not(keyword_at)),
            _ => Ok((left, depth)),
        }
    }

    fn unexpected_after_not(&mut self, keyword_at: usize) -> SelectorError {
        self.next = keyword_at;
        self.unexpected("BETWEEN, IN or LIKE after NOT")
    }

    /// `IN` and `LIKE` test an identifier (JMS 2.0 §3.8.1.1).
    fn identifier_operand(left: Expr, at: usize, op: &'static str) -> Result<Ident, SelectorError> {
        match left {
            Expr::Ident(ident) => Ok(ident),
            _ => Err(Self::type_error(
                at,
                if op == "IN" {
                    "IN tests an identifier"
                } else {
                    "LIKE tests an identifier"
                },
            )),
        }
    }

    /// `=` and `<>` take any two operands of one type but never the `NULL`
    /// literal (`IS NULL` is the test for null); ordering takes numbers.
    fn comparable(
        op: CompareOp,
        left: &Expr,
        left_at: usize,
        right: &Expr,
        right_at: usize,
    ) -> Result<(), SelectorError> {
        if !op.is_equality() {
            Self::numeric(left, left_at)?;
            return Self::numeric(right, right_at);
        }
        for (e, at) in [(left, left_at), (right, right_at)] {
            if e.kind() == Kind::Null {
                return Err(Self::type_error(
                    at,
                    "NULL cannot be compared; use IS NULL or IS NOT NULL",
                ));
            }
        }
        match (left.kind(), right.kind()) {
            (Kind::Any, _) | (_, Kind::Any) => Ok(()),
            (l, r) if l == r => Ok(()),
            _ => Err(Self::type_error(
                right_at,
                "the two sides of = or <> have different types",
            )),
        }
    }

    fn between(
        &mut self,
        value: Expr,
        at: usize,
        depth: usize,
        negated: bool,
    ) -> Result<Parsed, SelectorError> {
        let low_at = self.position();
        let (low, low_depth) = self.sum()?;
        if !self.eat_keyword(Keyword::And) {
            return Err(self.unexpected("AND between the bounds of BETWEEN"));
        }
        let high_at = self.position();
        let (high, high_depth) = self.sum()?;
        Self::numeric(&value, at)?;
        Self::numeric(&low, low_at)?;
        Self::numeric(&high, high_at)?;
        let depth = self.check_depth(depth.max(low_depth).max(high_depth) + 1, high_at)?;
        let expr = Expr::Between {
            value: boxed(value),
            low: boxed(low),
            high: boxed(high),
            negated,
        };
        Ok((expr, depth))
    }

    fn string_literal(&mut self, expected: &'static str) -> Result<String, SelectorError> {
        match self.peek() {
            Some(Token::Str(s)) => {
                let s = s.clone();
                self.next += 1;
                Ok(s)
            }
            _ => Err(self.unexpected(expected)),
        }
    }

    fn in_list(
        &mut self,
        ident: Ident,
        depth: usize,
        negated: bool,
    ) -> Result<Parsed, SelectorError> {
        self.expect(&Token::LParen, "'(' after IN")?;
        let mut items = Vec::new();
        loop {
            if items.len() == IN_LIST_ITEMS_MAX {
                return Err(self.error(SelectorErrorKind::InListTooLong {
                    max: IN_LIST_ITEMS_MAX,
                }));
            }
            items.push(self.string_literal("a string literal in the IN list")?);
            if !self.eat(&Token::Comma) {
                break;
            }
        }
        self.expect(&Token::RParen, "',' or ')' in the IN list")?;
        items.sort_unstable();
        items.dedup();
        let expr = Expr::In {
            ident,
            items,
            negated,
        };
        Ok((expr, depth + 1))
    }

    fn like(&mut self, ident: Ident, depth: usize, negated: bool) -> Result<Parsed, SelectorError> {
        let pattern_at = self.position();
        let pattern = self.string_literal("a string literal pattern after LIKE")?;
        let chars = pattern.chars().count();
        if chars > LIKE_PATTERN_CHARS_MAX {
            return Err(SelectorError {
                position: pattern_at,
                kind: SelectorErrorKind::LikePatternTooLong {
                    chars,
                    max: LIKE_PATTERN_CHARS_MAX,
                },
            });
        }
        let mut escape = None;
        if self.eat_keyword(Keyword::Escape) {
            let escape_at = self.position();
            let text = self.string_literal("a one-character string after ESCAPE")?;
            let mut chars = text.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => escape = Some(c),
                _ => {
                    return Err(SelectorError {
                        position: escape_at,
                        kind: SelectorErrorKind::BadEscape("ESCAPE takes exactly one character"),
                    });
                }
            }
        }
        let pattern = LikePattern::compile(&pattern, escape).map_err(|kind| SelectorError {
            position: pattern_at,
            kind,
        })?;
        let expr = Expr::Like {
            ident,
            pattern,
            negated,
        };
        Ok((expr, depth + 1))
    }

    fn sum(&mut self) -> Result<Parsed, SelectorError> {
        self.arith_chain(Self::product, |t| match t {
            Token::Plus => Some(ArithOp::Add),
            Token::Minus => Some(ArithOp::Sub),
            _ => None,
        })
    }

    fn product(&mut self) -> Result<Parsed, SelectorError> {
        self.arith_chain(Self::unary, |t| match t {
            Token::Star => Some(ArithOp::Mul),
            Token::Slash => Some(ArithOp::Div),
            _ => None,
        })
    }

    /// `operand ( op operand )*`, left-associative, each side numeric.
    fn arith_chain(
        &mut self,
        operand: fn(&mut Self) -> Result<Parsed, SelectorError>,
        op_of: fn(&Token) -> Option<ArithOp>,
    ) -> Result<Parsed, SelectorError> {
        let at = self.position();
        let (mut left, mut depth) = operand(self)?;
        while let Some(op) = self.peek().and_then(op_of) {
            self.next += 1;
            let right_at = self.position();
            let (right, d) = operand(self)?;
            Self::numeric(&left, at)?;
            Self::numeric(&right, right_at)?;
            depth = self.check_depth(depth.max(d) + 1, right_at)?;
            left = Expr::Arith(op, boxed(left), boxed(right));
        }
        Ok((left, depth))
    }

    fn unary(&mut self) -> Result<Parsed, SelectorError> {
        let negate = match self.peek() {
            Some(Token::Minus) => true,
            Some(Token::Plus) => false,
            _ => return self.primary(),
        };
        let sign_at = self.position();
        self.next += 1;
        // `-9223372036854775808` is a long even though its magnitude is not.
        if negate {
            if let Some(Token::Exact(magnitude)) = self.peek() {
                let magnitude = *magnitude;
                self.next += 1;
                let value = 0i64
                    .checked_sub_unsigned(magnitude)
                    .ok_or_else(|| SelectorError {
                        position: sign_at,
                        kind: SelectorErrorKind::NumberOutOfRange(format!("-{magnitude}")),
                    })?;
                return Ok((Expr::Literal(Literal::Exact(value)), 1));
            }
        }
        let at = self.position();
        let (inner, d) = self.nested(Self::unary)?;
        Self::numeric(&inner, at)?;
        let depth = self.check_depth(d + 1, at)?;
        let expr = if negate {
            Expr::Negate(boxed(inner))
        } else {
            Expr::Plus(boxed(inner))
        };
        Ok((expr, depth))
    }

    fn primary(&mut self) -> Result<Parsed, SelectorError> {
        let at = self.position();
        let Some(token) = self.peek().cloned() else {
            return Err(self.unexpected("an identifier, a literal or '('"));
        };
        let expr = match token {
            Token::LParen => {
                self.next += 1;
                let (inner, depth) = self.nested(Self::or)?;
                self.expect(&Token::RParen, "')'")?;
                return Ok((inner, depth));
            }
            Token::Ident(name) => Expr::Ident(Ident::from_name(&name)),
            Token::Exact(magnitude) => match i64::try_from(magnitude) {
                Ok(v) => Expr::Literal(Literal::Exact(v)),
                Err(_) => {
                    return Err(SelectorError {
                        position: at,
                        kind: SelectorErrorKind::NumberOutOfRange(magnitude.to_string()),
                    });
                }
            },
            Token::Approx(v) => Expr::Literal(Literal::Approx(v)),
            Token::Str(s) => Expr::Literal(Literal::Str(s)),
            Token::Keyword(Keyword::True) => Expr::Literal(Literal::Bool(true)),
            Token::Keyword(Keyword::False) => Expr::Literal(Literal::Bool(false)),
            Token::Keyword(Keyword::Null) => Expr::Literal(Literal::Null),
            Token::Keyword(k) => {
                return Err(self.error(SelectorErrorKind::ReservedWord(k.name().to_owned())));
            }
            _ => return Err(self.unexpected("an identifier, a literal or '('")),
        };
        self.next += 1;
        Ok((expr, 1))
    }
}
