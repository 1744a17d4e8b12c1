//! Back-pressure from a connection to the core: how many bytes of
//! deliveries a connection may hold before it has written them.
//!
//! Consumer credit bounds deliveries by *count*, and for auto-settled
//! consumers (STOMP `ack:auto`, MQTT QoS 0, AMQP pre-settled) it comes back
//! at dispatch, so credit alone would let a subscriber that stops reading
//! make the core empty a whole backlog, paged messages read back from disk
//! included, into its connection. A [`DeliveryBudget`] bounds the same path
//! in *bytes*:
//!
//! - The connection's event sink holds one budget per connection, inline
//!   (the sink, its event queue and the budget are one allocation), and
//!   hands it to the core through [`EventSink::budget`].
//! - The core asks [`has_room`] before it hands a consumer of that
//!   connection a message, and charges the message to the sink's budget
//!   ([`DeliveryCharge::on`]): the charge, which holds the sink, travels
//!   inside the [`Delivery`](crate::Delivery).
//! - The adapter drops the delivery (and so its charge) once it has turned
//!   it into output bytes; a delivery the adapter holds back for its own
//!   flow control (an AMQP session window, MQTT's receive maximum) stays
//!   charged while it waits.
//! - When a charge brings a held-back budget down to half its size, the
//!   budget tells its sink ([`EventSink::budget_notice`]), whose driver
//!   then [takes the resumption](DeliveryBudget::take_resume) and has the
//!   connection's adapter resume its session
//!   ([`Session::resume_deliveries`](crate::Session::resume_deliveries)),
//!   which dispatches to that connection's consumers again. The hysteresis
//!   keeps a busy connection from waking the core per message. (The
//!   resumption travels through the adapter rather than a callback the
//!   core leaves in the budget: that callback was 24 bytes of every
//!   connection's sink and an allocation of 16, issue 20.)
//!
//! Admission checks only that the budget is not yet full, so one message
//! larger than the whole budget still goes through (alone): a budget bounds
//! memory, it never makes a message undeliverable.
//!
//! A consumer that can fetch its deliveries again whenever it likes (a
//! stream reader, which reads them from its log) asks
//! [`has_room_to_read_ahead`] instead: it keeps at most
//! [`READ_AHEAD_BYTES`] waiting, however large its credit, so what it holds
//! for a slow socket stays below a credit of a few hundred KiB. Such a
//! *read-ahead hold* resumes at half of [`READ_AHEAD_BYTES`], and is not a
//! full budget: the driver's slow-consumer deadline ignores it
//! ([`DeliveryBudget::full_since`]).
//!
//! The output buffer is not charged: a driver takes new events only once it
//! has written its previous output, so a connection holds at most its
//! budget in waiting deliveries plus one batch being written.
//!
//! A charge keeps its sink alive, so a sink that queues deliveries holds
//! itself while they wait: its owner drops what is queued when the
//! connection ends (the server's driver does, and refuses later events).

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::broker::EventSink;

/// One connection's allowance for deliveries it has not yet written. Held
/// inline by the connection's [`EventSink`] (one per connection: 24 bytes,
/// no allocation of its own).
pub struct DeliveryBudget {
    /// Never 0, so an `Option<DeliveryBudget>` is no larger.
    max_bytes: NonZeroU64,
    used_bytes: AtomicU64,
    /// Whether the core held a delivery back for lack of room and waits to
    /// be resumed, and since when, for the driver's slow-consumer deadline:
    /// nanoseconds since [`clock_base`] (at least 1), 0 when the core does
    /// not wait. One atomic rather than a flag and a locked
    /// `Option<Instant>`.
    held_back_since: AtomicU64,
}

impl std::fmt::Debug for DeliveryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryBudget")
            .field("max_bytes", &self.max_bytes)
            .field("used_bytes", &self.used_bytes())
            .field("held_back", &self.is_held_back())
            .finish()
    }
}

/// Whether the core may hand `sink`'s connection a delivery now (always,
/// for a sink without a budget). When it may not, the budget remembers
/// that the core is waiting, tells the sink ([`EventSink::budget_notice`])
/// and has it resume the core once there is room again; so the core may
/// simply stop dispatching to this connection after a `false`.
#[inline]
pub fn has_room(sink: &dyn EventSink) -> bool {
    sink.budget_has_room()
}

/// Most bytes of deliveries a consumer that reads ahead keeps waiting for
/// its connection (see the module docs): about four of a STOMP
/// connection's 64 KiB writes, so the socket never waits for the log.
pub const READ_AHEAD_BYTES: u64 = 256 * 1024;

/// Like [`has_room`], for a consumer that reads ahead: whether `sink`'s
/// connection has fewer than [`READ_AHEAD_BYTES`] (or its whole budget, if
/// smaller) waiting, and if so how many bytes more it may be handed
/// (`None`: no room; the budget remembers that the core waits and has
/// the connection resume it at half of that).
#[inline]
pub fn has_room_to_read_ahead(sink: &dyn EventSink) -> Option<u64> {
    match sink.budget() {
        None => Some(READ_AHEAD_BYTES),
        Some(budget) => budget.try_read_ahead(|| sink.budget_notice()),
    }
}

/// `held_back_since`'s lowest bit: set for a read-ahead hold, clear for a
/// full budget.
const READ_AHEAD_HOLD: u64 = 1;

impl DeliveryBudget {
    /// A budget of `max_bytes` (at least 1).
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes: NonZeroU64::new(max_bytes).unwrap_or(NonZeroU64::MIN),
            used_bytes: AtomicU64::new(0),
            held_back_since: AtomicU64::new(0),
        }
    }

    /// The budget's size.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes.get()
    }

    /// Bytes of deliveries charged now.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::SeqCst)
    }

    fn is_held_back(&self) -> bool {
        self.held_back_since.load(Ordering::SeqCst) != 0
    }

    /// Whether a delivery may be charged now; see [`has_room`], which
    /// passes the sink's notice as `notify` (run when the core starts to
    /// wait).
    #[inline]
    pub fn try_room(&self, notify: impl FnOnce()) -> bool {
        if self.used_bytes() < self.max_bytes() {
            return true;
        }
        self.hold(false, notify);
        // Checked again after the flag is up: a charge dropped between the
        // first check and the flag saw no waiter, so room it made would
        // otherwise go unnoticed (see `DeliveryCharge::drop`).
        self.used_bytes() < self.max_bytes()
    }

    /// How many bytes more a consumer that reads ahead may be handed now
    /// (`None`: none); see [`has_room_to_read_ahead`].
    #[inline]
    pub fn try_read_ahead(&self, notify: impl FnOnce()) -> Option<u64> {
        let limit = self.read_ahead_limit();
        let room = |used: u64| limit.checked_sub(used).filter(|&r| r > 0);
        if let Some(r) = room(self.used_bytes()) {
            return Some(r);
        }
        self.hold(true, notify);
        room(self.used_bytes())
    }

    fn read_ahead_limit(&self) -> u64 {
        READ_AHEAD_BYTES.min(self.max_bytes())
    }

    /// Records that the core waits (since now, unless it already did) and
    /// tells the driver once. A full budget's hold replaces a read-ahead
    /// one: it is the stronger claim, and the one the slow-consumer
    /// deadline times.
    fn hold(&self, read_ahead: bool, notify: impl FnOnce()) {
        let since = Instant::now().saturating_duration_since(clock_base());
        let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        let held = if read_ahead {
            nanos | READ_AHEAD_HOLD
        } else {
            (nanos & !READ_AHEAD_HOLD).max(2)
        };
        match self
            .held_back_since
            .compare_exchange(0, held, Ordering::SeqCst, Ordering::SeqCst)
        {
            // The driver learns that the core now waits, so it can time a
            // peer that stopped reading (its slow-consumer deadline).
            Ok(_) => notify(),
            Err(current) if !read_ahead && current & READ_AHEAD_HOLD != 0 => {
                // Already told; a lost race leaves the other hold, which
                // also resumes the core.
                let _ = self.held_back_since.compare_exchange(
                    current,
                    held,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
            Err(_) => {}
        }
    }

    /// Since when the core has been waiting for room, if it is.
    pub fn held_back_since(&self) -> Option<Instant> {
        match self.held_back_since.load(Ordering::SeqCst) {
            0 => None,
            nanos => Some(instant_at(nanos)),
        }
    }

    /// Since when the core has been waiting because the budget was full,
    /// if it is: not for a read-ahead hold, which bounds a consumer that
    /// could take more, so it says nothing of a peer that stopped
    /// reading.
    pub fn full_since(&self) -> Option<Instant> {
        match self.held_back_since.load(Ordering::SeqCst) {
            0 => None,
            nanos if nanos & READ_AHEAD_HOLD != 0 => None,
            nanos => Some(instant_at(nanos)),
        }
    }

    /// For the driver: whether the core waits and the budget is down to
    /// its low watermark. If so, the wait is cleared (a second call says
    /// no) and the caller must resume the connection's session
    /// ([`Session::resume_deliveries`](crate::Session::resume_deliveries))
    /// outside any other call into it.
    pub fn take_resume(&self) -> bool {
        match self.resume_below() {
            Some(watermark) if self.used_bytes() <= watermark => {
                self.held_back_since.swap(0, Ordering::SeqCst) != 0
            }
            _ => false,
        }
    }

    /// Where a waiting core is resumed (`None`: it does not wait): half
    /// the budget, or half the read-ahead for a read-ahead hold (resumed
    /// at half the budget, a reader that reads ahead would be resumed with
    /// its whole read-ahead still waiting, and hold again at once). One
    /// load of the hold, which says both whether and which.
    fn resume_below(&self) -> Option<u64> {
        match self.held_back_since.load(Ordering::SeqCst) {
            0 => None,
            held if held & READ_AHEAD_HOLD != 0 => Some(self.read_ahead_limit() / 2),
            _ => Some(self.max_bytes() / 2),
        }
    }

    /// Charges `bytes` (see [`DeliveryCharge::on`]).
    #[inline]
    pub(crate) fn add(&self, bytes: u64) {
        self.used_bytes.fetch_add(bytes, Ordering::SeqCst);
    }

    #[inline]
    pub(crate) fn uncharge(&self, bytes: u64, notify: impl FnOnce()) {
        let after = self
            .used_bytes
            .fetch_sub(bytes, Ordering::SeqCst)
            .saturating_sub(bytes);
        // Every uncharge at or below the watermark wakes a waiting core's
        // driver, not only the one that crosses it: the core may have given
        // up below the watermark (one message larger than the budget).
        // `take_resume` clears the wait, so the wake-ups stop there.
        if self
            .resume_below()
            .is_some_and(|watermark| after <= watermark)
        {
            notify();
        }
    }
}

/// Bytes of one delivery charged to its connection's [`DeliveryBudget`],
/// returned on drop. A clone carries no charge: the original's owner
/// decides when the bytes are gone.
#[derive(Default)]
pub struct DeliveryCharge {
    /// The sink whose budget holds the bytes, and the bytes.
    budget: Option<(Arc<dyn EventSink>, u64)>,
}

impl DeliveryCharge {
    /// A charge of nothing (deliveries to a connection without a budget).
    pub fn none() -> Self {
        Self::default()
    }

    /// Charges `bytes` to `sink`'s budget (nothing, for a sink without
    /// one). The bytes are returned when the result is dropped.
    #[inline]
    pub fn on(sink: &Arc<dyn EventSink>, bytes: u64) -> Self {
        if sink.budget_charge(bytes) {
            Self {
                budget: Some((Arc::clone(sink), bytes)),
            }
        } else {
            Self::none()
        }
    }

    /// Bytes charged.
    pub fn bytes(&self) -> u64 {
        self.budget.as_ref().map_or(0, |(_, b)| *b)
    }
}

impl Clone for DeliveryCharge {
    fn clone(&self) -> Self {
        Self::none()
    }
}

impl std::fmt::Debug for DeliveryCharge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeliveryCharge({} bytes)", self.bytes())
    }
}

impl Drop for DeliveryCharge {
    #[inline]
    fn drop(&mut self) {
        if let Some((sink, bytes)) = self.budget.take() {
            sink.budget_uncharge(bytes);
        }
    }
}

/// The instant `nanos` after [`clock_base`].
fn instant_at(nanos: u64) -> Instant {
    clock_base() + std::time::Duration::from_nanos(nanos)
}

/// The instant `held_back_since` counts from: the first use in the process.
fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::SessionEvent;

    /// A sink with a budget that counts its notices.
    struct Sink {
        budget: DeliveryBudget,
        notified: AtomicUsize,
    }

    impl EventSink for Sink {
        fn send(&self, _event: SessionEvent) {}

        fn budget(&self) -> Option<&DeliveryBudget> {
            Some(&self.budget)
        }

        fn budget_notice(&self) {
            self.notified.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn sink(max_bytes: u64) -> (Arc<Sink>, Arc<dyn EventSink>) {
        let sink = Arc::new(Sink {
            budget: DeliveryBudget::new(max_bytes),
            notified: AtomicUsize::new(0),
        });
        let erased: Arc<dyn EventSink> = sink.clone();
        (sink, erased)
    }

    impl Sink {
        fn notified(&self) -> usize {
            self.notified.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn a_full_budget_refuses_until_charges_are_returned() {
        let (sink, erased) = sink(100);
        assert!(has_room(&*sink));
        let a = DeliveryCharge::on(&erased, 60);
        assert!(has_room(&*sink), "not full yet");
        let b = DeliveryCharge::on(&erased, 60);
        assert!(!has_room(&*sink), "120 of 100 used");
        assert!(sink.budget.held_back_since().is_some());
        drop(a);
        assert!(has_room(&*sink), "60 of 100 used");
        drop(b);
        assert_eq!(sink.budget.used_bytes(), 0);
    }

    #[test]
    fn one_message_larger_than_the_budget_is_admitted_alone() {
        let (sink, erased) = sink(100);
        assert!(has_room(&*sink));
        let big = DeliveryCharge::on(&erased, 1_000);
        assert!(!has_room(&*sink));
        drop(big);
        assert!(has_room(&*sink));
    }

    /// A reader that reads ahead stops at `READ_AHEAD_BYTES` however large
    /// the budget, is resumed at half of it (not at half the budget, which
    /// it is already below: that would resume it at once, in a loop), and
    /// is not a full budget for the slow-consumer deadline.
    #[test]
    fn a_read_ahead_stops_at_its_size_and_resumes_at_half_of_it() {
        let (sink, erased) = sink(4 * READ_AHEAD_BYTES);
        let step = READ_AHEAD_BYTES / 8;
        assert_eq!(has_room_to_read_ahead(&*sink), Some(READ_AHEAD_BYTES));
        let mut charges: Vec<_> = (0..3).map(|_| DeliveryCharge::on(&erased, step)).collect();
        assert_eq!(
            has_room_to_read_ahead(&*sink),
            Some(READ_AHEAD_BYTES - 3 * step),
            "the room left is what a reader may read"
        );
        charges.extend((0..5).map(|_| DeliveryCharge::on(&erased, step)));
        assert_eq!(
            has_room_to_read_ahead(&*sink),
            None,
            "the read-ahead is full"
        );
        assert_eq!(sink.notified(), 1, "told that the core waits");
        assert!(has_room(&*sink), "others still have the budget");
        assert!(sink.budget.held_back_since().is_some());
        assert!(sink.budget.full_since().is_none(), "not a full budget");
        assert!(!sink.budget.take_resume(), "nothing written yet");
        for _ in 0..3 {
            drop(charges.pop());
        }
        assert!(!sink.budget.take_resume(), "5 of 8 steps still wait");
        assert_eq!(sink.notified(), 1);
        drop(charges.pop());
        assert_eq!(sink.notified(), 2, "at half the read-ahead");
        assert!(sink.budget.take_resume());
        assert!(sink.budget.held_back_since().is_none());
    }

    /// A full budget's hold replaces a read-ahead one, so the slow-consumer
    /// deadline times it and the core resumes only at half the budget.
    #[test]
    fn a_full_budget_takes_over_a_read_ahead_hold() {
        let (sink, erased) = sink(2 * READ_AHEAD_BYTES);
        let ahead = DeliveryCharge::on(&erased, READ_AHEAD_BYTES);
        assert_eq!(has_room_to_read_ahead(&*sink), None);
        assert!(sink.budget.full_since().is_none());
        let full = DeliveryCharge::on(&erased, READ_AHEAD_BYTES);
        assert!(!has_room(&*sink));
        assert!(sink.budget.full_since().is_some(), "now a full budget");
        assert_eq!(sink.notified(), 1, "the driver was told already");
        drop(ahead);
        assert!(sink.budget.take_resume(), "at half the budget");
        drop(full);
    }

    #[test]
    fn the_driver_is_notified_at_the_low_watermark_and_resumes_the_core_once() {
        let (sink, erased) = sink(100);
        let charges: Vec<_> = (0..10).map(|_| DeliveryCharge::on(&erased, 10)).collect();
        assert!(!has_room(&*sink));
        assert_eq!(sink.notified(), 1, "told that the core waits");
        assert!(!has_room(&*sink));
        assert_eq!(sink.notified(), 1, "told once");
        assert!(!sink.budget.take_resume(), "still full");
        let mut charges = charges.into_iter();
        for c in charges.by_ref().take(4) {
            drop(c);
        }
        assert_eq!(sink.notified(), 1, "60 used: above half");
        drop(charges.next());
        assert_eq!(sink.notified(), 2, "50 used: at half");
        assert!(sink.budget.take_resume());
        assert!(!sink.budget.take_resume(), "resumed once");
        assert!(sink.budget.held_back_since().is_none());
    }

    #[test]
    fn nothing_is_notified_when_the_core_never_waited() {
        let (sink, erased) = sink(100);
        drop(DeliveryCharge::on(&erased, 90));
        assert_eq!(sink.notified(), 0);
        assert!(!sink.budget.take_resume());
    }

    #[test]
    fn a_clone_of_a_charge_returns_nothing() {
        let (sink, erased) = sink(100);
        let charge = DeliveryCharge::on(&erased, 40);
        let copy = charge.clone();
        assert_eq!(copy.bytes(), 0);
        drop(copy);
        assert_eq!(sink.budget.used_bytes(), 40);
        drop(charge);
        assert_eq!(sink.budget.used_bytes(), 0);
    }

    #[test]
    fn a_sink_without_a_budget_always_has_room_and_charges_nothing() {
        struct Unbounded;
        impl EventSink for Unbounded {
            fn send(&self, _event: SessionEvent) {}
        }
        let sink: Arc<dyn EventSink> = Arc::new(Unbounded);
        assert!(has_room(&*sink));
        assert_eq!(DeliveryCharge::on(&sink, 10).bytes(), 0);
    }
}
