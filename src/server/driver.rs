//! Drives one sans-IO protocol connection over one transport.
//!
//! The adapters are state machines; this is the only place their bytes meet
//! a socket. One task per connection: it reads, feeds the state machine,
//! forwards the core's events, fires timers, and writes everything the
//! machine produced with one write and one flush per turn, so a burst of
//! deliveries costs one syscall, not one per frame.
//!
//! The driver is a hand-written future rather than an `async` loop over
//! `select!`, because most connections are idle most of the time and an
//! idle connection's memory is what this struct and its buffers hold: the
//! `async` version kept every branch's future (sleep, notify, watch) in its
//! state, 1.2 KB, and a read buffer pinned by the pending read. Here an
//! idle plain-TCP connection owns no read buffer at all (it waits for
//! readiness, then borrows one), no event buffer and no timer unless the
//! protocol has a deadline.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::task::AtomicWaker;
use rosetta_neutral::{DeliveryBudget, EventSink, SessionEvent};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::coarse_timer::{CoarseTimer, Slot};
use crate::connections::RegistryGuard;
use crate::parking::PARK_AFTER_TICKS;

/// Read buffer of a new (or quiet) connection: the buffer is per
/// connection and most connections are idle, so it starts small.
const READ_BUFFER_MIN_BYTES: usize = 512;
/// The read buffer doubles up to this while reads keep filling it (a busy
/// producer), so a burst still costs few syscalls.
const READ_BUFFER_MAX_BYTES: usize = 64 * 1024;
/// Output capacity kept between writes while writes stay large; a burst's
/// larger buffer is given back afterwards. As large as the biggest read,
/// so a connection relaying a busy producer's reads (AMQP hands its output
/// buffer over and gets this one back) does not regrow its buffer by
/// doubling, copying it each time, on every turn.
const WRITE_BUFFER_KEPT_BYTES: usize = 64 * 1024;
/// A write at most this large does not keep its buffer: a quiet connection
/// pays one allocation per write instead of holding memory while idle.
const WRITE_BUFFER_FREED_BELOW_BYTES: usize = 1024;
/// Capacity of the event batch kept between turns; a burst's larger one is
/// given back.
const EVENT_BATCH_KEPT: usize = 256;
/// A batch at most this long does not keep its buffer (see the write
/// buffer).
const EVENT_BATCH_FREED_BELOW: usize = 8;
/// How often a connection that stopped reading under back-pressure checks
/// whether it may read again.
const INPUT_RECHECK_INTERVAL: Duration = Duration::from_millis(50);
/// Input after at least this many [`INPUT_TICK_US`] ticks (256 µs)
/// without any is "after a quiet spell": its deliveries to other
/// connections are written before this connection's acknowledgements (see
/// [`Driver::let_peers_write_first`]). A connection sending faster than
/// one read per this interval keeps its batching instead (a yield per read
/// cost a third more CPU per delivery in a 1 -> 100 fan-out at full
/// speed).
const QUIET_INPUT_TICKS: u16 = 4;
/// The unit of the driver's input clock, in µs: coarse, so that two bytes
/// per connection hold it (it wraps every 4 s, which only ever makes a
/// longer gap look short: one yield less).
const INPUT_TICK_US: u128 = 64;
/// Turns one poll may take before yielding to the scheduler: events and
/// timers do not consume tokio's cooperative budget, so a connection fed
/// events without pause must yield by itself to keep its worker fair.
const TURNS_PER_POLL: u32 = 32;
/// How long a connection closed by the broker (a slow consumer) gets to
/// take its last frames before the socket is cut: the peer that was not
/// reading may never read them.
const FAREWELL_TIMEOUT: Duration = Duration::from_secs(2);

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

    /// The peer has stopped reading and its deliveries have filled the
    /// connection's delivery budget for longer than the slow-consumer
    /// limit: say why in the protocol's own way and close.
    fn handle_slow_consumer(&mut self, now: Instant);

    /// The delivery budget has room again after the core held deliveries
    /// back: the adapter resumes its session
    /// ([`rosetta_neutral::Session::resume_deliveries`]).
    fn resume_deliveries(&mut self);

    /// The protocol's own parse buffer, for an adapter that parses from a
    /// `BytesMut`: the driver reads straight into its spare capacity, so
    /// input is copied once (socket to buffer) and payloads become
    /// `Bytes` views of it. `None` (the default): the driver reads into a
    /// buffer of its own and hands [`Self::handle_input`] a slice, which
    /// the adapter then copies.
    fn input_buffer(&mut self) -> Option<&mut BytesMut> {
        None
    }

    /// Bytes were appended to [`Self::input_buffer`]: parse them.
    fn handle_buffered_input(&mut self, _now: Instant) {}

    /// The connection is about to park (it is quiet): free what only
    /// traffic uses if it is empty, so a device that once had traffic
    /// sleeps as small as one that never had (issue 20). The default
    /// keeps everything.
    fn shrink_when_parked(&mut self) {}
}

/// A byte transport the driver can run a connection over.
///
/// `poll_read_ready` lets an idle connection wait without lending a buffer
/// to a pending read. Transports that cannot report readiness (TLS,
/// WebSocket: bytes may already be buffered inside them) keep the default,
/// which says "ready" and so falls back to a read that holds its buffer
/// while it waits.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin + Send {
    /// Ready when a read will not wait.
    fn poll_read_ready(&self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Whether `poll_read_ready` is real, so the read buffer can be freed
    /// between reads.
    fn reports_readiness(&self) -> bool {
        false
    }

    /// Whether the transport holds nothing of the connection's now: no
    /// bytes read and not handed over, none to send, no frame under way.
    /// A parked connection keeps only its socket (and for a WebSocket a
    /// few bytes of framing state, see `parking`), so a driver parks only
    /// over a transport at rest. No, unless a transport knows.
    fn is_at_rest(&self) -> bool {
        false
    }
}

impl Transport for tokio::net::TcpStream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tokio::net::TcpStream::poll_read_ready(self, cx)
    }

    fn reports_readiness(&self) -> bool {
        true
    }

    fn is_at_rest(&self) -> bool {
        true
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Transport for tokio_rustls::server::TlsStream<S> {}

/// The core's events for one connection, waiting for its task, and the
/// connection's delivery budget: the sink the core holds, the queue the
/// task takes its events from and the budget, in one allocation of 128 B
/// (a jemalloc size class; three allocations of 216 B before, issue 20).
///
/// Not a tokio mpsc channel: an unbounded channel allocates a 32-slot block
/// (3 KiB here) per connection up front, which was the largest part of an
/// idle connection's memory. This queue allocates nothing until an event
/// arrives, and the task takes every waiting event with one lock.
/// Unbounded in count, bounded in what matters: deliveries by the
/// connection's [`DeliveryBudget`] in bytes (and by consumer credit),
/// commits by the adapter's limit on pending commits.
pub(crate) struct ChannelSink {
    events: parking_lot::Mutex<Queued>,
    waker: AtomicWaker,
    /// Inline: a delivery's charge holds the sink (see
    /// `rosetta_neutral::budget`), so the queue holds its own sink while
    /// deliveries wait; [`ChannelSink::close`] breaks that cycle. `None`
    /// costs nothing (the budget's size is never 0).
    budget: Option<DeliveryBudget>,
    /// The server's hard stop, which the task checks on each turn: here
    /// rather than in the task, whose size is per connection too and
    /// counts in steps of 128 bytes (issue 20).
    hard_stop: Arc<HardStop>,
    /// Messages in and out, for the admin API (two relaxed adds).
    traffic: crate::connections::ConnectionTraffic,
}

/// The task's side of a [`ChannelSink`]: the same allocation (see
/// [`event_channel`]).
pub(crate) type EventQueue = ChannelSink;

/// The events waiting for the task, and whether the task is gone.
#[derive(Default)]
struct Queued {
    /// A `Vec`, not a `VecDeque`: the task takes all of it at once, and
    /// the 8 bytes count toward the sink's size class (see its test).
    events: Vec<SessionEvent>,
    /// Set when the connection's driver goes ([`ChannelSink::close`]):
    /// later events are dropped at once, not queued, so no delivery's
    /// charge keeps the sink alive.
    closed: bool,
}

impl ChannelSink {
    /// Moves every queued event into `batch` (which must be empty),
    /// or registers the task to be woken by the next push.
    fn poll_take_all(&self, cx: &mut Context<'_>, batch: &mut Vec<SessionEvent>) -> bool {
        // Register first: a push after the check below then wakes us.
        self.waker.register(cx.waker());
        let mut queued = self.events.lock();
        if queued.events.is_empty() {
            return false;
        }
        std::mem::swap(&mut queued.events, batch);
        true
    }

    /// The driver is gone: drops what waits and every later event. Queued
    /// deliveries hold the sink through their charges, so without this a
    /// closed connection's sink would keep itself alive.
    fn close(&self) {
        let waiting = {
            let mut queued = self.events.lock();
            queued.closed = true;
            std::mem::take(&mut queued.events)
        };
        // Dropped outside the lock: a charge's drop reads the budget.
        drop(waiting);
    }

    /// Registers the task to be woken by the next push or budget notice
    /// without taking events (a driver whose write is stalled).
    fn register(&self, cx: &mut Context<'_>) {
        self.waker.register(cx.waker());
    }

    /// Wakes the connection's task without an event (it then sees the
    /// [`HardStop`]).
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// Has `waker` woken by the next push or wake instead of the task's
    /// (a parked connection's, see `parking`).
    pub(crate) fn set_waker(&self, waker: &std::task::Waker) {
        self.waker.register(waker);
    }

    /// Whether events wait to be taken.
    fn has_events(&self) -> bool {
        !self.events.lock().events.is_empty()
    }

    /// The events queued and not yet taken, for tests.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> Vec<SessionEvent> {
        self.events.lock().events.drain(..).collect()
    }

    /// The connection's message counts.
    pub(crate) fn traffic(&self) -> &crate::connections::ConnectionTraffic {
        &self.traffic
    }
}

impl EventSink for ChannelSink {
    fn send(&self, event: SessionEvent) {
        if matches!(event, SessionEvent::Delivery(_)) {
            self.traffic.sent();
        }
        let was_empty = {
            let mut queued = self.events.lock();
            if queued.closed {
                drop(queued);
                // Outside the lock: a delivery's charge reads the budget.
                drop(event);
                return;
            }
            let was_empty = queued.events.is_empty();
            queued.events.push(event);
            was_empty
        };
        // Only the first event of a batch wakes the task: whoever queued
        // into an empty queue woke it, and it takes every waiting event at
        // once after registering its waker (`poll_take_all`). The waker's
        // atomic is on the task's side of the machine; one read-modify-
        // write per event on it cost 6% of a fan-out (issue 20).
        if was_empty {
            if let Some(waker) = self.waker.take() {
                waker.wake();
                peers::woken();
            }
        }
    }

    /// One lock and at most one wake for the whole run (a stream reader's
    /// read of many records), where [`Self::send`] per event took the
    /// queue's lock each time. The same steps as `send`, written out
    /// again: a helper taking `send`'s event in a closure moved the
    /// 170-byte event once more per delivery (+49 instructions, +0.9%, in
    /// the 1 -> 10 fan-out under callgrind).
    fn send_many(&self, events: &mut Vec<SessionEvent>) {
        if events.is_empty() {
            return;
        }
        for e in events.iter() {
            if matches!(e, SessionEvent::Delivery(_)) {
                self.traffic.sent();
            }
        }
        let was_empty = {
            let mut queued = self.events.lock();
            if queued.closed {
                drop(queued);
                // Outside the lock: a delivery's charge reads the budget.
                events.clear();
                return;
            }
            let was_empty = queued.events.is_empty();
            queued.events.append(events);
            was_empty
        };
        // As in `send`: only a push into an empty queue wakes the task.
        if was_empty {
            if let Some(waker) = self.waker.take() {
                waker.wake();
                peers::woken();
            }
        }
    }

    fn budget(&self) -> Option<&DeliveryBudget> {
        self.budget.as_ref()
    }

    /// The core now waits for room, or room was made while it waits: the
    /// task resumes it (`take_resume`) or times a peer that stopped
    /// reading.
    fn budget_notice(&self) {
        self.wake();
    }

    fn published(&self) {
        self.traffic.received();
    }
}

/// Which connections' tasks this thread woke while one driver handled its
/// input, so that the driver can let them write first (see
/// [`Driver::let_peers_write_first`]).
mod peers {
    use std::cell::Cell;

    thread_local! {
        static WOKEN: Cell<bool> = const { Cell::new(false) };
    }

    /// A connection's task was woken with events for it.
    pub(super) fn woken() {
        WOKEN.with(|w| w.set(true));
    }

    /// Whether any was since the last call, which clears it.
    pub(super) fn take_woken() -> bool {
        WOKEN.with(|w| w.replace(false))
    }
}

/// A connection's sink, and the queue its events go to: one allocation,
/// returned twice (the core's handle and the task's). With
/// `budget_bytes`, deliveries waiting for the connection are bounded by a
/// [`DeliveryBudget`] of that size, which wakes the connection's task when
/// the core is to be resumed. Its own hard stop,
/// never set (tests, and connections no server stops).
pub(crate) fn event_channel(budget_bytes: Option<u64>) -> (Arc<ChannelSink>, Arc<EventQueue>) {
    event_channel_with(budget_bytes, Arc::default())
}

/// [`event_channel`] for a connection of a server, whose hard stop it
/// obeys.
pub(crate) fn event_channel_with(
    budget_bytes: Option<u64>,
    hard_stop: Arc<HardStop>,
) -> (Arc<ChannelSink>, Arc<EventQueue>) {
    let sink = Arc::new(ChannelSink {
        events: parking_lot::Mutex::default(),
        waker: AtomicWaker::new(),
        budget: budget_bytes.map(DeliveryBudget::new),
        hard_stop,
        traffic: Default::default(),
    });
    (Arc::clone(&sink), sink)
}

/// Set when the server's shutdown grace period is over: every connection
/// still open is cut. One flag for all connections, read on each poll;
/// the server wakes every registered connection when it sets it
/// ([`crate::connections::Registry::wake_all`]). A waiting future per
/// connection (a `watch` receiver's) cost each idle connection a boxed
/// allocation of about 150 B for an event that happens once. What is not
/// a registered connection (a proxied client's relay) waits with
/// [`HardStop::stopped`] instead.
#[derive(Debug, Default)]
pub(crate) struct HardStop {
    stopped: AtomicBool,
    waiters: tokio::sync::Notify,
}

impl HardStop {
    /// Sets the flag and wakes [`HardStop::stopped`]'s waiters; the caller
    /// then wakes the registered connections.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.waiters.notify_waiters();
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Completes once the hard stop is set (at once if it is).
    pub(crate) async fn stopped(&self) {
        let notified = self.waiters.notified();
        tokio::pin!(notified);
        // Registered before the flag is read, so a stop between the two
        // still wakes this waiter.
        notified.as_mut().enable();
        if !self.is_stopped() {
            notified.await;
        }
    }
}

/// A driver's event queue, and the wake-up it parked in the
/// [`CoarseTimer`], which is cleared when this goes (a closed
/// connection's wake-up goes with it), as is the queue (what waits in it
/// holds the sink, see [`ChannelSink::close`]). Apart from the driver so that the
/// driver has no `Drop` of its own and can be taken apart to be parked
/// (see [`Driver::park`]).
struct Events {
    queue: Arc<EventQueue>,
    coarse: Slot,
}

impl Drop for Events {
    fn drop(&mut self) {
        self.disarm();
        self.queue.close();
    }
}

impl Events {
    /// Takes back the far deadline's wake-up, if one is armed.
    fn disarm(&mut self) {
        if self.coarse.is_armed() {
            CoarseTimer::global().cancel(self.coarse, &self.queue);
            self.coarse = Slot::default();
        }
    }

    /// Arms the far deadline's wake-up for `deadline` in place of the one
    /// armed, if the coarse timer takes it (see [`CoarseTimer::arm`]);
    /// whether it did.
    fn rearm(&mut self, deadline: Instant) -> bool {
        let coarse = CoarseTimer::global();
        match coarse.arm(deadline, &self.queue) {
            Some(slot) => {
                coarse.cancel(self.coarse, &self.queue);
                self.coarse = slot;
                true
            }
            None => false,
        }
    }

    /// Makes the far deadline's wake-up exactly the one `deadline` needs.
    /// A running driver keeps an earlier wake-up when its deadline moves
    /// later (the connect deadline followed by the keep-alive, a keep-alive
    /// pushed back by each packet): it wakes early and re-arms, which costs
    /// a poll. A parked connection would be resumed for it, every one of a
    /// fleet that connected together at once, so it parks with its own.
    fn wake_exactly_for(&mut self, deadline: Option<Instant>) {
        match deadline {
            None => self.disarm(),
            Some(deadline) if !CoarseTimer::global().wakes_for(self.coarse, deadline) => {
                self.rearm(deadline);
            }
            Some(_) => {}
        }
    }
}

impl std::ops::Deref for Events {
    type Target = EventQueue;
    fn deref(&self) -> &EventQueue {
        &self.queue
    }
}

/// What a connection's driver needs besides the protocol and the socket.
pub(crate) struct DriverParts {
    /// For the info lines the driver logs.
    pub(crate) conn_id: u64,
    /// The connection's events and delivery budget.
    pub(crate) events: Arc<EventQueue>,
    /// A connection that cannot write while its delivery budget is full
    /// for this long is closed as a slow consumer; `None` never closes it.
    pub(crate) slow_consumer_timeout: Option<Duration>,
    /// The connection's span, entered on each poll (kept only when
    /// enabled: see `protocols::serve_wire`).
    pub(crate) span: tracing::Span,
    /// The connection's entry in the admin API's registry, held while the
    /// driver runs.
    pub(crate) registered: Option<RegistryGuard>,
}

/// The future that runs `conn` over `io` until either side closes.
///
/// A plain function returning the driver, not an `async fn`: the latter
/// would keep its arguments and the driver side by side in its state. The
/// driver is a named type so that a plain TCP connection's task can be the
/// driver itself (see `listener`): one allocation for the task, the
/// driver and the protocol state.
pub(crate) fn drive<C, T>(conn: C, io: T, parts: DriverParts) -> Driver<C, T>
where
    C: ProtocolConnection,
    T: Transport,
{
    let DriverParts {
        conn_id,
        events,
        slow_consumer_timeout,
        span,
        registered,
    } = parts;
    let state = ParkedDriver {
        conn_id,
        conn,
        events: Events {
            queue: events,
            coarse: Slot::default(),
        },
        // A disabled span (the usual case: it is a debug span) is not kept:
        // 40 bytes per idle connection for nothing.
        span: (!span.is_disabled()).then(|| Box::new(span)),
        registered,
        slow_consumer_timeout_ms: slow_consumer_timeout.map_or(0, |t| {
            u32::try_from(t.as_millis()).unwrap_or(u32::MAX).max(1)
        }),
    };
    // A new connection's task decides whether it may park
    // (`allow_parking`); a resumed one could already.
    state.into_driver(io, false)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// The connection is over; what is left of `out` goes out, best effort.
    Draining,
    /// The protocol closed: write what it produced, then shut the socket.
    ShuttingDown,
    /// Quiet for a while: the task hands the driver to the parker (see
    /// [`Driver::park`]) and ends.
    Parking,
    Done,
}

/// What one attempt at a source produced.
enum Step {
    /// Something happened: take another turn.
    Progress,
    /// Nothing to do until woken.
    Idle,
    /// The transport is gone.
    Closed,
}

/// A connection's driver (see [`drive`]).
///
/// Its size is part of every connection's memory (the task is the driver
/// for a plain TCP connection), so what only a connection in trouble
/// needs is in [`Trouble`], allocated while the trouble lasts.
pub(crate) struct Driver<C, T> {
    /// For the info lines the driver logs (the connection's span is a
    /// debug one, see `run_wire`).
    conn_id: u64,
    conn: C,
    io: T,
    /// With the far deadline's wake-up, parked in the [`CoarseTimer`].
    events: Events,
    span: Option<Box<tracing::Span>>,
    _registered: Option<RegistryGuard>,
    /// Empty (unallocated) between reads when the transport reports
    /// readiness and the connection is quiet. Always exactly the read's
    /// size, so a boxed slice (16 bytes) rather than a vector (24).
    rbuf: Box<[u8]>,
    out: Vec<u8>,
    /// How much of `out` the transport has taken (a turn's output is far
    /// below 4 GiB: the delivery budget and the adapters' limits bound it).
    written: u32,
    batch: Vec<SessionEvent>,
    /// The exact timer, allocated while the protocol's deadline is near
    /// (see `coarse`).
    timer: Option<Pin<Box<Sleep>>>,
    /// Back-pressure, a stalled write, a farewell: `None` while all is well.
    trouble: Option<Box<Trouble>>,
    /// The slow-consumer limit in ms (0: never closed as one).
    slow_consumer_timeout_ms: u32,
    /// The size of the next read: doubles while reads fill it, back to the
    /// minimum when they do not.
    read_size: u32,
    /// When the last bytes were read, on [`input_ticks`]' clock (wrapping:
    /// only short gaps are compared). In the driver's padding: no bigger.
    last_input_tick: u16,
    /// `out` is written; the flush is pending.
    flushing: bool,
    /// The task may park this driver once it has been quiet for a while
    /// (an authenticated connection over plain TCP or plain WebSocket,
    /// see `parking`).
    parking: bool,
    /// Something happened since the last time the driver went idle.
    touched: bool,
    /// The wake-up that ends a parkable driver's idle spell, in the park
    /// timer ([`CoarseTimer::parking`]). Not cleared when the driver goes:
    /// its bucket's weak reference to the sink is at most 200 ms away.
    park_check: Slot,
    /// The park timer's tick of the last time the driver went idle after
    /// something happened.
    active_tick: u32,
    phase: Phase,
}

/// What a driver holds only while its connection is in trouble: the
/// protocol refused input (back-pressure), a write stalled, or the broker
/// closed the connection and waits for its last frames to go.
#[derive(Default)]
struct Trouble {
    /// When a connection that stopped reading looks again (see
    /// [`INPUT_RECHECK_INTERVAL`]).
    input_recheck: Option<Instant>,
    /// Since when output has been waiting for a peer that does not read.
    write_stalled_since: Option<Instant>,
    /// The slow-consumer deadline, allocated while a write is stalled with
    /// the budget full.
    stall_timer: Option<Pin<Box<Sleep>>>,
    /// Bounds the last write of a connection the broker closed.
    farewell: Option<Pin<Box<Sleep>>>,
}

impl Trouble {
    fn is_over(&self) -> bool {
        self.input_recheck.is_none()
            && self.write_stalled_since.is_none()
            && self.stall_timer.is_none()
            && self.farewell.is_none()
    }
}

// No field is pinned structurally (the timers are boxed, the rest is only
// ever used through `&mut`), so moving a driver is fine.
impl<C, T> Unpin for Driver<C, T> {}

impl<C: ProtocolConnection, T: Transport> Future for Driver<C, T> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        // Taken out while the driver runs, which borrows it mutably.
        let span = this.span.take();
        let entered = span.as_deref().map(tracing::Span::enter);
        let poll = this.run(cx);
        drop(entered);
        this.span = span;
        poll
    }
}

impl<C: ProtocolConnection, T: Transport> Driver<C, T> {
    fn trouble(&mut self) -> &mut Trouble {
        self.trouble.get_or_insert_with(Box::default)
    }

    /// Frees the trouble state once nothing in it is left.
    fn end_trouble_if_over(&mut self) {
        if self.trouble.as_ref().is_some_and(|t| t.is_over()) {
            self.trouble = None;
        }
    }

    /// Whether part of `out` is still to be written.
    fn unwritten(&self) -> bool {
        (self.written as usize) < self.out.len()
    }

    fn write_stalled_since(&self) -> Option<Instant> {
        self.trouble.as_ref()?.write_stalled_since
    }

    fn run(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        for _ in 0..TURNS_PER_POLL {
            if matches!(self.phase, Phase::Done | Phase::Parking) {
                return Poll::Ready(());
            }
            // Checked in every phase: a peer that stops reading must not
            // hold a closing or shutting-down server.
            if self.events.hard_stop.is_stopped() {
                tracing::debug!("shutdown grace period over; cutting the connection");
                if self.phase == Phase::Running {
                    self.conn.handle_transport_closed(Instant::now());
                }
                return self.finish();
            }
            if let Some(farewell) = self.trouble.as_mut().and_then(|t| t.farewell.as_mut()) {
                if farewell.as_mut().poll(cx).is_ready() {
                    tracing::debug!("peer took no farewell; cutting the connection");
                    return self.finish();
                }
            }
            match self.phase {
                Phase::Done | Phase::Parking => return Poll::Ready(()),
                Phase::Draining => {
                    // Whatever the transport accepts; errors no longer matter.
                    return match self.poll_write_out(cx) {
                        Poll::Pending => Poll::Pending,
                        Poll::Ready(_) => self.finish(),
                    };
                }
                Phase::ShuttingDown => {
                    if let Poll::Ready(Err(e)) = self.poll_write_out(cx) {
                        tracing::debug!(error = %e, "write failed while closing");
                        return self.finish();
                    }
                    if self.unwritten() || self.flushing {
                        return Poll::Pending;
                    }
                    return match Pin::new(&mut self.io).poll_shutdown(cx) {
                        Poll::Pending => Poll::Pending,
                        Poll::Ready(_) => self.finish(),
                    };
                }
                Phase::Running => {}
            }
            if self.events.budget.as_ref().is_some_and(|b| b.take_resume()) {
                // Room came back since the core turned a delivery away:
                // let it dispatch again (its deliveries come as events).
                self.conn.resume_deliveries();
            }
            if self.poll_slow_consumer(cx) {
                continue;
            }
            // Output first: a connection that cannot write does not take
            // more input or events (back-pressure onto the peer and the core).
            match self.poll_write_out(cx) {
                Poll::Pending => {
                    // A wake takes the registered waker, and this path does
                    // not reach `poll_events`, which registers it again:
                    // without this, the budget's notice that the core now
                    // holds deliveries back (which arms the slow-consumer
                    // deadline) would find no one to wake, and a stalled
                    // peer would stay connected until some unrelated timer
                    // fired.
                    self.events.register(cx);
                    if self.unwritten() && self.write_stalled_since().is_none() {
                        self.trouble().write_stalled_since = Some(Instant::now());
                        // Arms the deadline if the core is waiting already.
                        if self.poll_slow_consumer(cx) {
                            continue;
                        }
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    tracing::debug!(error = %e, "write failed; closing");
                    self.conn.handle_transport_closed(Instant::now());
                    return self.finish();
                }
                Poll::Ready(Ok(())) => {}
            }
            if self.conn.is_closed() {
                self.phase = Phase::ShuttingDown;
                continue;
            }
            let mut progress = false;
            peers::take_woken();
            let input_before = self.last_input_tick;
            let steps = [
                self.poll_events(cx),
                self.poll_timer(cx),
                self.poll_input(cx),
            ];
            let woke_peers = peers::take_woken();
            // Input this turn (the tick moved) after a quiet spell.
            let input_after_quiet =
                self.last_input_tick.wrapping_sub(input_before) >= QUIET_INPUT_TICKS;
            for step in steps {
                match step {
                    Step::Progress => {
                        progress = true;
                        self.touched = true;
                    }
                    Step::Idle => {}
                    Step::Closed => {
                        self.conn.poll_transmit(&mut self.out);
                        self.phase = Phase::Draining;
                        break;
                    }
                }
            }
            if !progress && self.phase == Phase::Running {
                self.end_trouble_if_over();
                if self.parking && self.park_due() {
                    self.phase = Phase::Parking;
                    return Poll::Ready(());
                }
                return Poll::Pending;
            }
            if woke_peers && input_after_quiet && self.let_peers_write_first(cx) {
                return Poll::Pending;
            }
        }
        // Used up this poll's turns while work kept arriving: yield.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// When the connection becomes a slow consumer: its write has been
    /// stalled, and the core held deliveries back for lack of budget, for
    /// the whole slow-consumer limit. A peer whose deliveries wait on its
    /// own flow control (unsettled deliveries, a closed AMQP session
    /// window) while its socket takes everything is not slow, and nor is
    /// a stream reader held at its read-ahead (`rosetta_neutral::budget`):
    /// it costs no more than that read-ahead however long it waits.
    fn slow_consumer_deadline(&self) -> Option<Instant> {
        if self.slow_consumer_timeout_ms == 0 {
            return None;
        }
        let timeout = Duration::from_millis(u64::from(self.slow_consumer_timeout_ms));
        let held_back = self.events.budget.as_ref()?.full_since()?;
        let stalled = self.write_stalled_since()?;
        Some(held_back.max(stalled) + timeout)
    }

    /// Closes a slow consumer whose deadline passed (returns true), or
    /// arms the timer that wakes the task at the deadline.
    fn poll_slow_consumer(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(deadline) = self.slow_consumer_deadline() else {
            if let Some(trouble) = &mut self.trouble {
                trouble.stall_timer = None;
            }
            return false;
        };
        let now = Instant::now();
        if now < deadline {
            let at = tokio::time::Instant::from_std(deadline);
            let timer = match &mut self.trouble().stall_timer {
                Some(timer) => {
                    if timer.deadline() != at {
                        timer.as_mut().reset(at);
                    }
                    timer
                }
                none => none.insert(Box::pin(tokio::time::sleep_until(at))),
            };
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
        }
        self.trouble().stall_timer = None;
        let budget = self
            .events
            .budget
            .as_ref()
            .map(|b| (b.used_bytes(), b.max_bytes()));
        tracing::info!(
            conn_id = self.conn_id,
            ?budget,
            timeout_ms = self.slow_consumer_timeout_ms,
            "slow consumer: the peer stopped reading; closing"
        );
        self.conn.handle_slow_consumer(now);
        self.trouble().farewell = Some(Box::pin(tokio::time::sleep(FAREWELL_TIMEOUT)));
        self.phase = Phase::ShuttingDown;
        true
    }

    fn finish(&mut self) -> Poll<()> {
        self.phase = Phase::Done;
        tracing::debug!("connection finished");
        Poll::Ready(())
    }

    /// Whether the connection has been quiet long enough to be parked
    /// (see `parking`): nothing happened at two idle points at least
    /// [`PARK_AFTER_TICKS`] ticks of the park timer apart, and nothing is
    /// buffered, timed or held back now. Until then, makes sure the task
    /// is woken when that spell will be over. Called when a turn found
    /// nothing to do; on a busy connection's path it costs a few loads.
    fn park_due(&mut self) -> bool {
        if self.timer.is_some() {
            // A near deadline: the spell starts again after it.
            self.touched = true;
            return false;
        }
        let timer = CoarseTimer::parking();
        let Some(now) = timer.current_second() else {
            return false;
        };
        if std::mem::take(&mut self.touched) {
            self.active_tick = now;
        } else if now >= self.active_tick.saturating_add(PARK_AFTER_TICKS) {
            if self.is_quiet() {
                return true;
            }
            self.active_tick = now;
        }
        let due = self.active_tick.saturating_add(PARK_AFTER_TICKS);
        if !timer.is_pending_by(self.park_check, due) {
            if let Some(slot) = timer.arm_second(due, &self.events.queue) {
                timer.cancel(self.park_check, &self.events.queue);
                self.park_check = slot;
            }
        }
        false
    }

    /// Nothing buffered, nothing in the way: a driver in this state holds
    /// nothing a parked one could not (see [`ParkedDriver`]).
    fn is_quiet(&self) -> bool {
        self.phase == Phase::Running
            && !self.unwritten()
            && !self.flushing
            && self.batch.is_empty()
            && self.timer.is_none()
            && self.trouble.is_none()
            && self.io.is_at_rest()
            && self
                .events
                .budget
                .as_ref()
                .is_none_or(|b| b.held_back_since().is_none())
    }

    /// Lets the task park this driver once it is quiet (see `parking`).
    pub(crate) fn allow_parking(&mut self) {
        self.parking = true;
    }

    /// Whether the driver's task may park it now.
    pub(crate) fn may_park(&self) -> bool {
        self.parking
    }

    /// The driver returned `Ready` to be parked, not because it is done.
    pub(crate) fn wants_to_park(&self) -> bool {
        self.phase == Phase::Parking
    }

    /// Takes a driver that [`Self::wants_to_park`] apart: what the
    /// connection keeps while parked, and its transport. The buffers and
    /// timers are empty (see [`Self::is_quiet`]) and go.
    pub(crate) fn park(self) -> (ParkedDriver<C>, T) {
        let Driver {
            conn_id,
            mut conn,
            io,
            mut events,
            span,
            _registered,
            slow_consumer_timeout_ms,
            ..
        } = self;
        events.wake_exactly_for(conn.poll_timeout());
        if let Some(buf) = conn.input_buffer().filter(|b| b.is_empty()) {
            *buf = BytesMut::new();
        }
        conn.shrink_when_parked();
        let parked = ParkedDriver {
            conn_id,
            conn,
            events,
            span,
            registered: _registered,
            slow_consumer_timeout_ms,
        };
        (parked, io)
    }
}

/// What a parked connection keeps of its driver (see `parking`): the
/// protocol state, the event queue with its coarse wake-up, the span and
/// the registry entry. A driver without its buffers, timers and transport
/// (a new connection's driver is built from one too, see [`drive`]).
pub(crate) struct ParkedDriver<C> {
    conn_id: u64,
    conn: C,
    events: Events,
    span: Option<Box<tracing::Span>>,
    registered: Option<RegistryGuard>,
    slow_consumer_timeout_ms: u32,
}

impl<C: ProtocolConnection> ParkedDriver<C> {
    /// The connection's id.
    pub(crate) fn conn_id(&self) -> u64 {
        self.conn_id
    }

    /// The connection's event queue, whose wake-ups must reach the parker.
    pub(crate) fn events(&self) -> &Arc<EventQueue> {
        &self.events.queue
    }

    /// Whether something the driver would act on happened since it last
    /// looked (a wake that reached the ended task rather than the parker):
    /// events, the hard stop, the core waiting for room, its far
    /// deadline's second.
    pub(crate) fn wake_due(&self) -> bool {
        let coarse = self.events.coarse;
        self.events.has_events()
            || self.events.hard_stop.is_stopped()
            || self
                .events
                .budget
                .as_ref()
                .is_some_and(|b| b.held_back_since().is_some())
            || (coarse.is_armed() && !CoarseTimer::global().is_pending(coarse))
    }

    /// The driver again, over `io`.
    pub(crate) fn resume<T>(self, io: T) -> Driver<C, T> {
        self.into_driver(io, true)
    }

    /// A driver around this state over `io`, its buffers, timers and
    /// idle bookkeeping fresh: how a new connection's driver starts
    /// ([`drive`]) and how a parked one comes back ([`Self::resume`]).
    fn into_driver<T>(self, io: T, parking: bool) -> Driver<C, T> {
        let ParkedDriver {
            conn_id,
            conn,
            events,
            span,
            registered,
            slow_consumer_timeout_ms,
        } = self;
        Driver {
            conn_id,
            conn,
            io,
            events,
            span,
            _registered: registered,
            rbuf: Box::default(),
            out: Vec::new(),
            written: 0,
            batch: Vec::new(),
            timer: None,
            trouble: None,
            slow_consumer_timeout_ms,
            read_size: READ_BUFFER_MIN_BYTES as u32,
            last_input_tick: 0,
            flushing: false,
            parking,
            touched: true,
            park_check: Slot::default(),
            active_tick: 0,
            phase: Phase::Running,
        }
    }

    /// The transport is lost while parked (it could not be taken back):
    /// the protocol closes as for a dropped socket.
    pub(crate) fn close(mut self) {
        let _entered = self.span.as_deref().map(tracing::Span::enter);
        self.conn.handle_transport_closed(Instant::now());
    }
}

impl<C: ProtocolConnection, T: Transport> Driver<C, T> {
    /// What this turn's input (a publish) woke other connections' tasks
    /// for goes out before this connection's own output (its
    /// acknowledgement): the task returns, to be polled again once the
    /// worker has run what is ready (tokio's `yield_now`, which defers the
    /// wake until then, so the woken task, in the worker's LIFO slot, runs
    /// first on this thread). A broker writes a message to its subscriber
    /// before the publisher's PUBACK, as mosquitto does: a QoS 1 message's
    /// latency then does not include a loopback write (and the wake of
    /// the publisher's thread) in front of it (issue 20). Returns whether
    /// it yielded; only while there is output of ours to hold back.
    fn let_peers_write_first(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.unwritten() && !self.flushing {
            // Collected now rather than at the next turn, to see whether
            // there is anything to hold back.
            self.release_out();
            self.conn.poll_transmit(&mut self.out);
        }
        if !self.unwritten() {
            return false;
        }
        let yield_now = std::pin::pin!(tokio::task::yield_now());
        // Its first poll hands our waker to the scheduler and is pending;
        // the future holds nothing after that, so it may go.
        yield_now.poll(cx).is_pending()
    }

    /// Collects what the protocol produced and writes it, then flushes.
    /// Ready(Ok) once everything is written and flushed.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if !self.unwritten() && !self.flushing {
                self.release_out();
                self.conn.poll_transmit(&mut self.out);
                if self.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
            }
            while self.unwritten() {
                let n = std::task::ready!(
                    Pin::new(&mut self.io).poll_write(cx, &self.out[self.written as usize..])
                )?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                // At most what is left of `out` (see `written`).
                self.written += u32::try_from(n).unwrap_or(u32::MAX);
                self.flushing = true;
                // The peer took bytes: whatever stall there was is over.
                if let Some(trouble) = &mut self.trouble {
                    trouble.write_stalled_since = None;
                }
            }
            if self.flushing {
                std::task::ready!(Pin::new(&mut self.io).poll_flush(cx))?;
                self.flushing = false;
            }
        }
    }

    /// Empties the written output, keeping its buffer only for a busy
    /// connection.
    fn release_out(&mut self) {
        let len = self.out.len();
        self.out.clear();
        self.written = 0;
        if len <= WRITE_BUFFER_FREED_BELOW_BYTES {
            self.out = Vec::new();
        } else {
            self.out.shrink_to(WRITE_BUFFER_KEPT_BYTES);
        }
    }

    fn poll_events(&mut self, cx: &mut Context<'_>) -> Step {
        if !self.events.poll_take_all(cx, &mut self.batch) {
            return Step::Idle;
        }
        // Everything that piled up, then one write for all of it.
        let now = Instant::now();
        let taken = self.batch.len();
        for event in self.batch.drain(..) {
            self.conn.handle_event(now, event);
        }
        if taken <= EVENT_BATCH_FREED_BELOW {
            self.batch = Vec::new();
        } else {
            self.batch.shrink_to(EVENT_BATCH_KEPT);
        }
        Step::Progress
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Step {
        // A connection that stopped reading (back-pressure: memory or disk
        // limit, commits outstanding) is looked at again on a timer, since
        // nothing else may wake it when the pressure goes: a pure publisher
        // gets no events.
        if self.conn.wants_input() {
            if let Some(trouble) = &mut self.trouble {
                trouble.input_recheck = None;
            }
        } else if self
            .trouble
            .as_ref()
            .is_none_or(|t| t.input_recheck.is_none())
        {
            self.trouble().input_recheck = Some(Instant::now() + INPUT_RECHECK_INTERVAL);
        }
        let input_recheck = self.trouble.as_ref().and_then(|t| t.input_recheck);
        let deadline = match (self.conn.poll_timeout(), input_recheck) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => {
                // No deadline (a connection without keep-alive, once its
                // connect deadline is over): an idle connection should not
                // keep a timer allocation it no longer needs.
                self.timer = None;
                self.events.disarm();
                return Step::Idle;
            }
        };
        // A far deadline (an idle connection's keep-alive) waits in the
        // coarse timer, which wakes the task shortly before it; the exact
        // timer below takes the last stretch.
        if CoarseTimer::global().covers(self.events.coarse, deadline) || self.events.rearm(deadline)
        {
            self.timer = None;
            return Step::Idle;
        }
        self.events.disarm();
        let deadline = tokio::time::Instant::from_std(deadline);
        let timer = match &mut self.timer {
            Some(timer) => {
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
            none => none.insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Step::Idle;
        }
        let now = Instant::now();
        if input_recheck.is_some_and(|t| now >= t) {
            self.trouble().input_recheck = None;
        }
        if self.conn.poll_timeout().is_some_and(|t| now >= t) {
            self.conn.handle_timeout(now);
        }
        Step::Progress
    }

    fn poll_input(&mut self, cx: &mut Context<'_>) -> Step {
        if !self.conn.wants_input() {
            return Step::Idle;
        }
        let read = match self.io.poll_read_ready(cx) {
            Poll::Pending => return Step::Idle,
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) if self.conn.input_buffer().is_some() => self.poll_read_lent(cx),
            Poll::Ready(Ok(())) => self.poll_read_own(cx),
        };
        match read {
            Poll::Pending => Step::Idle,
            Poll::Ready(Err(e)) => {
                tracing::debug!(error = %e, "read failed; closing");
                self.conn.handle_transport_closed(Instant::now());
                Step::Closed
            }
            Poll::Ready(Ok(0)) => {
                tracing::debug!("peer closed the connection");
                self.conn.handle_transport_closed(Instant::now());
                Step::Closed
            }
            Poll::Ready(Ok(n)) => {
                self.read_size = next_read_size(self.read_size as usize, n) as u32;
                if self.read_size as usize == READ_BUFFER_MIN_BYTES && self.io.reports_readiness() {
                    // Quiet: wait for the next bytes without a buffer. A
                    // lent buffer holding part of a frame is kept.
                    self.rbuf = Box::default();
                    if let Some(buf) = self.conn.input_buffer().filter(|b| b.is_empty()) {
                        *buf = BytesMut::new();
                    }
                }
                Step::Progress
            }
        }
    }

    /// Now, for input just read; notes when.
    fn input_now(&mut self) -> Instant {
        let now = Instant::now();
        self.last_input_tick = input_ticks(now);
        now
    }

    /// Reads into the driver's own buffer and hands the protocol a slice.
    fn poll_read_own(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let size = self.read_size as usize;
        if self.rbuf.len() != size {
            self.rbuf = vec![0; size].into_boxed_slice();
        }
        let mut buf = ReadBuf::new(&mut self.rbuf);
        std::task::ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf))?;
        let n = buf.filled().len();
        if n > 0 {
            let now = self.input_now();
            self.conn.handle_input(now, &self.rbuf[..n]);
        }
        Poll::Ready(Ok(n))
    }

    /// Reads into the spare capacity of the buffer the protocol lends
    /// ([`ProtocolConnection::input_buffer`]): no copy on our side.
    fn poll_read_lent(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some(buf) = self.conn.input_buffer() else {
            return Poll::Ready(Ok(0));
        };
        buf.reserve(self.read_size as usize);
        let n = std::task::ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            buf
        ))?;
        if n > 0 {
            let now = self.input_now();
            self.conn.handle_buffered_input(now);
        }
        Poll::Ready(Ok(n))
    }
}

/// `now` in [`INPUT_TICK_US`] ticks since the first call, wrapping at
/// 2^16: two bytes per connection for "how long since the last input".
/// Starts at [`QUIET_INPUT_TICKS`], so that a connection's first input
/// (its last input at 0) counts as after a quiet spell.
fn input_ticks(now: Instant) -> u16 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| now);
    let ticks = now.saturating_duration_since(epoch).as_micros() / INPUT_TICK_US;
    // Truncation is the point: only differences of recent values are used.
    (ticks as u16).wrapping_add(QUIET_INPUT_TICKS)
}

/// The size of the read after one that returned `last_read` bytes into a
/// buffer of `size`: double it when the read filled it (more is waiting:
/// fewer, larger reads), back to the minimum when reads are small again
/// (an idle connection should not keep a burst's buffer).
fn next_read_size(size: usize, last_read: usize) -> usize {
    if last_read >= size {
        (size * 2).min(READ_BUFFER_MAX_BYTES)
    } else if last_read < size / 8 {
        READ_BUFFER_MIN_BYTES
    } else {
        size
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    impl Transport for tokio::io::DuplexStream {}

    /// A connection that echoes its input, and reads only while `open`.
    struct Gate {
        open: Arc<AtomicBool>,
        echoed: Vec<u8>,
    }

    impl ProtocolConnection for Gate {
        fn handle_input(&mut self, _: Instant, data: &[u8]) {
            self.echoed.extend_from_slice(data);
        }
        fn handle_event(&mut self, _: Instant, _: SessionEvent) {}
        fn handle_timeout(&mut self, _: Instant) {}
        fn poll_timeout(&self) -> Option<Instant> {
            None
        }
        fn poll_transmit(&mut self, out: &mut Vec<u8>) {
            out.append(&mut self.echoed);
        }
        fn wants_input(&self) -> bool {
            self.open.load(Ordering::SeqCst)
        }
        fn is_closed(&self) -> bool {
            false
        }
        fn handle_transport_closed(&mut self, _: Instant) {}
        fn handle_slow_consumer(&mut self, _: Instant) {}
        fn resume_deliveries(&mut self) {}
    }

    /// A connection held back from reading has nothing that wakes it when
    /// the back-pressure goes (no events, no timer of its own): the
    /// driver's recheck must.
    #[tokio::test]
    async fn a_connection_held_back_reads_again_once_it_may() {
        let (mut client, server) = tokio::io::duplex(1024);
        let open = Arc::new(AtomicBool::new(false));
        let conn = Gate {
            open: Arc::clone(&open),
            echoed: Vec::new(),
        };
        let (_sink, events) = event_channel(None);
        let parts = DriverParts {
            conn_id: 1,
            events,
            slow_consumer_timeout: None,
            span: tracing::Span::none(),
            registered: None,
        };
        let task = tokio::spawn(drive(conn, server, parts));
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        client.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        let early =
            tokio::time::timeout(Duration::from_millis(200), client.read_exact(&mut buf)).await;
        assert!(early.is_err(), "read while held back");
        open.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(2), client.read_exact(&mut buf))
            .await
            .expect("read again within the recheck interval")
            .expect("echo");
        assert_eq!(&buf, b"ping");
        task.abort();
    }

    /// A connection whose deadline is its only source of progress (an idle
    /// keep-alive): it times out at the deadline, a far deadline waiting
    /// in the coarse timer until shortly before it.
    struct Deadline {
        at: Instant,
        fired: Arc<std::sync::Mutex<Option<Instant>>>,
    }

    impl ProtocolConnection for Deadline {
        fn handle_input(&mut self, _: Instant, _: &[u8]) {}
        fn handle_event(&mut self, _: Instant, _: SessionEvent) {}
        fn handle_timeout(&mut self, now: Instant) {
            if now >= self.at {
                *self.fired.lock().expect("lock") = Some(now);
            }
        }
        fn poll_timeout(&self) -> Option<Instant> {
            self.fired
                .lock()
                .expect("lock")
                .is_none()
                .then_some(self.at)
        }
        fn poll_transmit(&mut self, _: &mut Vec<u8>) {}
        fn wants_input(&self) -> bool {
            true
        }
        fn is_closed(&self) -> bool {
            self.fired.lock().expect("lock").is_some()
        }
        fn handle_transport_closed(&mut self, _: Instant) {}
        fn handle_slow_consumer(&mut self, _: Instant) {}
        fn resume_deliveries(&mut self) {}
    }

    #[tokio::test]
    async fn a_far_deadline_fires_on_time_through_the_coarse_timer() {
        let (_client, server) = tokio::io::duplex(1024);
        let start = Instant::now();
        let at = start + crate::coarse_timer::COARSE_MIN + Duration::from_millis(700);
        let fired = Arc::default();
        let conn = Deadline {
            at,
            fired: Arc::clone(&fired),
        };
        let (_sink, events) = event_channel(None);
        let parts = DriverParts {
            conn_id: 1,
            events,
            slow_consumer_timeout: None,
            span: tracing::Span::none(),
            registered: None,
        };
        let mut driver = drive(conn, server, parts);
        // Parked, not on an exact timer, right after the first poll.
        let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut driver).poll(cx))).await;
        assert!(first.is_pending());
        assert!(driver.events.coarse.is_armed() && driver.timer.is_none());
        tokio::time::timeout(Duration::from_secs(10), driver)
            .await
            .expect("the connection closed at its deadline");
        let when = fired.lock().expect("lock").expect("timed out");
        assert!(when >= at, "not before the deadline");
        assert!(
            when < at + Duration::from_millis(500),
            "on time: {:?} late",
            when - at
        );
    }

    /// A transport that notes in a shared log, under its name, each write.
    struct Logged {
        name: &'static str,
        log: Arc<parking_lot::Mutex<Vec<&'static str>>>,
        io: tokio::io::DuplexStream,
    }

    impl AsyncRead for Logged {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Logged {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.log.lock().push(self.name);
            Pin::new(&mut self.io).poll_write(cx, buf)
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }

    impl Transport for Logged {}

    /// A publisher: each input is routed to the peer (an event on its
    /// sink) and acknowledged.
    struct Publisher {
        peer: Arc<ChannelSink>,
        out: Vec<u8>,
    }

    /// A subscriber: each event is a delivery to write.
    struct Subscriber {
        out: Vec<u8>,
    }

    macro_rules! fake_connection {
        ($ty:ty, input: |$si:ident| $input:expr, event: |$se:ident| $event:expr) => {
            impl ProtocolConnection for $ty {
                fn handle_input(&mut self, _: Instant, _: &[u8]) {
                    let $si = self;
                    $input
                }
                fn handle_event(&mut self, _: Instant, _: SessionEvent) {
                    let $se = self;
                    $event
                }
                fn handle_timeout(&mut self, _: Instant) {}
                fn poll_timeout(&self) -> Option<Instant> {
                    None
                }
                fn poll_transmit(&mut self, out: &mut Vec<u8>) {
                    out.append(&mut self.out);
                }
                fn wants_input(&self) -> bool {
                    true
                }
                fn is_closed(&self) -> bool {
                    false
                }
                fn handle_transport_closed(&mut self, _: Instant) {}
                fn handle_slow_consumer(&mut self, _: Instant) {}
                fn resume_deliveries(&mut self) {}
            }
        };
    }

    fake_connection!(Publisher,
        input: |p| {
            p.peer.send(SessionEvent::Drained {
                consumer: rosetta_neutral::ConsumerId(1),
            });
            p.out.extend_from_slice(b"ack");
        },
        event: |_p| {});
    fake_connection!(Subscriber,
        input: |_s| {},
        event: |s| s.out.extend_from_slice(b"delivery"));

    /// The sink, its queue and the delivery budget are one allocation in
    /// jemalloc's 128 B class (with `Arc`'s two counts), per connection.
    #[test]
    fn the_sink_fits_its_size_class() {
        let size = std::mem::size_of::<ChannelSink>();
        assert!(size <= 112, "ChannelSink is {size} B");
    }

    /// A delivery's charge holds its sink, so a queued delivery holds the
    /// queue it is in: the driver's going must drop it (and refuse what
    /// comes later), or a connection that closed with deliveries waiting
    /// would never free its sink. Fails without `ChannelSink::close`.
    #[test]
    fn a_closed_connections_sink_is_freed_with_deliveries_waiting() {
        let (sink, queue) = event_channel(Some(1 << 20));
        let core_side: Arc<dyn EventSink> = sink.clone();
        let delivery = |tag| {
            SessionEvent::Delivery(rosetta_neutral::Delivery {
                consumer: rosetta_neutral::ConsumerId(1),
                tag: rosetta_neutral::DeliveryTag(tag),
                message: Arc::new(rosetta_neutral::Message::text("x")),
                delivery_count: 0,
                redelivered: false,
                from_retained: false,
                matched: Default::default(),
                annotation: None,
                charge: rosetta_neutral::DeliveryCharge::on(&core_side, 100),
                stream: None,
            })
        };
        core_side.send(delivery(1));
        assert_eq!(sink.budget().map(|b| b.used_bytes()), Some(100));
        let freed = Arc::downgrade(&sink);
        drop(Events {
            queue,
            coarse: Slot::default(),
        });
        assert_eq!(sink.budget().map(|b| b.used_bytes()), Some(0), "dropped");
        core_side.send(delivery(2));
        assert_eq!(sink.budget().map(|b| b.used_bytes()), Some(0), "refused");
        drop((sink, core_side));
        assert!(
            freed.upgrade().is_none(),
            "the sink outlived its connection"
        );
    }

    /// After a quiet spell, what a publish wakes another connection for is
    /// written before the publisher's own acknowledgement (a QoS 1
    /// message's latency should not include the PUBACK's write). Fails
    /// with the acknowledgement first when the driver does not yield.
    #[test]
    fn a_delivery_is_written_before_the_publishers_ack_after_a_quiet_spell() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let (mut pub_client, pub_server) = tokio::io::duplex(1024);
            let (mut sub_client, sub_server) = tokio::io::duplex(1024);
            let (sub_sink, sub_events) = event_channel(None);
            let (_pub_sink, pub_events) = event_channel(None);
            let transport = |name, io| Logged {
                name,
                log: Arc::clone(&log),
                io,
            };
            let parts = |conn_id, events| DriverParts {
                conn_id,
                events,
                slow_consumer_timeout: None,
                span: tracing::Span::none(),
                registered: None,
            };
            let subscriber = tokio::spawn(drive(
                Subscriber { out: Vec::new() },
                transport("subscriber", sub_server),
                parts(2, sub_events),
            ));
            let publisher = tokio::spawn(drive(
                Publisher {
                    peer: sub_sink,
                    out: Vec::new(),
                },
                transport("publisher", pub_server),
                parts(1, pub_events),
            ));
            // Both tasks reach their first wait.
            tokio::task::yield_now().await;
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            pub_client.write_all(b"publish").await.expect("write");
            let mut ack = [0u8; 3];
            let mut delivery = [0u8; 8];
            pub_client.read_exact(&mut ack).await.expect("ack");
            sub_client
                .read_exact(&mut delivery)
                .await
                .expect("delivery");
            assert_eq!(*log.lock(), ["subscriber", "publisher"]);
            publisher.abort();
            subscriber.abort();
        });
    }

    #[test]
    fn read_size_grows_on_full_reads_and_shrinks_when_quiet() {
        let mut size = READ_BUFFER_MIN_BYTES;
        while size < READ_BUFFER_MAX_BYTES {
            let grown = next_read_size(size, size);
            assert_eq!(grown, size * 2);
            size = grown;
        }
        assert_eq!(next_read_size(size, size), READ_BUFFER_MAX_BYTES, "capped");
        assert_eq!(
            next_read_size(size, size / 2),
            size,
            "a half-full read keeps the size"
        );
        assert_eq!(next_read_size(size, 100), READ_BUFFER_MIN_BYTES);
    }
}
