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
//! - The connection's driver makes one budget per connection and hands it
//!   to the core through [`EventSink::budget`](crate::EventSink::budget).
//! - The core asks [`DeliveryBudget::try_room`] before it hands a consumer of
//!   that connection a message, and charges the message to the budget: the
//!   [`DeliveryCharge`] travels inside the [`Delivery`](crate::Delivery).
//! - The adapter drops the delivery (and so its charge) once it has turned
//!   it into output bytes; a delivery the adapter holds back for its own
//!   flow control (an AMQP session window, MQTT's receive maximum) stays
//!   charged while it waits.
//! - When a charge brings a held-back budget down to half its size, the
//!   budget asks its connection's driver to [resume](DeliveryBudget::resume)
//!   the core, which dispatches to that connection's consumers again. The
//!   hysteresis keeps a busy connection from waking the core per message.
//!
//! Admission checks only that the budget is not yet full, so one message
//! larger than the whole budget still goes through (alone): a budget bounds
//! memory, it never makes a message undeliverable.
//!
//! The output buffer is not charged: a driver takes new events only once it
//! has written its previous output, so a connection holds at most its
//! budget in waiting deliveries plus one batch being written.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// A callback the budget runs; see [`DeliveryBudget::set_notify`] and
/// [`DeliveryBudget::set_resume`].
pub type BudgetCallback = Box<dyn Fn() + Send + Sync>;

/// One connection's allowance for deliveries it has not yet written.
pub struct DeliveryBudget {
    max_bytes: u64,
    used_bytes: AtomicU64,
    /// The core held a delivery back for lack of room and waits to be
    /// resumed.
    held_back: AtomicBool,
    /// When the budget was first found full since it last resumed, for the
    /// driver's slow-consumer deadline: nanoseconds since [`clock_base`]
    /// (at least 1), 0 for none. An atomic rather than a locked
    /// `Option<Instant>` (8 bytes, not 24: one budget per connection).
    held_back_since: AtomicU64,
    /// Wakes the connection's driver (set by the driver).
    notify: OnceLock<BudgetCallback>,
    /// Dispatches to the connection's consumers again (set by the core).
    resume: OnceLock<BudgetCallback>,
}

impl std::fmt::Debug for DeliveryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryBudget")
            .field("max_bytes", &self.max_bytes)
            .field("used_bytes", &self.used_bytes())
            .field("held_back", &self.held_back.load(Ordering::Relaxed))
            .finish()
    }
}

impl DeliveryBudget {
    /// A budget of `max_bytes` (at least 1).
    pub fn new(max_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            max_bytes: max_bytes.max(1),
            used_bytes: AtomicU64::new(0),
            held_back: AtomicBool::new(false),
            held_back_since: AtomicU64::new(0),
            notify: OnceLock::new(),
            resume: OnceLock::new(),
        })
    }

    /// The budget's size.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Bytes of deliveries charged now.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::SeqCst)
    }

    /// Whether a delivery may be charged now. When it may not, the budget
    /// remembers that the core is waiting, and resumes it once there is
    /// room again; so the core may simply stop dispatching to this
    /// connection after a `false`.
    pub fn try_room(&self) -> bool {
        if self.used_bytes() < self.max_bytes {
            return true;
        }
        if !self.held_back.swap(true, Ordering::SeqCst) {
            let since = Instant::now().saturating_duration_since(clock_base());
            let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX).max(1);
            self.held_back_since.store(nanos, Ordering::SeqCst);
            // The driver learns that the core now waits, so it can time a
            // peer that stopped reading (its slow-consumer deadline).
            if let Some(notify) = self.notify.get() {
                notify();
            }
        }
        // Checked again after the flag is up: a charge dropped between the
        // first check and the flag saw no waiter, so room it made would
        // otherwise go unnoticed (see `DeliveryCharge::drop`).
        self.used_bytes() < self.max_bytes
    }

    /// Charges `bytes` to the budget. The charge is returned when the
    /// result is dropped.
    pub fn charge(self: &Arc<Self>, bytes: u64) -> DeliveryCharge {
        self.used_bytes.fetch_add(bytes, Ordering::SeqCst);
        DeliveryCharge {
            budget: Some((Arc::clone(self), bytes)),
        }
    }

    /// Since when the core has been waiting for room, if it is.
    pub fn held_back_since(&self) -> Option<Instant> {
        if !self.held_back.load(Ordering::SeqCst) {
            return None;
        }
        match self.held_back_since.load(Ordering::SeqCst) {
            0 => None,
            nanos => Some(clock_base() + std::time::Duration::from_nanos(nanos)),
        }
    }

    /// Sets the callback that wakes the connection's driver when the core
    /// should be resumed. The first call wins.
    pub fn set_notify(&self, notify: BudgetCallback) {
        let _ = self.notify.set(notify);
    }

    /// Sets the callback that dispatches to the connection's consumers
    /// again. The first call wins.
    pub fn set_resume(&self, resume: BudgetCallback) {
        let _ = self.resume.set(resume);
    }

    /// For the driver, outside any call into the core or the adapter:
    /// resumes the core if it waits and the budget is down to its low
    /// watermark. Returns whether it did.
    pub fn resume_if_due(&self) -> bool {
        if !self.held_back.load(Ordering::SeqCst) || self.used_bytes() > self.low_watermark() {
            return false;
        }
        if !self.held_back.swap(false, Ordering::SeqCst) {
            return false;
        }
        self.held_back_since.store(0, Ordering::SeqCst);
        if let Some(resume) = self.resume.get() {
            resume();
        }
        true
    }

    fn low_watermark(&self) -> u64 {
        self.max_bytes / 2
    }

    fn uncharge(&self, bytes: u64) {
        let after = self
            .used_bytes
            .fetch_sub(bytes, Ordering::SeqCst)
            .saturating_sub(bytes);
        // Every uncharge at or below the watermark wakes a waiting core's
        // driver, not only the one that crosses it: the core may have given
        // up below the watermark (one message larger than the budget).
        // `resume_if_due` clears the wait, so the wake-ups stop there.
        if after <= self.low_watermark() && self.held_back.load(Ordering::SeqCst) {
            if let Some(notify) = self.notify.get() {
                notify();
            }
        }
    }
}

/// Bytes of one delivery charged to its connection's [`DeliveryBudget`],
/// returned on drop. A clone carries no charge: the original's owner
/// decides when the bytes are gone.
#[derive(Default)]
pub struct DeliveryCharge {
    budget: Option<(Arc<DeliveryBudget>, u64)>,
}

impl DeliveryCharge {
    /// A charge of nothing (deliveries to a connection without a budget).
    pub fn none() -> Self {
        Self::default()
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
    fn drop(&mut self) {
        if let Some((budget, bytes)) = self.budget.take() {
            budget.uncharge(bytes);
        }
    }
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

    #[test]
    fn a_full_budget_refuses_until_charges_are_returned() {
        let budget = DeliveryBudget::new(100);
        assert!(budget.try_room());
        let a = budget.charge(60);
        assert!(budget.try_room(), "not full yet");
        let b = budget.charge(60);
        assert!(!budget.try_room(), "120 of 100 used");
        assert!(budget.held_back_since().is_some());
        drop(a);
        assert!(budget.try_room(), "60 of 100 used");
        drop(b);
        assert_eq!(budget.used_bytes(), 0);
    }

    #[test]
    fn one_message_larger_than_the_budget_is_admitted_alone() {
        let budget = DeliveryBudget::new(100);
        assert!(budget.try_room());
        let big = budget.charge(1_000);
        assert!(!budget.try_room());
        drop(big);
        assert!(budget.try_room());
    }

    #[test]
    fn the_driver_is_notified_at_the_low_watermark_and_resumes_the_core_once() {
        let budget = DeliveryBudget::new(100);
        let notified = Arc::new(AtomicUsize::new(0));
        let resumed = Arc::new(AtomicUsize::new(0));
        let n = Arc::clone(&notified);
        budget.set_notify(Box::new(move || {
            n.fetch_add(1, Ordering::SeqCst);
        }));
        let r = Arc::clone(&resumed);
        budget.set_resume(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        let charges: Vec<_> = (0..10).map(|_| budget.charge(10)).collect();
        assert!(!budget.try_room());
        assert_eq!(
            notified.load(Ordering::SeqCst),
            1,
            "told that the core waits"
        );
        assert!(!budget.try_room());
        assert_eq!(notified.load(Ordering::SeqCst), 1, "told once");
        assert!(!budget.resume_if_due(), "still full");
        let mut charges = charges.into_iter();
        for c in charges.by_ref().take(4) {
            drop(c);
        }
        assert_eq!(notified.load(Ordering::SeqCst), 1, "60 used: above half");
        drop(charges.next());
        assert_eq!(notified.load(Ordering::SeqCst), 2, "50 used: at half");
        assert!(budget.resume_if_due());
        assert!(!budget.resume_if_due(), "resumed once");
        assert_eq!(resumed.load(Ordering::SeqCst), 1);
        assert!(budget.held_back_since().is_none());
    }

    #[test]
    fn nothing_is_notified_when_the_core_never_waited() {
        let budget = DeliveryBudget::new(100);
        let notified = Arc::new(AtomicUsize::new(0));
        let n = Arc::clone(&notified);
        budget.set_notify(Box::new(move || {
            n.fetch_add(1, Ordering::SeqCst);
        }));
        drop(budget.charge(90));
        assert_eq!(notified.load(Ordering::SeqCst), 0);
        assert!(!budget.resume_if_due());
    }

    #[test]
    fn a_clone_of_a_charge_returns_nothing() {
        let budget = DeliveryBudget::new(100);
        let charge = budget.charge(40);
        let copy = charge.clone();
        assert_eq!(copy.bytes(), 0);
        drop(copy);
        assert_eq!(budget.used_bytes(), 40);
        drop(charge);
        assert_eq!(budget.used_bytes(), 0);
    }
}
