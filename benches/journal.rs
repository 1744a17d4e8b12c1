//! Journal throughput under group commit.
//!
//! N concurrent writers (1, 16, 256) each append one durable 1 KiB message
//! record with `SyncPolicy::EveryCommit` and wait for its completion before
//! the next, like producers awaiting their acknowledgements. Prints
//! records/s, commit latency percentiles, and the raw `write(1 KiB) +
//! fdatasync` rate of the same disk measured in the same run, and the
//! ratio. Then a short criterion benchmark of single-writer commit latency.
//!
//! Writers run two ways. As tokio tasks on two worker threads (`tasks`),
//! which is how the broker runs its connections: a completion wakes a task,
//! and one worker thread wake-up serves many tasks. And as one OS thread per
//! writer (`threads`), where every completion is a futex wake-up of its own
//! thread: on two virtual CPUs that costs more than the disk, so that row
//! measures the scheduler more than the journal.
//!
//! `JOURNAL_BENCH_SECS` (default 8) sets the run time per writer count;
//! `JOURNAL_BENCH_DIR` the directory (default: the system temp dir).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::Criterion;
use rosetta::core::codec;
use rosetta::store::{Record, Store, StoreConfig, SyncPolicy};
use rosetta_neutral::Message;

const PAYLOAD_BYTES: usize = 1024;
const WRITER_COUNTS: [usize; 3] = [1, 16, 256];
const RAW_SYNC_SECS: u64 = 4;

fn bench_dir() -> PathBuf {
    std::env::var_os("JOURNAL_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

fn run_secs() -> u64 {
    std::env::var("JOURNAL_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}

/// `write(1 KiB) + fdatasync` in a loop: what one producer gets without
/// group commit.
fn raw_sync_rate(dir: &Path, secs: u64) -> f64 {
    let path = dir.join("raw-fdatasync.probe");
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .expect("create probe file");
    let buf = vec![0xA5u8; PAYLOAD_BYTES];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        f.write_all(&buf).expect("write probe");
        f.sync_data().expect("fdatasync probe");
        n += 1;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&path);
    rate
}

/// How the concurrent writers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// tokio tasks on a 2-worker runtime (the broker's model).
    Tasks,
    /// One OS thread per writer.
    Threads,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Tasks => "tasks",
            Mode::Threads => "threads",
        }
    }
}

struct RunResult {
    writers: usize,
    mode: Mode,
    records: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
    syncs: u64,
}

fn message() -> Arc<Message> {
    let mut m = Message::binary(Bytes::from(vec![0x5Au8; PAYLOAD_BYTES]));
    m.durable = true;
    Arc::new(m)
}

/// Commits one record and waits for its completion.
fn commit_one(
    store: &Store,
    seq: u64,
    message: &Arc<Message>,
    tx: &mpsc::Sender<bool>,
    rx: &mpsc::Receiver<bool>,
) {
    let tx = tx.clone();
    store.append(
        vec![Record::Message {
            seq,
            queues: vec![1],
            body: codec::opaque(message),
        }],
        Some(Box::new(move |r| {
            let _ = tx.send(r.is_ok());
        })),
    );
    assert!(rx.recv().expect("completion"), "commit failed");
}

/// Writers as tokio tasks: each appends, awaits its completion through a
/// oneshot channel, and records the latency.
fn task_writers(
    store: &Arc<Store>,
    seq: &Arc<AtomicU64>,
    writers: usize,
    deadline: Instant,
) -> Vec<u32> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let tasks: Vec<_> = (0..writers)
            .map(|_| {
                let store = store.clone();
                let seq = seq.clone();
                tokio::spawn(async move {
                    let message = message();
                    let mut lat = Vec::new();
                    while Instant::now() < deadline {
                        let t = Instant::now();
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        store.append(
                            vec![Record::Message {
                                seq: seq.fetch_add(1, Ordering::Relaxed),
                                queues: vec![1],
                                body: codec::opaque(&message),
                            }],
                            Some(Box::new(move |r| {
                                let _ = tx.send(r.is_ok());
                            })),
                        );
                        assert!(rx.await.expect("completion"), "commit failed");
                        lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
                    }
                    lat
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("writer task"));
        }
        all
    })
}

fn run_writers(dir: &Path, writers: usize, mode: Mode, secs: u64) -> RunResult {
    let tmp = tempfile::tempdir_in(dir).expect("tempdir");
    let mut config = StoreConfig::new(tmp.path());
    config.sync = SyncPolicy::EveryCommit;
    let (store, _) = Store::open(config).expect("open store");
    let store = Arc::new(store);
    let seq = Arc::new(AtomicU64::new(1));
    let syncs_before = store.stats().syncs;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    if mode == Mode::Tasks {
        let mut latencies_us = task_writers(&store, &seq, writers, deadline);
        let elapsed = start.elapsed();
        let syncs = store.stats().syncs - syncs_before;
        match Arc::try_unwrap(store) {
            Ok(store) => store.close().expect("close"),
            Err(_) => panic!("store still shared"),
        }
        latencies_us.sort_unstable();
        return RunResult {
            writers,
            mode,
            records: latencies_us.len() as u64,
            elapsed,
            latencies_us,
            syncs,
        };
    }
    let handles: Vec<_> = (0..writers)
        .map(|_| {
            let store = store.clone();
            let seq = seq.clone();
            std::thread::spawn(move || {
                let message = message();
                let (tx, rx) = mpsc::channel();
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    commit_one(
                        &store,
                        seq.fetch_add(1, Ordering::Relaxed),
                        &message,
                        &tx,
                        &rx,
                    );
                    lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                lat
            })
        })
        .collect();
    let mut latencies_us = Vec::new();
    for h in handles {
        latencies_us.extend(h.join().expect("writer thread"));
    }
    let elapsed = start.elapsed();
    let syncs = store.stats().syncs - syncs_before;
    match Arc::try_unwrap(store) {
        Ok(store) => store.close().expect("close"),
        Err(_) => panic!("store still shared"),
    }
    latencies_us.sort_unstable();
    RunResult {
        writers,
        mode,
        records: latencies_us.len() as u64,
        elapsed,
        latencies_us,
        syncs,
    }
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)]) / 1000.0
}

fn main() {
    let dir = bench_dir();
    let secs = run_secs();
    println!(
        "journal bench: dir {} ({} s per writer count)",
        dir.display(),
        secs
    );
    let raw = raw_sync_rate(&dir, RAW_SYNC_SECS);
    println!("raw write(1 KiB)+fdatasync on the same disk: {raw:.0} syncs/s");
    println!();
    println!(
        "{:>8} {:>8} {:>12} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "writers",
        "as",
        "records/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "syncs/s",
        "records/sync",
        "x raw"
    );
    let mut results = Vec::new();
    for mode in [Mode::Tasks, Mode::Threads] {
        for writers in WRITER_COUNTS {
            let r = run_writers(&dir, writers, mode, secs);
            let rate = r.records as f64 / r.elapsed.as_secs_f64();
            println!(
                "{:>8} {:>8} {:>12.0} {:>10.2} {:>10.2} {:>10.2} {:>10.0} {:>12.1} {:>10.1}",
                r.writers,
                r.mode.name(),
                rate,
                percentile(&r.latencies_us, 0.50),
                percentile(&r.latencies_us, 0.99),
                percentile(&r.latencies_us, 1.0),
                r.syncs as f64 / r.elapsed.as_secs_f64(),
                r.records as f64 / r.syncs.max(1) as f64,
                rate / raw,
            );
            results.push((writers, mode, rate));
        }
    }
    println!();
    for (writers, mode, rate) in &results {
        if *writers == 256 {
            let goal = 50_000.0;
            println!(
                "goal: 256 writers ({}) >= {goal:.0} records/s: {} ({rate:.0}, {:.0} x raw fdatasync)",
                mode.name(),
                if *rate >= goal { "met" } else { "NOT met" },
                rate / raw
            );
        }
    }

    // Criterion: single-writer commit latency (one append + fdatasync).
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    let tmp = tempfile::tempdir_in(&dir).expect("tempdir");
    let (store, _) = Store::open(StoreConfig::new(tmp.path())).expect("open store");
    let message = message();
    let (tx, rx) = mpsc::channel();
    let mut seq = 1u64;
    c.bench_function("journal/commit_1KiB_every_commit_1_writer", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                commit_one(&store, seq, &message, &tx, &rx);
                seq += 1;
            }
            start.elapsed()
        })
    });
    store.close().expect("close");
    c.final_summary();
}
