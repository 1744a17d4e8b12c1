//! `LIKE` patterns, compiled once to a matcher without backtracking.
//!
//! A pattern is split at its `%` wildcards into segments of literal
//! characters and `_` (any one character). The first segment must match at
//! the start, the last at the end, and each one between at its leftmost
//! place after the previous: with only `%` able to stretch, the leftmost
//! place is always as good as any later one, so nothing is ever retried.
//! Matching costs at most (value length × pattern length) character
//! comparisons, and the pattern length is capped by
//! [`super::LIKE_PATTERN_CHARS_MAX`]. Artemis and ActiveMQ translate the
//! pattern to a `java.util.regex` with `.*?`, which backtracks.

use super::error::SelectorErrorKind;

/// One pattern position: a literal character or `_`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Char(char),
    AnyOne,
}

/// A compiled `LIKE` pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LikePattern {
    /// The pieces between `%`s. One segment means the pattern has no `%`.
    segments: Vec<Vec<Unit>>,
}

impl LikePattern {
    /// Compiles `pattern`, where `escape` (if any) makes the next `%`, `_`
    /// or escape character literal.
    pub(crate) fn compile(pattern: &str, escape: Option<char>) -> Result<Self, SelectorErrorKind> {
        let mut segments = vec![Vec::new()];
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            let unit = if Some(c) == escape {
                match chars.next() {
                    Some(escaped) => Unit::Char(escaped),
                    None => {
                        return Err(SelectorErrorKind::BadEscape(
                            "LIKE pattern ends with its escape character",
                        ));
                    }
                }
            } else if c == '%' {
                // `%%` is one `%`: consecutive wildcards add nothing.
                if segments.last().is_some_and(|s| !s.is_empty()) || segments.len() == 1 {
                    segments.push(Vec::new());
                }
                continue;
            } else if c == '_' {
                Unit::AnyOne
            } else {
                Unit::Char(c)
            };
            if let Some(last) = segments.last_mut() {
                last.push(unit);
            }
        }
        Ok(Self { segments })
    }

    /// Whether the whole of `value` matches the pattern.
    pub(crate) fn matches(&self, value: &str) -> bool {
        let text: Vec<char> = value.chars().collect();
        let Some((first, rest)) = self.segments.split_first() else {
            return text.is_empty();
        };
        let Some((last, middle)) = rest.split_last() else {
            // No `%`: the one segment must be the whole value.
            return text.len() == first.len() && segment_at(first, &text, 0);
        };
        if text.len() < first.len() + last.len() {
            return false;
        }
        let tail_start = text.len() - last.len();
        if !segment_at(first, &text, 0) || !segment_at(last, &text, tail_start) {
            return false;
        }
        let mut pos = first.len();
        for segment in middle {
            match find_segment(segment, &text[..tail_start], pos) {
                Some(found) => pos = found + segment.len(),
                None => return false,
            }
        }
        true
    }
}

/// Whether `segment` matches `text` at `start` (the caller checked that it
/// fits).
fn segment_at(segment: &[Unit], text: &[char], start: usize) -> bool {
    text.get(start..start + segment.len())
        .is_some_and(|window| {
            window.iter().zip(segment).all(|(c, unit)| match unit {
                Unit::AnyOne => true,
                Unit::Char(p) => p == c,
            })
        })
}

/// The leftmost place at or after `from` where `segment` matches in `text`.
fn find_segment(segment: &[Unit], text: &[char], from: usize) -> Option<usize> {
    let last_start = text.len().checked_sub(segment.len())?;
    (from..=last_start).find(|&start| segment_at(segment, text, start))
}
