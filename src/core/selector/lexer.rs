//! Splits selector text into tokens, each with its byte offset.
//!
//! The literal forms are nom combinators, written to the Java literal
//! syntax JMS names: exact numerics `57`, `57L`, `0x1F`, `017`; approximate
//! numerics `7.`, `.5`, `7E3`, `-57.9E2`, `1.5F`, `2D`; strings `'it''s'`.
//! Whitespace is Java's (space, tab, form feed, line terminators).

use nom::branch::alt;
use nom::bytes::complete::take_while;
use nom::character::complete::{char, digit1, hex_digit1, one_of, satisfy};
use nom::combinator::{opt, recognize};
use nom::{IResult, Parser};

use super::error::{SelectorError, SelectorErrorKind};

/// One token of a selector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Token {
    /// An identifier as written (case kept: identifiers are case-sensitive).
    Ident(String),
    /// A reserved word, matched without regard to case.
    Keyword(Keyword),
    /// An exact numeric literal's magnitude; at most 2^63, so that the
    /// parser can fold `-9223372036854775808`.
    Exact(u64),
    /// An approximate numeric literal.
    Approx(f64),
    Str(String),
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Plus,
    Minus,
    Star,
    Slash,
    LParen,
    RParen,
    Comma,
}

/// The reserved words of JMS 2.0 §3.8.1.1. None can be an identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keyword {
    Not,
    And,
    Or,
    Between,
    Like,
    Escape,
    In,
    Is,
    Null,
    True,
    False,
}

impl Keyword {
    fn from_word(word: &str) -> Option<Self> {
        const WORDS: [(&str, Keyword); 11] = [
            ("NOT", Keyword::Not),
            ("AND", Keyword::And),
            ("OR", Keyword::Or),
            ("BETWEEN", Keyword::Between),
            ("LIKE", Keyword::Like),
            ("ESCAPE", Keyword::Escape),
            ("IN", Keyword::In),
            ("IS", Keyword::Is),
            ("NULL", Keyword::Null),
            ("TRUE", Keyword::True),
            ("FALSE", Keyword::False),
        ];
        WORDS
            .iter()
            .find(|(w, _)| w.eq_ignore_ascii_case(word))
            .map(|(_, k)| *k)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Keyword::Not => "NOT",
            Keyword::And => "AND",
            Keyword::Or => "OR",
            Keyword::Between => "BETWEEN",
            Keyword::Like => "LIKE",
            Keyword::Escape => "ESCAPE",
            Keyword::In => "IN",
            Keyword::Is => "IS",
            Keyword::Null => "NULL",
            Keyword::True => "TRUE",
            Keyword::False => "FALSE",
        }
    }
}

impl Token {
    /// How an error message names the token.
    pub(crate) fn describe(&self) -> String {
        match self {
            Token::Ident(name) => format!("identifier '{name}'"),
            Token::Keyword(k) => format!("'{}'", k.name()),
            Token::Exact(v) => format!("number {v}"),
            Token::Approx(v) => format!("number {v}"),
            Token::Str(s) => format!("string '{s}'"),
            Token::Eq => "'='".into(),
            Token::Ne => "'<>'".into(),
            Token::Lt => "'<'".into(),
            Token::Le => "'<='".into(),
            Token::Gt => "'>'".into(),
            Token::Ge => "'>='".into(),
            Token::Plus => "'+'".into(),
            Token::Minus => "'-'".into(),
            Token::Star => "'*'".into(),
            Token::Slash => "'/'".into(),
            Token::LParen => "'('".into(),
            Token::RParen => "')'".into(),
            Token::Comma => "','".into(),
        }
    }
}

/// Java's `Character.isJavaIdentifierStart`, near enough: letters
/// (including letter numbers), `_` and `$`.
fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_' || c == '$'
}

/// Java's `Character.isJavaIdentifierPart`, near enough: a start character
/// or a digit.
fn is_ident_part(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

fn is_java_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c')
}

/// The tokens of `text` with their byte offsets.
pub(crate) fn tokenize(text: &str) -> Result<Vec<(Token, usize)>, SelectorError> {
    let mut tokens = Vec::new();
    let mut pos = 0;
    while let Some(c) = text[pos..].chars().next() {
        if is_java_whitespace(c) {
            pos += c.len_utf8();
            continue;
        }
        let rest = &text[pos..];
        let at = |kind| SelectorError {
            position: pos,
            kind,
        };
        let (token, len) = match c {
            '\'' => string_literal(rest).map_err(at)?,
            '0'..='9' | '.' => number(rest).map_err(at)?,
            c if is_ident_start(c) => word(rest),
            _ => operator(rest).map_err(at)?,
        };
        tokens.push((token, pos));
        pos += len;
    }
    Ok(tokens)
}

/// A single-quoted string with `''` for a quote; the token and the bytes
/// it spans.
fn string_literal(rest: &str) -> Result<(Token, usize), SelectorErrorKind> {
    let mut value = String::new();
    let mut chars = rest.char_indices().skip(1).peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\'' {
            if chars.peek().is_some_and(|&(_, next)| next == '\'') {
                chars.next();
                value.push('\'');
                continue;
            }
            return Ok((Token::Str(value), i + 1));
        }
        value.push(c);
    }
    Err(SelectorErrorKind::UnterminatedString)
}

fn identifier(i: &str) -> Res<'_> {
    recognize((satisfy(is_ident_start), take_while(is_ident_part))).parse(i)
}

/// An identifier or keyword; `rest` starts with an identifier character.
fn word(rest: &str) -> (Token, usize) {
    let word = identifier(rest).map_or(rest, |(_, w)| w);
    let len = word.len();
    let token = match Keyword::from_word(word) {
        Some(k) => Token::Keyword(k),
        None => Token::Ident(word.to_owned()),
    };
    (token, len)
}

fn operator(rest: &str) -> Result<(Token, usize), SelectorErrorKind> {
    const OPERATORS: [(&str, Token); 13] = [
        ("<>", Token::Ne),
        ("<=", Token::Le),
        (">=", Token::Ge),
        ("=", Token::Eq),
        ("<", Token::Lt),
        (">", Token::Gt),
        ("+", Token::Plus),
        ("-", Token::Minus),
        ("*", Token::Star),
        ("/", Token::Slash),
        ("(", Token::LParen),
        (")", Token::RParen),
        (",", Token::Comma),
    ];
    for foreign in ["!=", "==", "&&", "||"] {
        if rest.starts_with(foreign) {
            return Err(SelectorErrorKind::UnknownOperator(foreign.to_owned()));
        }
    }
    for (text, token) in OPERATORS {
        if rest.starts_with(text) {
            return Ok((token, text.len()));
        }
    }
    let c = rest.chars().next().unwrap_or(' ');
    Err(SelectorErrorKind::UnexpectedCharacter(c))
}

type Res<'a> = IResult<&'a str, &'a str>;

fn exponent(i: &str) -> Res<'_> {
    recognize((one_of("eE"), opt(one_of("+-")), digit1)).parse(i)
}

/// Java floating-point literal syntax (decimal forms).
fn approx_literal(i: &str) -> Res<'_> {
    let suffix = || opt(one_of("fFdD"));
    alt((
        recognize((digit1, char('.'), opt(digit1), opt(exponent), suffix())),
        recognize((char('.'), digit1, opt(exponent), suffix())),
        recognize((digit1, exponent, suffix())),
        recognize((digit1, one_of("fFdD"))),
    ))
    .parse(i)
}

fn hex_literal(i: &str) -> Res<'_> {
    recognize((char('0'), one_of("xX"), hex_digit1, opt(one_of("lL")))).parse(i)
}

fn integer_literal(i: &str) -> Res<'_> {
    recognize((digit1, opt(one_of("lL")))).parse(i)
}

/// The largest exact magnitude a literal may have: `-2^63` is a `long`.
const EXACT_MAGNITUDE_MAX: u64 = 1 << 63;

fn number(rest: &str) -> Result<(Token, usize), SelectorErrorKind> {
    let malformed = |len: usize| {
        let end = rest[len..]
            .char_indices()
            .find(|&(_, c)| !is_ident_part(c) && c != '.')
            .map_or(rest.len(), |(i, _)| len + i);
        SelectorErrorKind::MalformedNumber(rest[..end].to_owned())
    };
    let (token, text) = if let Ok((_, text)) = approx_literal(rest) {
        (approx_value(text)?, text)
    } else if let Ok((_, text)) = hex_literal(rest) {
        let digits = text[2..].trim_end_matches(['l', 'L']);
        (exact_value(digits, 16, text)?, text)
    } else if let Ok((_, text)) = integer_literal(rest) {
        let digits = text.trim_end_matches(['l', 'L']);
        if digits.len() > 1 && digits.starts_with('0') {
            if !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                return Err(malformed(text.len()));
            }
            (exact_value(&digits[1..], 8, text)?, text)
        } else {
            (exact_value(digits, 10, text)?, text)
        }
    } else {
        return Err(malformed(0));
    };
    // `12abc`, `0x1G`, `1.5.5`: a literal runs into more word characters.
    if rest[text.len()..]
        .chars()
        .next()
        .is_some_and(|c| is_ident_part(c) || c == '.')
    {
        return Err(malformed(text.len()));
    }
    Ok((token, text.len()))
}

fn exact_value(digits: &str, radix: u32, text: &str) -> Result<Token, SelectorErrorKind> {
    match u64::from_str_radix(digits, radix) {
        Ok(v) if v <= EXACT_MAGNITUDE_MAX => Ok(Token::Exact(v)),
        _ => Err(SelectorErrorKind::NumberOutOfRange(text.to_owned())),
    }
}

fn approx_value(text: &str) -> Result<Token, SelectorErrorKind> {
    let out_of_range = || SelectorErrorKind::NumberOutOfRange(text.to_owned());
    let malformed = || SelectorErrorKind::MalformedNumber(text.to_owned());
    let value = if let Some(body) = text.strip_suffix(['f', 'F']) {
        // A Java `float` literal: rounded to `float`, then widened, as Java's
        // numeric promotion does when it meets a `double`.
        let v: f32 = body.parse().map_err(|_| malformed())?;
        if v.is_infinite() {
            return Err(out_of_range());
        }
        f64::from(v)
    } else {
        let body = text.trim_end_matches(['d', 'D']);
        let v: f64 = body.parse().map_err(|_| malformed())?;
        if v.is_infinite() {
            return Err(out_of_range());
        }
        v
    };
    Ok(Token::Approx(value))
}
