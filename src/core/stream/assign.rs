//! Which member of a consumer group reads which partition.
//!
//! Every partition goes to exactly one live member, and the members'
//! counts differ by at most one. The assignment is sticky: a partition
//! stays with its current owner while that owner is live and not above
//! its share, so a member joining or leaving moves only the partitions
//! that must move (a partition that moves resumes from the group's
//! committed offset, so fewer moves mean fewer redeliveries). Ties go to
//! the member that joined first; the result depends only on its inputs.

/// A member, by the order it joined in (smaller joined earlier).
pub(crate) type MemberId = u64;

/// The new owner of each partition, given the current ones (`owners[p]`,
/// `None`: unowned) and the live `members` in the order they joined.
/// With no members every partition is unowned.
pub(crate) fn assign(owners: &[Option<MemberId>], members: &[MemberId]) -> Vec<Option<MemberId>> {
    if members.is_empty() {
        return vec![None; owners.len()];
    }
    let floor = owners.len() / members.len();
    // How many members may hold one more than `floor`.
    let mut extra = owners.len() % members.len();
    let mut count = vec![0usize; members.len()];
    let index = |m: MemberId| members.iter().position(|&x| x == m);
    let mut out: Vec<Option<MemberId>> = vec![None; owners.len()];
    // Keep what current owners may keep: up to `floor` each, then one
    // more for as many as `extra` allows.
    for pass in 0..2 {
        for (p, owner) in owners.iter().enumerate() {
            let Some(i) = owner.and_then(index) else {
                continue;
            };
            if out[p].is_some() {
                continue;
            }
            let keep = if pass == 0 {
                count[i] < floor
            } else if count[i] == floor && extra > 0 {
                extra -= 1;
                true
            } else {
                false
            };
            if keep {
                count[i] += 1;
                out[p] = Some(members[i]);
            }
        }
    }
    // The rest to whoever has fewest (first joined on a tie): members
    // below `floor` first, then as many at `floor` as `extra` still allows.
    for slot in out.iter_mut().filter(|o| o.is_none()) {
        let (i, _) = count
            .iter()
            .enumerate()
            .min_by_key(|&(i, c)| (*c, i))
            .unwrap_or((0, &0));
        count[i] += 1;
        *slot = Some(members[i]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counts(out: &[Option<MemberId>], members: &[MemberId]) -> Vec<usize> {
        members
            .iter()
            .map(|m| out.iter().filter(|o| **o == Some(*m)).count())
            .collect()
    }

    #[test]
    fn spreads_evenly_and_moves_only_what_must_move() {
        let fresh = assign(&[None; 5], &[1, 2]);
        assert_eq!(fresh, vec![Some(1), Some(2), Some(1), Some(2), Some(1)]);
        // 3 joins: it takes one partition from each, the rest stay.
        let three = assign(&fresh, &[1, 2, 3]);
        assert_eq!(counts(&three, &[1, 2, 3]), vec![2, 2, 1]);
        let moved = fresh.iter().zip(&three).filter(|(a, b)| a != b).count();
        assert_eq!(moved, 1);
        // 1 leaves: its partitions go to 2 and 3, theirs stay.
        let without_1 = assign(&three, &[2, 3]);
        for (before, after) in three.iter().zip(&without_1) {
            if *before != Some(1) {
                assert_eq!(before, after);
            }
        }
        assert_eq!(counts(&without_1, &[2, 3]), vec![3, 2]);
        assert_eq!(assign(&without_1, &[]), vec![None; 5]);
    }

    proptest! {
        #[test]
        fn every_partition_has_one_live_owner_and_counts_differ_by_at_most_one(
            partitions in 0usize..40,
            old in proptest::collection::vec(proptest::option::of(0u64..12), 40),
            live in proptest::collection::btree_set(0u64..12, 0..10),
        ) {
            let owners = &old[..partitions];
            let members: Vec<MemberId> = live.into_iter().collect();
            let out = assign(owners, &members);
            prop_assert_eq!(out.len(), partitions);
            if members.is_empty() {
                prop_assert!(out.iter().all(Option::is_none));
            } else {
                prop_assert!(out.iter().all(|o| o.is_some_and(|m| members.contains(&m))));
                let c = counts(&out, &members);
                let (lo, hi) = (c.iter().min().copied().unwrap_or(0), c.iter().max().copied().unwrap_or(0));
                prop_assert!(hi - lo <= 1, "counts {:?}", c);
                // Deterministic.
                prop_assert_eq!(&out, &assign(owners, &members));
                // Sticky: a live member keeps its partitions up to its share.
                let floor = partitions / members.len();
                for m in &members {
                    let had = owners.iter().filter(|o| **o == Some(*m)).count();
                    let kept = owners.iter().zip(&out).filter(|(o, n)| **o == Some(*m) && **n == Some(*m)).count();
                    prop_assert!(kept >= had.min(floor));
                }
            }
        }
    }
}
