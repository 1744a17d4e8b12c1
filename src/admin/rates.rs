//! Rates of one queue or one connection, from its counters sampled when a
//! listing shows it.
//!
//! The broker-wide rates of the overview come from one server timer that
//! samples the core's totals once a second (`rosetta_server::rates`). The
//! same for each queue would cost every queue a snapshot a second, shown
//! or not (100,000 queues: 100,000 locks a second). Here the samples are
//! taken by the requests themselves: a listing samples the counters of the
//! items on its page (which it reads anyway) and keeps the sample in a
//! small ring per item, so a rate costs only what is shown, and only
//! while someone looks. The rate of an item is the change between its
//! oldest kept sample and now, over the time between them (`window_s`):
//! the console, polling every few seconds, sees rates over the last
//! [`WINDOW`]. The first look at an item has no earlier sample of its
//! own, but every item's counters were zero when they started counting
//! (a connection when it opened, a queue at the broker's start or when it
//! was made): the caller says when that was, and the first look answers
//! the mean rate since then, so a queue filled before anyone looked shows
//! a rate at once.
//!
//! Bounded: at most [`KEYS_MAX`] items are remembered, each with at most
//! [`SAMPLES_MAX`] samples; an item not looked at for [`IDLE`] is
//! forgotten when room is needed.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The span rates are wanted over: older samples are dropped once a newer
/// one is at least this old.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);
/// Samples of one item closer together than this are not all kept (a
/// console and a script polling the same page).
const SPACING_MIN: Duration = Duration::from_secs(1);
/// Samples kept per item: [`WINDOW`] over [`SPACING_MIN`], and one more.
const SAMPLES_MAX: usize = 12;
/// Items remembered at most (ten full pages of the largest page size).
pub(crate) const KEYS_MAX: usize = 10_000;
/// An item not shown for this long is forgotten when room is needed.
const IDLE: Duration = Duration::from_secs(300);

/// Rates of `N` counters over `window_s` seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rates<const N: usize> {
    /// Seconds between the sample the rates start from and now; 0 when
    /// there is none (then every rate is 0).
    pub(crate) window_s: f64,
    /// Each counter's change per second, in the counters' order.
    pub(crate) per_s: [f64; N],
}

struct Ring<const N: usize> {
    samples: VecDeque<(Instant, [u64; N])>,
    seen: Instant,
    /// The front sample is the zeros at `counting_since`, not a look: it
    /// gives way as soon as a real sample can measure a rate.
    seeded: bool,
}

/// Recent samples of `N` counters per item `K`.
pub(crate) struct Sampler<K, const N: usize> {
    items: Mutex<HashMap<K, Ring<N>>>,
}

impl<K: Hash + Eq + Clone, const N: usize> Default for Sampler<K, N> {
    fn default() -> Self {
        Self {
            items: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone, const N: usize> Sampler<K, N> {
    /// Records `counts` of each item at `now` and answers its rates, in
    /// the order given (one lock for the whole page). Each item comes
    /// with when its counters were all zero (see the module's docs).
    pub(crate) fn observe<'a>(
        &self,
        now: Instant,
        page: impl IntoIterator<Item = (&'a K, Instant, [u64; N])>,
    ) -> Vec<Rates<N>>
    where
        K: 'a,
    {
        let mut items = self.items.lock();
        page.into_iter()
            .map(|(key, since, counts)| observe_one(&mut items, now, since, key, counts))
            .collect()
    }

    /// [`Sampler::observe`] for one item.
    pub(crate) fn observe_one(
        &self,
        now: Instant,
        counting_since: Instant,
        key: &K,
        counts: [u64; N],
    ) -> Rates<N> {
        observe_one(&mut self.items.lock(), now, counting_since, key, counts)
    }
}

fn observe_one<K: Hash + Eq + Clone, const N: usize>(
    items: &mut HashMap<K, Ring<N>>,
    now: Instant,
    counting_since: Instant,
    key: &K,
    counts: [u64; N],
) -> Rates<N> {
    if !items.contains_key(key) && items.len() >= KEYS_MAX {
        items.retain(|_, ring| now.saturating_duration_since(ring.seen) < IDLE);
        if items.len() >= KEYS_MAX {
            // Every remembered item is being looked at: this one goes
            // without a rate rather than evict one that is.
            return Rates {
                window_s: 0.0,
                per_s: [0.0; N],
            };
        }
    }
    let ring = items.entry(key.clone()).or_insert_with(|| Ring {
        samples: VecDeque::with_capacity(2),
        seen: now,
        seeded: false,
    });
    ring.seen = now;
    // A counter that went down is another item under the same key (a
    // queue deleted and made again): its history is not this one's.
    if ring
        .samples
        .back()
        .is_some_and(|(_, last)| last.iter().zip(&counts).any(|(was, is)| is < was))
    {
        ring.samples.clear();
        ring.seeded = false;
    }
    if ring.samples.is_empty() && counting_since < now {
        // What the counters were before anyone looked.
        ring.samples.push_back((counting_since, [0; N]));
        ring.seeded = true;
    } else if ring.seeded
        && ring
            .samples
            .get(1)
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= SPACING_MIN)
    {
        // A look of our own is far enough back to measure from.
        ring.samples.pop_front();
        ring.seeded = false;
    }
    // Keep one sample at least WINDOW old, and none older than it.
    while ring
        .samples
        .get(1)
        .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= WINDOW)
    {
        ring.samples.pop_front();
    }
    let rates = match ring.samples.front() {
        Some((at, then)) if now > *at => {
            let window_s = now.duration_since(*at).as_secs_f64();
            let mut per_s = [0.0; N];
            for (rate, (is, was)) in per_s.iter_mut().zip(counts.iter().zip(then)) {
                *rate = is.saturating_sub(*was) as f64 / window_s;
            }
            Rates { window_s, per_s }
        }
        _ => Rates {
            window_s: 0.0,
            per_s: [0.0; N],
        },
    };
    let spaced = ring
        .samples
        .back()
        .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= SPACING_MIN);
    if spaced {
        if ring.samples.len() == SAMPLES_MAX {
            ring.samples.pop_front();
        }
        ring.samples.push_back((now, counts));
    }
    rates
}

/// Rounds a rate for JSON: three decimals are more than a rate over a few
/// seconds carries.
pub(crate) fn round(rate: f64) -> f64 {
    (rate * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    /// A look whose counters started counting at the look itself (no
    /// history before it).
    fn one(s: &Sampler<String, 2>, now: Instant, counts: [u64; 2]) -> Rates<2> {
        s.observe_one(now, now, &"q".to_owned(), counts)
    }

    #[test]
    fn the_first_look_has_no_window_and_later_ones_divide_the_change() {
        let s = Sampler::<String, 2>::default();
        let base = Instant::now();
        assert_eq!(
            one(&s, base, [10, 0]),
            Rates {
                window_s: 0.0,
                per_s: [0.0, 0.0]
            }
        );
        let r = one(&s, at(base, 2_000), [30, 4]);
        assert_eq!(r.window_s, 2.0);
        assert_eq!(r.per_s, [10.0, 2.0]);
        // A look 0.5 s later still measures from the first sample, and is
        // not kept (too close to the last).
        let r = one(&s, at(base, 2_500), [35, 4]);
        assert_eq!(r.window_s, 2.5);
        assert_eq!(r.per_s, [10.0, 1.6]);
    }

    #[test]
    fn old_samples_fall_out_but_one_at_least_a_window_old_stays() {
        let s = Sampler::<String, 2>::default();
        let base = Instant::now();
        for sec in 0..=30u64 {
            one(&s, at(base, sec * 1_000), [sec * 100, 0]);
        }
        let r = one(&s, at(base, 31_000), [3_100, 0]);
        assert_eq!(r.window_s, WINDOW.as_secs_f64());
        assert_eq!(r.per_s[0], 100.0);
        // Polled every 30 s, the window is the 30 s between polls.
        let r = one(&s, at(base, 61_000), [3_100, 300]);
        assert_eq!(r.window_s, 30.0);
        assert_eq!(r.per_s[1], 10.0);
    }

    #[test]
    fn the_first_look_measures_from_when_counting_started_until_a_look_can() {
        let s = Sampler::<String, 2>::default();
        let base = Instant::now();
        let q = "q".to_owned();
        // Filled at 50/s for 4 s before anyone looked.
        let r = s.observe_one(at(base, 4_000), base, &q, [200, 0]);
        assert_eq!((r.window_s, r.per_s), (4.0, [50.0, 0.0]));
        // Half a second later there is no look of our own to measure from
        // yet (too close): still since counting started.
        let r = s.observe_one(at(base, 4_500), base, &q, [200, 5]);
        assert_eq!((r.window_s, r.per_s), (4.5, [200.0 / 4.5, 5.0 / 4.5]));
        // Two seconds after the first look, it is measured from that look.
        let r = s.observe_one(at(base, 6_000), base, &q, [200, 25]);
        assert_eq!((r.window_s, r.per_s), (2.0, [0.0, 12.5]));
    }

    #[test]
    fn a_counter_going_down_starts_the_item_again() {
        let s = Sampler::<String, 2>::default();
        let base = Instant::now();
        one(&s, base, [500, 500]);
        let r = one(&s, at(base, 2_000), [3, 0]);
        assert_eq!(r.window_s, 0.0, "a new queue under the old name");
        let r = one(&s, at(base, 4_000), [13, 0]);
        assert_eq!((r.window_s, r.per_s[0]), (2.0, 5.0));
    }

    #[test]
    fn items_are_bounded_and_idle_ones_make_room() {
        let s = Sampler::<u64, 1>::default();
        let base = Instant::now();
        let keys: Vec<u64> = (0..KEYS_MAX as u64).collect();
        s.observe(base, keys.iter().map(|k| (k, base, [0])));
        let extra = KEYS_MAX as u64;
        // Full of items looked at just now: a new one gets no rate, twice.
        s.observe(at(base, 1_000), [(&extra, base, [0])]);
        let r = s.observe_one(at(base, 3_000), base, &extra, [10]);
        assert_eq!(r.window_s, 0.0);
        // Once the others are idle, they make room.
        let later = at(base, IDLE.as_millis() as u64 + 1_000);
        s.observe(later, [(&extra, later, [10])]);
        let r = s.observe_one(at(later, 2_000), later, &extra, [30]);
        assert_eq!((r.window_s, r.per_s[0]), (2.0, 10.0));
        assert_eq!(s.items.lock().len(), 1);
    }
}
