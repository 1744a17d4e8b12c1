//! Timers over the broker's shared state: a job run now and then every
//! period, until the broker stops accepting or is gone (the task holds
//! the state weakly, so it never keeps a stopped broker alive).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::Shared;

/// Runs `job` now and every `period` after (a late run delays the next
/// rather than bunching) until `stopping` changes or `shared` is dropped.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    period: Duration,
    mut stopping: watch::Receiver<bool>,
    mut job: impl FnMut(&Shared) + Send + 'static,
) {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopping.changed() => return,
            }
            match weak.upgrade() {
                Some(shared) => job(&shared),
                None => return,
            }
        }
    });
}
