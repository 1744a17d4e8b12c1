//! A stream's receipts, one event per session per group commit.
//!
//! A producer waiting for its appends to be durable used to be sent one
//! `Committed` event per append: a lock of its connection's event queue,
//! a slot in it, and a turn of the adapter's event handling each, for
//! receipts that all became due at the same instant, when the log's
//! writer synced the batch holding them. Now a successful append's
//! completion (on the writer thread) only adds its ticket to the run of
//! its session here, and the log's durable hook, which runs once the
//! batch's completions have, sends each run as one
//! [`SessionEvent::CommittedRun`] (a lone ticket as a plain
//! `Committed`). A failed append is reported at once, as before: a batch
//! fails or succeeds as a whole, so no run is pending then.
//!
//! Runs are bounded by the batch: the writer completes at most one
//! batch's appends before the hook runs.

use std::sync::Arc;

use parking_lot::Mutex;
use rosetta_neutral::{EventSink, SessionEvent, Ticket};

/// How many of the newest runs an append looks through for its
/// session's: producers of one stream interleave within a batch, and a
/// session not among the last few starts a run of its own (correct, only
/// less gathered).
const RUNS_SCANNED: usize = 4;

/// One session's tickets committed in the current batch, in order.
struct Run {
    sink: Arc<dyn EventSink>,
    first: Ticket,
    /// Those after `first` (no allocation for a run of one).
    more: Vec<Ticket>,
}

/// See the module docs.
#[derive(Default)]
pub(crate) struct CommitRuns(Mutex<Vec<Run>>);

fn same_sink(a: &Arc<dyn EventSink>, b: &Arc<dyn EventSink>) -> bool {
    std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>())
}

impl CommitRuns {
    /// `ticket` of the session behind `sink` is durable.
    pub(crate) fn push(&self, sink: Arc<dyn EventSink>, ticket: Ticket) {
        let mut runs = self.0.lock();
        let found = runs
            .iter_mut()
            .rev()
            .take(RUNS_SCANNED)
            .find(|r| same_sink(&r.sink, &sink));
        match found {
            Some(run) => run.more.push(ticket),
            None => runs.push(Run {
                sink,
                first: ticket,
                more: Vec::new(),
            }),
        }
    }

    /// Sends every run gathered (the batch's completions have run).
    pub(crate) fn flush(&self) {
        let runs = std::mem::take(&mut *self.0.lock());
        for Run {
            sink,
            first,
            mut more,
        } in runs
        {
            if more.is_empty() {
                sink.send(SessionEvent::Committed {
                    ticket: first,
                    result: Ok(()),
                });
            } else {
                more.insert(0, first);
                sink.send(SessionEvent::CommittedRun { tickets: more });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Events(Mutex<Vec<SessionEvent>>);

    impl EventSink for Events {
        fn send(&self, event: SessionEvent) {
            self.0.lock().push(event);
        }
    }

    fn tickets(events: &Events) -> Vec<Vec<u64>> {
        events
            .0
            .lock()
            .drain(..)
            .map(|e| match e {
                SessionEvent::Committed {
                    ticket,
                    result: Ok(()),
                } => vec![ticket.0],
                SessionEvent::CommittedRun { tickets } => tickets.iter().map(|t| t.0).collect(),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[test]
    fn each_session_gets_its_batch_in_one_event_in_order() {
        let a = Arc::new(Events::default());
        let b = Arc::new(Events::default());
        let (sa, sb): (Arc<dyn EventSink>, Arc<dyn EventSink>) = (a.clone(), b.clone());
        let runs = CommitRuns::default();
        for t in [1, 2, 5, 6] {
            runs.push(Arc::clone(&sa), Ticket(t));
        }
        runs.push(Arc::clone(&sb), Ticket(3));
        runs.push(Arc::clone(&sa), Ticket(7));
        assert!(tickets(&a).is_empty(), "nothing before the batch is done");
        runs.flush();
        assert_eq!(tickets(&a), vec![vec![1, 2, 5, 6, 7]]);
        assert_eq!(
            tickets(&b),
            vec![vec![3]],
            "a lone ticket, a plain Committed"
        );
        runs.flush();
        assert!(tickets(&a).is_empty() && tickets(&b).is_empty());
    }

    #[test]
    fn a_session_past_the_scanned_runs_starts_another_in_order() {
        let sinks: Vec<Arc<Events>> = (0..RUNS_SCANNED + 1).map(|_| Arc::default()).collect();
        let runs = CommitRuns::default();
        let mut t = 0;
        for s in &sinks {
            t += 1;
            runs.push(Arc::clone(s) as Arc<dyn EventSink>, Ticket(t));
        }
        runs.push(Arc::clone(&sinks[0]) as Arc<dyn EventSink>, Ticket(100));
        runs.flush();
        assert_eq!(tickets(&sinks[0]), vec![vec![1], vec![100]]);
    }
}
