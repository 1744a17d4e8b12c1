//! The wall clock the core reads for time-based message state: expiry,
//! scheduled delivery and redelivery delay, all in milliseconds since the
//! Unix epoch (the unit of [`rosetta_neutral::Message::expiry`] and
//! [`rosetta_neutral::Message::delivery_time`]).
//!
//! The core takes its clock at construction ([`crate::Core::with_clock`]).
//! The real one is [`SystemClock`]; tests use a [`ManualClock`] they
//! advance by hand and then call [`crate::Core::run_timers`], so a test of
//! a one-hour schedule takes no time and no real sleep. Reading the clock
//! is one atomic load (manual) or one `clock_gettime` (system, a vDSO
//! call, no syscall), and it is read once per publish batch or dispatch,
//! never per message in a loop.

use std::sync::atomic::{AtomicU64, Ordering};

/// Milliseconds since the Unix epoch, as the core sees them.
pub trait Clock: Send + Sync + 'static {
    /// Now, in ms since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        rosetta_neutral::message::now_ms()
    }
}

/// A clock that moves only when told to (tests, simulations).
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    /// A clock stopped at `now_ms`.
    pub fn new(now_ms: u64) -> ManualClock {
        ManualClock {
            now_ms: AtomicU64::new(now_ms),
        }
    }

    /// Moves the clock `ms` forward.
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms` (forward or back, as a wall clock may).
    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}
