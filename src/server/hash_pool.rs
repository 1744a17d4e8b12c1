//! A small, bounded pool of OS threads for password hashing.
//!
//! An argon2 check costs about 14 ms of CPU (see [`crate::users::password`]).
//! Run on a tokio worker, a burst of logins would stall every connection
//! that worker serves; here it runs on a fixed number of threads of its
//! own, fed through a bounded queue. [`HashPool::try_run`] never blocks and
//! never queues without limit: past [`HashPool::queue_max`] waiting jobs it
//! refuses at once, and the caller answers the login with its protocol's
//! "server busy". How long a queued login can wait is about
//! `queue_max × 14 ms / threads`, which the defaults keep under the
//! connect timeout.
//!
//! Dropping the pool closes the queue; the threads finish the jobs already
//! queued and exit, and the drop waits for them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
// The limits are the configuration's, which checks them at start; the pool
// clamps to them again so that no caller can exceed them.
use rosetta_config::{PASSWORD_CHECK_QUEUE_MAX_LIMIT, PASSWORD_CHECK_THREADS_MAX};

/// Hashing threads by default: half the cores, at least one, so that a
/// login storm takes at most half the machine from the traffic already
/// flowing.
pub fn threads_default() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// A job for the pool.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// Why a job was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The queue is full.
    #[error("the hashing queue is full ({0} waiting)")]
    Busy(usize),
    /// The pool has no threads left (they could not be started).
    #[error("the hashing pool has no threads")]
    Stopped,
}

/// The pool. See the module docs.
pub struct HashPool {
    queue: Option<SyncSender<Job>>,
    /// Jobs queued and not yet taken by a thread.
    waiting: Arc<AtomicUsize>,
    queue_max: usize,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for HashPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashPool")
            .field("threads", &self.threads.len())
            .field("queue_max", &self.queue_max)
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl HashPool {
    /// Starts `threads` threads (1 to [`PASSWORD_CHECK_THREADS_MAX`]) with room for
    /// `queue_max` waiting jobs (0: a job is taken only by an idle thread).
    pub fn new(threads: usize, queue_max: usize) -> std::io::Result<Self> {
        let threads = threads.clamp(1, PASSWORD_CHECK_THREADS_MAX);
        let queue_max = queue_max.min(PASSWORD_CHECK_QUEUE_MAX_LIMIT);
        let (tx, rx) = mpsc::sync_channel::<Job>(queue_max);
        let rx = Arc::new(Mutex::new(rx));
        let waiting = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let (rx, waiting) = (Arc::clone(&rx), Arc::clone(&waiting));
            let handle = std::thread::Builder::new()
                .name(format!("rosetta-hash-{i}"))
                .spawn(move || work(&rx, &waiting))?;
            handles.push(handle);
        }
        Ok(Self {
            queue: Some(tx),
            waiting,
            queue_max,
            threads: handles,
        })
    }

    /// Queues `job` for a hashing thread, or refuses at once when the
    /// queue is full.
    pub fn try_run(&self, job: impl FnOnce() + Send + 'static) -> Result<(), PoolError> {
        let Some(queue) = &self.queue else {
            return Err(PoolError::Stopped);
        };
        // Counted before the send, so a thread taking it at once never
        // sees the count below zero.
        self.waiting.fetch_add(1, Ordering::Relaxed);
        match queue.try_send(Box::new(job)) {
            Ok(()) => Ok(()),
            Err(e) => {
                let was = self.waiting.fetch_sub(1, Ordering::Relaxed);
                match e {
                    TrySendError::Full(_) => Err(PoolError::Busy(was.saturating_sub(1))),
                    TrySendError::Disconnected(_) => Err(PoolError::Stopped),
                }
            }
        }
    }

    /// Jobs waiting for a thread now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Most jobs that may wait.
    pub fn queue_max(&self) -> usize {
        self.queue_max
    }

    /// The number of threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for HashPool {
    fn drop(&mut self) {
        // Closing the queue ends each thread once it is empty.
        self.queue = None;
        let me = std::thread::current().id();
        for handle in self.threads.drain(..) {
            // A job that dropped the last owner of its pool must not wait
            // for its own thread.
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

/// A hashing thread: takes jobs until the queue closes. A job that panics
/// is logged and does not take its thread with it.
fn work(rx: &Mutex<Receiver<Job>>, waiting: &AtomicUsize) {
    loop {
        // The lock is held only while waiting for the next job, never
        // while running one.
        let job = rx.lock().recv();
        let Ok(job) = job else {
            return;
        };
        waiting.fetch_sub(1, Ordering::Relaxed);
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::error!("a password check panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    /// Longest a test waits for a thread to do something.
    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn runs_jobs_off_the_callers_thread() {
        let pool = HashPool::new(2, 4).expect("pool");
        assert_eq!((pool.threads(), pool.queue_max()), (2, 4));
        let (tx, rx) = channel();
        let caller = std::thread::current().id();
        for i in 0..4 {
            let tx = tx.clone();
            pool.try_run(move || {
                let _ = tx.send((i, std::thread::current().id()));
            })
            .expect("room");
        }
        let mut seen: Vec<usize> = (0..4)
            .map(|_| {
                let (i, thread) = rx.recv_timeout(WAIT).expect("ran");
                assert_ne!(thread, caller);
                i
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3]);
    }

    /// One thread held by a job, a queue of two: the third job waiting is
    /// refused at once, and the queue takes jobs again once it drains.
    #[test]
    fn refuses_past_the_queue() {
        let pool = HashPool::new(1, 2).expect("pool");
        let (release_tx, release_rx) = channel::<()>();
        let (started_tx, started_rx) = channel();
        pool.try_run(move || {
            let _ = started_tx.send(());
            let _ = release_rx.recv_timeout(WAIT);
        })
        .expect("the thread takes it");
        started_rx.recv_timeout(WAIT).expect("the thread is busy");
        let (done_tx, done_rx) = channel();
        for _ in 0..2 {
            let done_tx = done_tx.clone();
            pool.try_run(move || {
                let _ = done_tx.send(());
            })
            .expect("room in the queue");
        }
        assert_eq!(pool.waiting(), 2);
        assert_eq!(pool.try_run(|| {}), Err(PoolError::Busy(2)));
        assert_eq!(pool.waiting(), 2, "a refused job is not counted");
        release_tx.send(()).expect("release");
        for _ in 0..2 {
            done_rx.recv_timeout(WAIT).expect("queued jobs ran");
        }
        pool.try_run(|| {}).expect("room again");
    }

    #[test]
    fn a_panicking_job_keeps_its_thread() {
        let pool = HashPool::new(1, 1).expect("pool");
        pool.try_run(|| panic!("boom")).expect("queued");
        let (tx, rx) = channel();
        // The queue may still hold the panicking job for a moment.
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let tx = tx.clone();
            match pool.try_run(move || {
                let _ = tx.send(());
            }) {
                Ok(()) => break,
                Err(PoolError::Busy(_)) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("{e}"),
            }
        }
        rx.recv_timeout(WAIT).expect("the thread survived");
    }

    #[test]
    fn drop_finishes_queued_jobs() {
        let (tx, rx) = channel();
        {
            let pool = HashPool::new(1, 8).expect("pool");
            for i in 0..8 {
                let tx = tx.clone();
                pool.try_run(move || {
                    let _ = tx.send(i);
                })
                .expect("room");
            }
        }
        let ran: Vec<i32> = rx.try_iter().collect();
        assert_eq!(ran, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn limits_are_clamped() {
        let pool = HashPool::new(0, usize::MAX).expect("pool");
        assert_eq!(pool.threads(), 1);
        assert_eq!(pool.queue_max(), PASSWORD_CHECK_QUEUE_MAX_LIMIT);
        assert!(threads_default() >= 1);
    }
}
