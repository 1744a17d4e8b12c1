//! Topic-filter trie: finds every filter matching a topic name without
//! scanning all subscriptions.
//!
//! Each level of a filter is one edge. `+` and `#` get their own slots in a
//! node so that matching a topic walks at most the levels of the topic times
//! the wildcard branches that exist, independent of the number of
//! subscriptions (the `routing` benchmark runs 100k of them).
//!
//! MQTT's `$` rule lives here too: a topic starting with `$` is not matched
//! by a filter whose *first* level is a wildcard.

use std::collections::HashMap;

/// A trie from topic filters to values of type `V`.
#[derive(Debug)]
pub(crate) struct TopicTrie<V> {
    root: Node<V>,
    len: usize,
}

#[derive(Debug)]
struct Node<V> {
    children: Children<V>,
    /// The `+` child and the `#` values, boxed together: most nodes (a
    /// device's own levels) have neither, and a node is paid once per
    /// level of every distinct filter.
    wild: Option<Box<Wildcards<V>>>,
    /// Values of filters ending exactly at this node.
    here: Vec<V>,
}

/// What a node holds for filters with a wildcard at its next level.
#[derive(Debug)]
struct Wildcards<V> {
    plus: Option<Node<V>>,
    /// Values of filters ending in `#` at this node.
    hash: Vec<V>,
}

impl<V> Default for Node<V> {
    fn default() -> Self {
        Self {
            children: Children::Few(Vec::new()),
            wild: None,
            here: Vec::new(),
        }
    }
}

impl<V> Node<V> {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.wild.is_none() && self.here.is_empty()
    }

    fn wild(&mut self) -> &mut Wildcards<V> {
        self.wild.get_or_insert_with(|| {
            Box::new(Wildcards {
                plus: None,
                hash: Vec::new(),
            })
        })
    }

    /// Drops the wildcard box once it holds nothing.
    fn prune_wild(&mut self) {
        if self
            .wild
            .as_ref()
            .is_some_and(|w| w.plus.is_none() && w.hash.is_empty())
        {
            self.wild = None;
        }
    }
}

/// Nodes with more children than this keep them in a hash map.
const FEW_CHILDREN_MAX: usize = 8;

/// A node's children by level.
///
/// Most nodes have one or two children (per-device topics such as
/// `devices/<id>/cmd` make a node per device below one wide level), and a
/// hash map costs several hundred bytes even for one entry, so small sets
/// are an exactly-sized vector searched linearly; wide levels switch to a
/// map and stay one.
#[derive(Debug)]
enum Children<V> {
    Few(Vec<(Box<str>, Node<V>)>),
    // Boxed so that every node pays for a vector (24 bytes), not a map
    // (48). Its nodes are boxed too: a wide level is one child per device,
    // and a map slot of a pointer (24 B with the key) at the map's load
    // costs less than one of a whole node (72 B), issue 20.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<Box<str>, Box<Node<V>>>>),
}

impl<V> Children<V> {
    fn is_empty(&self) -> bool {
        match self {
            Children::Few(v) => v.is_empty(),
            Children::Many(m) => m.is_empty(),
        }
    }

    fn get(&self, level: &str) -> Option<&Node<V>> {
        match self {
            Children::Few(v) => v.iter().find(|(l, _)| &**l == level).map(|(_, n)| n),
            Children::Many(m) => m.get(level).map(|n| &**n),
        }
    }

    fn get_mut(&mut self, level: &str) -> Option<&mut Node<V>> {
        match self {
            Children::Few(v) => v.iter_mut().find(|(l, _)| &**l == level).map(|(_, n)| n),
            Children::Many(m) => m.get_mut(level).map(|n| &mut **n),
        }
    }

    fn get_or_insert(&mut self, level: &str) -> &mut Node<V> {
        if let Children::Few(v) = self {
            if v.len() == FEW_CHILDREN_MAX && !v.iter().any(|(l, _)| &**l == level) {
                let map: HashMap<_, _> = std::mem::take(v)
                    .into_iter()
                    .map(|(level, node)| (level, Box::new(node)))
                    .collect();
                *self = Children::Many(Box::new(map));
            }
        }
        match self {
            Children::Few(v) => {
                let at = match v.iter().position(|(l, _)| &**l == level) {
                    Some(at) => at,
                    None => {
                        // Exactly sized: these vectors are many and small.
                        v.reserve_exact(1);
                        v.push((level.into(), Node::default()));
                        v.len() - 1
                    }
                };
                &mut v[at].1
            }
            Children::Many(m) => m.entry(level.into()).or_default(),
        }
    }

    fn remove(&mut self, level: &str) {
        match self {
            Children::Few(v) => {
                v.retain(|(l, _)| &**l != level);
                v.shrink_to_fit();
            }
            Children::Many(m) => {
                m.remove(level);
            }
        }
    }
}

impl<V> Default for TopicTrie<V> {
    fn default() -> Self {
        Self {
            root: Node::default(),
            len: 0,
        }
    }
}

impl<V> TopicTrie<V> {
    /// Number of values stored.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds `value` under `filter`. The filter must already be valid.
    pub(crate) fn insert(&mut self, filter: &str, value: V) {
        let mut node = &mut self.root;
        for level in filter.split('/') {
            match level {
                "#" => {
                    push_compact(&mut node.wild().hash, value);
                    self.len += 1;
                    return;
                }
                "+" => node = node.wild().plus.get_or_insert_with(Node::default),
                _ => node = node.children.get_or_insert(level),
            }
        }
        push_compact(&mut node.here, value);
        self.len += 1;
    }

    /// Removes the values under `filter` for which `pred` is true, pruning
    /// empty nodes. Returns how many were removed.
    pub(crate) fn remove_where(&mut self, filter: &str, mut pred: impl FnMut(&V) -> bool) -> usize {
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = remove_rec(&mut self.root, &levels, &mut pred);
        self.len -= removed;
        removed
    }

    /// Calls `visit` for every value whose filter matches `topic`.
    pub(crate) fn for_each_match<'a>(&'a self, topic: &str, mut visit: impl FnMut(&'a V)) {
        let dollar = topic.starts_with('$');
        match_rec(&self.root, Some(topic), 0, dollar, &mut visit);
    }
}

/// Pushes onto a node's values, exactly sized for the first: most filters
/// have one binding (a device's own topic), and a vector's first growth is
/// to four values. Later pushes grow as usual.
fn push_compact<V>(values: &mut Vec<V>, value: V) {
    if values.capacity() == 0 {
        values.reserve_exact(1);
    }
    values.push(value);
}

fn remove_rec<V>(node: &mut Node<V>, levels: &[&str], pred: &mut impl FnMut(&V) -> bool) -> usize {
    let Some((first, rest)) = levels.split_first() else {
        let before = node.here.len();
        node.here.retain(|v| !pred(v));
        return before - node.here.len();
    };
    match *first {
        "#" => {
            let Some(wild) = node.wild.as_mut() else {
                return 0;
            };
            let before = wild.hash.len();
            wild.hash.retain(|v| !pred(v));
            let n = before - wild.hash.len();
            node.prune_wild();
            n
        }
        "+" => {
            let Some(child) = node.wild.as_mut().and_then(|w| w.plus.as_mut()) else {
                return 0;
            };
            let n = remove_rec(child, rest, pred);
            if child.is_empty() {
                if let Some(wild) = node.wild.as_mut() {
                    wild.plus = None;
                }
                node.prune_wild();
            }
            n
        }
        level => {
            let Some(child) = node.children.get_mut(level) else {
                return 0;
            };
            let n = remove_rec(child, rest, pred);
            if child.is_empty() {
                node.children.remove(level);
            }
            n
        }
    }
}

/// Matches the levels of `rest` (what is left of the topic; `None` once
/// its last level is consumed) below `node`. The topic is split as it is
/// walked, level by level, rather than into a vector first: routing a
/// publish allocates nothing here.
fn match_rec<'a, V>(
    node: &'a Node<V>,
    rest: Option<&str>,
    depth: usize,
    dollar: bool,
    visit: &mut impl FnMut(&'a V),
) {
    // Wildcards at the first level never match `$` topics.
    let wild = node.wild.as_deref().filter(|_| !(dollar && depth == 0));
    if let Some(wild) = wild {
        // `a/#` also matches `a` itself (the parent level).
        wild.hash.iter().for_each(&mut *visit);
    }
    let Some(levels) = rest else {
        node.here.iter().for_each(visit);
        return;
    };
    let (first, rest) = match levels.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (levels, None),
    };
    if let Some(child) = node.children.get(first) {
        match_rec(child, rest, depth + 1, dollar, visit);
    }
    if let Some(plus) = wild.and_then(|w| w.plus.as_ref()) {
        match_rec(plus, rest, depth + 1, dollar, visit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rosetta_neutral::address::topic_matches;

    /// A node per level of every distinct filter (a device's `<id>/cmd`
    /// is two): children, the boxed wildcards and the values, nothing more.
    #[test]
    fn a_node_is_its_children_wildcard_box_and_values() {
        assert_eq!(std::mem::size_of::<Node<u64>>(), 56);
    }

    fn matches(trie: &TopicTrie<String>, topic: &str) -> Vec<String> {
        let mut out = Vec::new();
        trie.for_each_match(topic, |v| out.push(v.clone()));
        out.sort();
        out
    }

    #[test]
    fn wildcards_and_dollar_topics() {
        let mut t = TopicTrie::default();
        for f in ["a/b/c", "a/+/c", "a/#", "#", "+/b/+", "$SYS/#", "+"] {
            t.insert(f, f.to_string());
        }
        assert_eq!(
            matches(&t, "a/b/c"),
            vec!["#", "+/b/+", "a/#", "a/+/c", "a/b/c"]
        );
        assert_eq!(matches(&t, "a"), vec!["#", "+", "a/#"]);
        assert_eq!(matches(&t, "$SYS/broker"), vec!["$SYS/#"]);
        assert_eq!(t.len(), 7);
        assert_eq!(t.remove_where("a/+/c", |_| true), 1);
        assert_eq!(matches(&t, "a/x/c"), vec!["#", "a/#"]);
        assert_eq!(t.remove_where("nope/x", |_| true), 0);
    }

    fn level() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("a".to_string()),
            Just("b".to_string()),
            Just("$s".to_string()),
            Just(String::new())
        ]
    }

    fn filter() -> impl Strategy<Value = String> {
        (
            proptest::collection::vec(prop_oneof![level(), Just("+".to_string())], 1..4),
            any::<bool>(),
        )
            .prop_map(|(mut levels, hash)| {
                if hash {
                    levels.push("#".into());
                }
                levels.join("/")
            })
    }

    #[test]
    fn wide_levels_switch_to_a_map_and_keep_matching() {
        let mut t = TopicTrie::default();
        for i in 0..3 * FEW_CHILDREN_MAX {
            t.insert(&format!("d/{i}/cmd"), i.to_string());
            t.insert(&format!("d/{i}/+"), format!("{i}+"));
        }
        assert!(matches!(
            t.root.children.get("d").map(|n| &n.children),
            Some(Children::Many(_))
        ));
        for i in 0..3 * FEW_CHILDREN_MAX {
            assert_eq!(
                matches(&t, &format!("d/{i}/cmd")),
                vec![i.to_string(), format!("{i}+")]
            );
        }
        assert_eq!(t.remove_where("d/5/cmd", |_| true), 1);
        assert_eq!(matches(&t, "d/5/cmd"), vec!["5+".to_string()]);
        assert_eq!(t.remove_where("d/5/+", |_| true), 1);
        assert!(
            t.root
                .children
                .get("d")
                .is_some_and(|d| d.children.get("5").is_none()),
            "pruned"
        );
        assert_eq!(t.len(), 6 * FEW_CHILDREN_MAX - 2);
    }

    proptest! {
        /// The trie agrees with the reference matcher on every filter/topic pair.
        #[test]
        fn trie_agrees_with_reference(filters in proptest::collection::vec(filter(), 1..20),
                                      topic in proptest::collection::vec(level(), 1..5)) {
            let topic = topic.join("/");
            let mut t = TopicTrie::default();
            for (i, f) in filters.iter().enumerate() {
                t.insert(f, i);
            }
            let mut got = Vec::new();
            t.for_each_match(&topic, |i| got.push(*i));
            got.sort();
            let want: Vec<usize> = filters.iter().enumerate()
                .filter(|(_, f)| topic_matches(f, &topic)).map(|(i, _)| i).collect();
            prop_assert_eq!(got, want);
        }
    }
}
