//! Drives one sans-IO protocol connection over one transport.
//!
//! The adapters are state machines; this is the only place their bytes meet
//! a socket. One task per connection: it reads, feeds the state machine,
//! forwards the core's events, fires timers, and writes everything the
//! machine produced with one write and one flush per loop turn, so a burst
//! of deliveries costs one syscall, not one per frame.

use std::sync::Arc;
use std::time::Instant;

use std::collections::VecDeque;

use rosetta_neutral::{EventSink, SessionEvent};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Notify};
use tracing::Instrument;

/// Read buffer of a new (or quiet) connection: most connections are idle
/// most of the time, and the buffer is per connection, so it starts small.
const READ_BUFFER_MIN_BYTES: usize = 512;
/// The read buffer doubles up to this while reads keep filling it (a busy
/// producer), so a burst still costs few syscalls.
const READ_BUFFER_MAX_BYTES: usize = 64 * 1024;
/// Output capacity kept between writes; a burst's larger buffer is given
/// back afterwards.
const WRITE_BUFFER_KEPT_BYTES: usize = 16 * 1024;
/// Capacity of the event batch kept between turns; a burst's larger one is
/// given back.
const EVENT_BATCH_KEPT: usize = 256;

/// What the driver needs from a protocol state machine. Every adapter
/// exposes these as inherent methods; the impls in `protocols.rs` forward.
pub(crate) trait ProtocolConnection: Send + 'static {
    fn handle_input(&mut self, now: Instant, data: &[u8]);
    fn handle_event(&mut self, now: Instant, event: SessionEvent);
    fn handle_timeout(&mut self, now: Instant);
    fn poll_timeout(&self) -> Option<Instant>;
    fn poll_transmit(&mut self, out: &mut Vec<u8>);
    fn wants_input(&self) -> bool;
    fn is_closed(&self) -> bool;
    fn handle_transport_closed(&mut self, now: Instant);
}

/// The core's events for one connection, waiting for its task: a queue the
/// core pushes to and the task takes whole.
///
/// Not a tokio mpsc channel: an unbounded channel allocates a 32-slot block
/// (3 KiB here) per connection up front, which was the largest part of an
/// idle connection's memory. This queue allocates nothing until an event
/// arrives, and the task takes every waiting event with one lock.
/// Unbounded is safe because every producer is itself bounded: deliveries
/// by consumer credit, commits by the adapter's limit on pending commits.
#[derive(Default)]
pub(crate) struct EventQueue {
    events: parking_lot::Mutex<VecDeque<SessionEvent>>,
    ready: Notify,
}

impl EventQueue {
    /// Waits until events are queued, then moves them all into `batch`
    /// (which must be empty), keeping `batch`'s capacity for next time.
    async fn take_all(&self, batch: &mut VecDeque<SessionEvent>) {
        loop {
            {
                let mut events = self.events.lock();
                if !events.is_empty() {
                    std::mem::swap(&mut *events, batch);
                    return;
                }
            }
            // A push between the check and here leaves a permit: not lost.
            self.ready.notified().await;
        }
    }
}

/// The sink the core holds for one connection.
pub(crate) struct ChannelSink(Arc<EventQueue>);

impl EventSink for ChannelSink {
    fn send(&self, event: SessionEvent) {
        self.0.events.lock().push_back(event);
        self.0.ready.notify_one();
    }
}

/// A sink and the queue its events go to.
pub(crate) fn event_channel() -> (Arc<ChannelSink>, Arc<EventQueue>) {
    let queue = Arc::new(EventQueue::default());
    (Arc::new(ChannelSink(Arc::clone(&queue))), queue)
}

/// Runs `conn` over `io` until either side closes.
pub(crate) async fn drive<C, T>(
    mut conn: C,
    mut io: T,
    events: Arc<EventQueue>,
    span: tracing::Span,
    mut hard_stop: watch::Receiver<bool>,
) where
    C: ProtocolConnection,
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    async move {
        let mut rbuf = vec![0u8; READ_BUFFER_MIN_BYTES];
        let mut out = Vec::new();
        let mut batch = VecDeque::new();
        loop {
            conn.poll_transmit(&mut out);
            if !out.is_empty() {
                let written = async {
                    io.write_all(&out).await?;
                    io.flush().await
                }
                .await;
                out.clear();
                out.shrink_to(WRITE_BUFFER_KEPT_BYTES);
                if let Err(e) = written {
                    tracing::debug!(error = %e, "write failed; closing");
                    conn.handle_transport_closed(Instant::now());
                    break;
                }
            }
            if conn.is_closed() {
                let _ = io.shutdown().await;
                break;
            }
            let deadline = conn.poll_timeout();
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                read = io.read(&mut rbuf), if conn.wants_input() => match read {
                    Ok(0) => {
                        tracing::debug!("peer closed the connection");
                        conn.handle_transport_closed(Instant::now());
                        conn.poll_transmit(&mut out);
                        break;
                    }
                    Ok(n) => {
                        conn.handle_input(Instant::now(), &rbuf[..n]);
                        resize_read_buffer(&mut rbuf, n);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "read failed; closing");
                        conn.handle_transport_closed(Instant::now());
                        break;
                    }
                },
                () = events.take_all(&mut batch) => {
                    // Everything that piled up, then one write for all of it.
                    let now = Instant::now();
                    for event in batch.drain(..) {
                        conn.handle_event(now, event);
                    }
                    batch.shrink_to(EVENT_BATCH_KEPT);
                },
                () = sleep => conn.handle_timeout(Instant::now()),
                changed = hard_stop.changed() => {
                    if changed.is_err() || *hard_stop.borrow() {
                        tracing::debug!("shutdown grace period over; cutting the connection");
                        conn.handle_transport_closed(Instant::now());
                        break;
                    }
                }
            }
        }
        if !out.is_empty() {
            let _ = io.write_all(&out).await;
        }
        tracing::debug!("connection finished");
    }
    .instrument(span)
    .await;
}

/// Grows the read buffer when a read filled it (more is waiting: fewer,
/// larger reads) and shrinks it back when reads are small again (an idle
/// connection should not keep a burst's buffer).
fn resize_read_buffer(rbuf: &mut Vec<u8>, last_read: usize) {
    let len = rbuf.len();
    if last_read == len && len < READ_BUFFER_MAX_BYTES {
        rbuf.resize(len * 2, 0);
    } else if len > READ_BUFFER_MIN_BYTES && last_read < len / 8 {
        rbuf.truncate(READ_BUFFER_MIN_BYTES);
        rbuf.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_buffer_grows_on_full_reads_and_shrinks_when_quiet() {
        let mut b = vec![0u8; READ_BUFFER_MIN_BYTES];
        while b.len() < READ_BUFFER_MAX_BYTES {
            let full = b.len();
            resize_read_buffer(&mut b, full);
        }
        assert_eq!(b.len(), READ_BUFFER_MAX_BYTES);
        resize_read_buffer(&mut b, READ_BUFFER_MAX_BYTES);
        assert_eq!(b.len(), READ_BUFFER_MAX_BYTES, "capped");
        resize_read_buffer(&mut b, 100);
        assert_eq!(b.len(), READ_BUFFER_MIN_BYTES);
        assert!(b.capacity() < READ_BUFFER_MAX_BYTES);
    }
}
