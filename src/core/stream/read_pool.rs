//! Threads that read history for stream readers.
//!
//! A reader whose next record is not in the log's tail cache reads the
//! segment files: a `pread` from the page cache, or from the device when
//! the page cache does not hold it. Done where the reader is served (a
//! connection's task, on an async worker), a read from the device would
//! block that worker, and every connection it runs, for as long as the
//! device takes.
//!
//! So a reader served where it must not block reads only what memory
//! holds (`StreamLog::read_cached`, which asks the page cache first),
//! and a read that would wait for the device is handed to this small
//! pool of threads. A reader is queued at most once however often it is
//! asked to pump (`queued`), and one pump at a time runs per reader
//! (`Reader::pumping`).
//!
//! Why not every read of the files: handing each pump to a thread was
//! measured (docs/streams.md, seventh round) and cost a history read of
//! cached data 10-25% of its rate and 0.2 µs of CPU per message (the
//! hop's wake-ups, and messages allocated on one thread and freed on
//! another), for reads that do not block.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::{Reader, Streams};

/// Most threads reading history, whatever the machine: each can keep a
/// core busy reading and decoding, and more than this many history
/// readers at once share them.
const READ_THREADS_MAX: usize = 4;
/// How often an idle thread checks that its streams still exist.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// See the module docs.
#[derive(Default)]
pub(crate) struct ReadPool {
    /// The readers waiting for a thread, and whether the pool stopped.
    queue: Mutex<(VecDeque<Arc<Reader>>, bool)>,
    wake: Condvar,
    /// At least one thread started: without one, readers read the files
    /// where they are served, as before the pool.
    running: AtomicBool,
}

impl ReadPool {
    /// Starts the pool's threads for `streams`; a pool that cannot start
    /// one has its readers read the files where they are served (see
    /// [`Self::is_running`]).
    pub(crate) fn start(&self, streams: &Arc<Streams>) {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, READ_THREADS_MAX);
        let mut started = 0;
        for i in 0..threads {
            let weak = Arc::downgrade(streams);
            let spawned = std::thread::Builder::new()
                .name(format!("rosetta-stream-read-{i}"))
                .spawn(move || run(&weak));
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start a stream read thread");
                    break;
                }
            }
        }
        self.running.store(started > 0, Ordering::SeqCst);
    }

    /// Whether a pump may be handed to it.
    pub(crate) fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// Queues `reader` for a pool thread, unless it is queued already.
    pub(crate) fn schedule(&self, reader: &Arc<Reader>) {
        if reader.queued.swap(true, Ordering::SeqCst) {
            return;
        }
        self.queue.lock().0.push_back(Arc::clone(reader));
        self.wake.notify_one();
    }

    /// Stops the threads (the readers still queued are dropped).
    pub(crate) fn stop(&self) {
        self.running.store(false, Ordering::SeqCst);
        let mut q = self.queue.lock();
        q.1 = true;
        q.0.clear();
        drop(q);
        self.wake.notify_all();
    }
}

fn run(streams: &Weak<Streams>) {
    loop {
        let Some(pool) = streams.upgrade().map(|s| Arc::clone(&s.reads)) else {
            return;
        };
        let reader = {
            let mut q = pool.queue.lock();
            loop {
                if q.1 {
                    return;
                }
                if let Some(r) = q.0.pop_front() {
                    break r;
                }
                // Timed, so that a core dropped without being stopped
                // (tests) does not leave its threads waiting forever.
                if pool.wake.wait_for(&mut q, IDLE_CHECK).timed_out() && streams.strong_count() == 0
                {
                    return;
                }
            }
        };
        // Cleared before the pump: a request made while it runs queues
        // the reader again rather than being lost.
        reader.queued.store(false, Ordering::SeqCst);
        let Some(streams) = streams.upgrade() else {
            return;
        };
        reader.pump_here(&streams.groups);
    }
}
