//! Maps between positions in a TOML document and dotted key paths, so every
//! configuration error can name both the key and the line.
//!
//! Key paths look like `store.sync` or `bindings[1].filter`.

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// The innermost key path whose key or value covers byte offset `pos`.
/// `None` if the document does not parse or nothing covers `pos`.
pub fn key_at(doc: &str, pos: usize) -> Option<String> {
    let root = DeTable::parse(doc).ok()?;
    let mut best: Option<(String, usize)> = None;
    walk_table(root.get_ref(), "", pos, &mut best);
    best.map(|(path, _)| path)
}

fn consider(best: &mut Option<(String, usize)>, path: &str, span: Range<usize>, pos: usize) {
    // An empty span (end of input) covers its own start.
    let covers = span.contains(&pos) || (span.is_empty() && span.start == pos);
    if !covers {
        return;
    }
    let len = span.len();
    if best.as_ref().is_none_or(|(_, best_len)| len < *best_len) {
        *best = Some((path.to_owned(), len));
    }
}

fn walk_table(table: &DeTable<'_>, prefix: &str, pos: usize, best: &mut Option<(String, usize)>) {
    for (key, value) in table.iter() {
        let path = if prefix.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{prefix}.{}", key.get_ref())
        };
        consider(best, &path, key.span(), pos);
        walk_value(value, &path, pos, best);
    }
}

fn walk_value(
    value: &Spanned<DeValue<'_>>,
    path: &str,
    pos: usize,
    best: &mut Option<(String, usize)>,
) {
    consider(best, path, value.span(), pos);
    match value.get_ref() {
        DeValue::Table(t) => walk_table(t, path, pos, best),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk_value(item, &format!("{path}[{i}]"), pos, best);
            }
        }
        _ => {}
    }
}

/// One step of a key path.
enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

fn segments(path: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !name.is_empty() {
            out.push(Segment::Key(name));
        }
        while let Some(inner) = rest.strip_prefix('[') {
            let Some((index, after)) = inner.split_once(']') else {
                break;
            };
            if let Ok(i) = index.parse() {
                out.push(Segment::Index(i));
            }
            rest = after;
        }
    }
    out
}

/// The span of `path` in `doc`, or of its deepest ancestor that the
/// document spells out (a key absent from the file is blamed on its
/// section). `None` if not even the first segment is in the document.
pub fn span_of(doc: &str, path: &str) -> Option<Range<usize>> {
    let root = DeTable::parse(doc).ok()?;
    let mut table: Option<&DeTable<'_>> = Some(root.get_ref());
    let mut array: Option<&[Spanned<DeValue<'_>>]> = None;
    let mut found = None;
    for segment in segments(path) {
        let value = match (segment, table, array) {
            (Segment::Key(k), Some(t), _) => match t.iter().find(|(key, _)| key.get_ref() == k) {
                Some((key, value)) => {
                    found = Some(key.span());
                    value
                }
                None => break,
            },
            (Segment::Index(i), _, Some(items)) => match items.get(i) {
                Some(item) => {
                    found = Some(item.span());
                    item
                }
                None => break,
            },
            _ => break,
        };
        table = None;
        array = None;
        match value.get_ref() {
            DeValue::Table(t) => table = Some(t),
            DeValue::Array(items) => array = Some(items),
            _ => {}
        }
    }
    found
}

/// 1-based line and column (in characters) of byte offset `pos`.
pub fn line_col(doc: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(doc.len());
    // Step back to a char boundary so slicing cannot panic.
    let pos = (0..=pos)
        .rev()
        .find(|&p| doc.is_char_boundary(p))
        .unwrap_or(0);
    let before = &doc[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = doc[line_start..pos].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "data_dir = \"x\"\n\n[store]\nsync = \"periodic\"\n\n[[bindings]]\nqueue = \"a\"\nfilter = \"b\"\n\n[[bindings]]\nqueue = \"c\"\nfilter = \"d/#\"\n";

    #[test]
    fn positions_map_to_keys() {
        let at = |needle: &str| key_at(DOC, DOC.find(needle).expect(needle));
        assert_eq!(at("\"x\"").as_deref(), Some("data_dir"));
        assert_eq!(at("sync").as_deref(), Some("store.sync"));
        assert_eq!(at("\"periodic\"").as_deref(), Some("store.sync"));
        assert_eq!(at("\"d/#\"").as_deref(), Some("bindings[1].filter"));
        assert_eq!(at("queue = \"a\"").as_deref(), Some("bindings[0].queue"));
    }

    #[test]
    fn keys_map_to_lines() {
        let line = |key: &str| span_of(DOC, key).map(|s| line_col(DOC, s.start).0);
        assert_eq!(line("data_dir"), Some(1));
        assert_eq!(line("store.sync"), Some(4));
        assert_eq!(
            line("store.segment_size_bytes"),
            Some(3),
            "absent key: its section"
        );
        assert_eq!(line("bindings[1].filter"), Some(12));
        assert_eq!(line("tls.cert_file"), None);
    }

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("é\nx", 1), (1, 1), "inside a char: its start");
        assert_eq!(line_col("ab", 99), (1, 3));
    }
}
