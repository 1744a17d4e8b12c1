//! A coarse timer for the far deadlines of idle connections.
//!
//! Every connection with a keep-alive (MQTT), heart-beat (STOMP) or idle
//! timeout (AMQP) has a deadline, and an idle connection's deadline is
//! far away (1.5 times its keep-alive, a minute or more) and keeps moving
//! as packets arrive. A tokio `Sleep` per connection for it cost each idle
//! connection 112 bytes (issue 20). Instead the driver parks its wake-up
//! here, in a bucket per second, which costs 8 bytes in the bucket and 8
//! in the driver; when the bucket's second comes, one thread wakes every
//! task in it. A task woken before its deadline (it moved) parks again;
//! one within [`COARSE_MIN`] of it takes a tokio `Sleep` for the last
//! stretch, so deadlines stay exact to tokio's millisecond.
//!
//! One timer per process (the broker runs one server; tests run several,
//! which share it), with its thread started on first use. A bucket holds
//! weak references to the connections' sinks, and a connection that ends
//! clears its entry, so neither a closed connection's memory nor its
//! wake-up outlives it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::driver::ChannelSink;

/// Deadlines at least this far away wait here; nearer ones get a tokio
/// `Sleep`. The timer wakes a task [`EARLY`] before its deadline, so that
/// it is then within this distance and takes the exact timer.
pub(crate) const COARSE_MIN: Duration = Duration::from_secs(3);
/// How long before its deadline a parked task is woken: more than the
/// timer's granularity (a bucket is a second) plus its thread's lateness,
/// less than [`COARSE_MIN`].
const EARLY: Duration = Duration::from_millis(1500);
/// A bucket's width, for deadlines ([`CoarseTimer::global`]).
const TICK: Duration = Duration::from_secs(1);
/// A bucket's width for the idle connections' park checks
/// ([`CoarseTimer::parking`]): a connection parks 1 to 2 of these after
/// its last activity (`parking::PARK_AFTER_TICKS`), soon enough that a
/// burst of connections that go quiet reuses the memory of the first
/// ones' tasks for the next ones.
const PARK_TICK: Duration = Duration::from_millis(100);

/// Where a parked wake-up waits: its bucket (seconds since the timer
/// started; 0 for none) and its place in the bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    second: u32,
    index: u32,
}

impl Slot {
    /// Whether this slot holds a wake-up.
    pub(crate) fn is_armed(self) -> bool {
        self.second != 0
    }
}

/// See the module docs.
pub(crate) struct CoarseTimer {
    start: Instant,
    /// A bucket's width (the docs say "second" for it).
    tick: Duration,
    /// Wake-ups by second; a cleared one is an empty `Weak`.
    buckets: Mutex<BTreeMap<u32, Vec<Weak<ChannelSink>>>>,
    /// Every bucket up to this second has been taken.
    fired_through: AtomicU32,
}

impl CoarseTimer {
    fn new(start: Instant, tick: Duration) -> Self {
        Self {
            start,
            tick,
            buckets: Mutex::default(),
            fired_through: AtomicU32::new(0),
        }
    }

    /// The process's timer for deadlines, in seconds; its thread starts
    /// with the first call.
    pub(crate) fn global() -> &'static CoarseTimer {
        static TIMER: OnceLock<&'static CoarseTimer> = OnceLock::new();
        TIMER.get_or_init(|| Self::start("rosetta-coarse-timer", TICK))
    }

    /// The process's timer for park checks (see `parking`), in ticks of
    /// [`PARK_TICK`]: only [`Self::arm_second`] and
    /// [`Self::current_second`] are meant for it.
    pub(crate) fn parking() -> &'static CoarseTimer {
        static TIMER: OnceLock<&'static CoarseTimer> = OnceLock::new();
        TIMER.get_or_init(|| Self::start("rosetta-park-timer", PARK_TICK))
    }

    fn start(name: &str, tick: Duration) -> &'static CoarseTimer {
        let timer: &'static CoarseTimer =
            Box::leak(Box::new(CoarseTimer::new(Instant::now(), tick)));
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || timer.run());
        if let Err(e) = spawned {
            // Without its thread nothing parked here is woken: tasks
            // then never park (see `arm`).
            tracing::error!(error = %e, "cannot start the coarse timer's thread");
            timer.fired_through.store(u32::MAX, Ordering::SeqCst);
        }
        timer
    }

    fn run(&self) {
        loop {
            let next = self.fired_through.load(Ordering::SeqCst).saturating_add(1);
            let at = self.start + self.tick * next;
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            self.fire_through(self.second_of(Instant::now()));
        }
    }

    /// The bucket of `at`: whole seconds since the start, at least 1.
    fn second_of(&self, at: Instant) -> u32 {
        let ticks = at.saturating_duration_since(self.start).as_nanos() / self.tick.as_nanos();
        u32::try_from(ticks).unwrap_or(u32::MAX).max(1)
    }

    /// Parks a wake-up of `sink`'s task for [`EARLY`] before `deadline`,
    /// if that is far enough away to be worth it ([`COARSE_MIN`]); `None`
    /// when the caller should use an exact timer instead.
    pub(crate) fn arm(&self, deadline: Instant, sink: &Arc<ChannelSink>) -> Option<Slot> {
        let now = Instant::now();
        if deadline.saturating_duration_since(now) < COARSE_MIN {
            return None;
        }
        let second = self.second_of(deadline.checked_sub(EARLY).unwrap_or(deadline));
        self.arm_second(second, sink)
    }

    /// Parks a wake-up of `sink`'s task for when the timer's clock reaches
    /// `second` (see [`Self::current_second`]); `None` if it has.
    pub(crate) fn arm_second(&self, second: u32, sink: &Arc<ChannelSink>) -> Option<Slot> {
        if second <= self.fired_through.load(Ordering::SeqCst) {
            // Already past (or the thread is gone): not worth parking.
            return None;
        }
        let mut buckets = self.buckets.lock();
        let bucket = buckets.entry(second).or_default();
        let index = u32::try_from(bucket.len()).ok()?;
        bucket.push(Arc::downgrade(sink));
        Some(Slot { second, index })
    }

    /// Whether `slot` still waits for its second (else it fired or was
    /// never armed).
    pub(crate) fn is_pending(&self, slot: Slot) -> bool {
        slot.is_armed() && slot.second > self.fired_through.load(Ordering::SeqCst)
    }

    /// The timer's clock: the last second it fired, which is now's whole
    /// seconds since its start, or one less while that second's bucket is
    /// being fired. One atomic load. `None` if the timer's thread could
    /// not start.
    pub(crate) fn current_second(&self) -> Option<u32> {
        let second = self.fired_through.load(Ordering::SeqCst);
        (second != u32::MAX).then_some(second)
    }

    /// Whether `slot` waits for a second no later than `second`.
    pub(crate) fn is_pending_by(&self, slot: Slot, second: u32) -> bool {
        self.is_pending(slot) && slot.second <= second
    }

    /// Whether a slot parked now for `deadline` would be no later than
    /// `slot`: a task whose deadline moved later keeps its earlier slot
    /// (it is woken early and parks again).
    pub(crate) fn covers(&self, slot: Slot, deadline: Instant) -> bool {
        let wake = deadline.checked_sub(EARLY).unwrap_or(deadline);
        self.is_pending(slot) && slot.second <= self.second_of(wake)
    }

    /// Whether `slot` is the one [`Self::arm`] would park now for
    /// `deadline`: pending, and for that very second, not an earlier one.
    pub(crate) fn wakes_for(&self, slot: Slot, deadline: Instant) -> bool {
        let wake = deadline.checked_sub(EARLY).unwrap_or(deadline);
        self.is_pending(slot) && slot.second == self.second_of(wake)
    }

    /// Clears `slot`, which `sink` armed, if it still waits.
    pub(crate) fn cancel(&self, slot: Slot, sink: &Arc<ChannelSink>) {
        if !self.is_pending(slot) {
            return;
        }
        let mut buckets = self.buckets.lock();
        let entry = buckets
            .get_mut(&slot.second)
            .and_then(|b| b.get_mut(slot.index as usize));
        // The same sink's entry only: a bucket taken and made again for the
        // same second holds others' entries at the same places.
        if let Some(entry) = entry.filter(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(sink))) {
            *entry = Weak::new();
        }
    }

    /// Wakes every task parked up to `second`.
    fn fire_through(&self, second: u32) {
        let due = {
            let mut buckets = self.buckets.lock();
            let later = buckets.split_off(&second.saturating_add(1));
            self.fired_through.fetch_max(second, Ordering::SeqCst);
            std::mem::replace(&mut *buckets, later)
        };
        for sink in due.into_values().flatten() {
            if let Some(sink) = sink.upgrade() {
                sink.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::event_channel;

    #[test]
    fn a_far_deadline_parks_until_its_second_and_a_cancelled_one_is_not_woken() {
        let start = Instant::now();
        let timer = CoarseTimer::new(start, TICK);
        let (sink, _) = event_channel(None);
        assert_eq!(
            timer.arm(start + Duration::from_secs(2), &sink),
            None,
            "near deadlines take an exact timer"
        );
        let deadline = start + Duration::from_secs(10);
        let slot = timer.arm(deadline, &sink).expect("parked");
        assert_eq!(slot.second, 8, "woken EARLY before the deadline");
        assert!(timer.covers(slot, deadline + Duration::from_secs(5)));
        assert!(!timer.covers(slot, deadline - Duration::from_secs(3)));
        timer.fire_through(7);
        assert!(timer.is_pending(slot));
        timer.fire_through(8);
        assert!(!timer.is_pending(slot), "fired");
        assert!(timer.buckets.lock().is_empty());

        let (other, _) = event_channel(None);
        let mine = timer
            .arm(deadline + Duration::from_secs(5), &sink)
            .expect("parked");
        let theirs = timer
            .arm(deadline + Duration::from_secs(5), &other)
            .expect("parked");
        timer.cancel(mine, &other);
        timer.cancel(mine, &sink);
        let bucket = timer.buckets.lock()[&mine.second].clone();
        assert!(bucket[mine.index as usize].upgrade().is_none(), "cancelled");
        assert!(
            bucket[theirs.index as usize].upgrade().is_some(),
            "only its own"
        );
    }
}
