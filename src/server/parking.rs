//! Idle connections parked out of tokio (issue 20).
//!
//! An idle plain-TCP connection's largest costs were tokio's: its task
//! (the driver with the protocol state inline, in a 128-byte aligned cell:
//! 512 B for MQTT, 640 for STOMP and AMQP) and its socket's registration
//! with tokio's I/O driver (`ScheduledIo`, 256 B). A connection quiet for
//! [`PARK_AFTER_S`] seconds of the coarse timer's clock, with nothing
//! buffered, timed or held back, is parked instead: its task takes the
//! driver apart ([`Driver::park`]: the protocol state, the event queue
//! and the registry entry stay, the buffers and timers are empty and go),
//! deregisters the socket from tokio (`into_std`) and hands both to the
//! server's [`Parker`], and ends. The parker owns an epoll instance of its
//! own (one `AsyncFd` in tokio for all parked sockets) and a slab of
//! parked connections; a parked socket is in its epoll set once
//! (`EPOLLONESHOT`, the slab key as the event's data).
//!
//! A parked connection is resumed (a new task, `TcpStream::from_std`, the
//! driver rebuilt around its state) by anything its driver would have
//! woken for:
//! - its socket readable, or closed by the peer (the epoll set);
//! - an event from the core (a delivery, a kick, an admin close), the
//!   delivery budget's notice, the coarse timer reaching its far deadline
//!   (the keep-alive), the server's hard stop: all of these wake the
//!   connection's [`ChannelSink`], whose waker while parked is a
//!   [`ParkWake`] (the slab key and the parker; 32 B per parked
//!   connection) that queues the key and wakes the parker's task.
//!
//! A wake that reached the ended task between its last poll and the
//! parked waker's registration would be lost, so the parker looks once
//! more after registering ([`ParkedDriver::wake_due`]) and resumes at once
//! if anything is due. A resumed driver behaves as a new one whose state
//! was kept: it reads, takes its events, re-arms its timers.
//!
//! Over a plain WebSocket the driver runs over [`WsByteStream`] in a
//! task of its own once the upgrade is done (`protocols::WsTask`), and
//! parks only when the framing is at rest too (no cut frame header, no
//! message under way, no pong or close owed): what the framing keeps then
//! is its settings ([`WsAtRest`]), parked beside the socket
//! ([`ParkedWs`]). A ping from the peer is a readable socket: the resumed
//! stream answers it.
//!
//! Not parked: connections over TLS (rustls' session state is the larger
//! part of them and must stay with the socket's bytes), through protocol
//! detection or the cluster's proxy (their drivers are stages of a task
//! that also runs the transport), and any connection not yet
//! authenticated (its handshake deadline runs in the task).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use rustix::event::epoll;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;

use crate::driver::{Driver, EventQueue, HardStop, ParkedDriver, ProtocolConnection, Transport};
use crate::listener::{ParkedTail, TaskTail};
use crate::ws_frames::{WsAtRest, WsByteStream};

/// Ticks of the park timer (100 ms, `coarse_timer::PARK_TICK`) an idle
/// connection stays in its task before it is parked: quiet at two idle
/// points this far apart, so after 100 to 200 ms without traffic. A
/// connection busier than that stays in its task, where a packet costs
/// no more than before (a few loads at each idle point, and a wake-up of
/// the task every 200 ms); one slower pays a park and a resume per packet
/// (four `epoll_ctl`s, a task spawn and two small allocations, a few µs).
/// Short, so that the tasks of a burst of connections that go quiet (a
/// fleet reconnecting) are freed while the burst lasts, and their memory
/// serves the next connections' tasks.
pub(crate) const PARK_AFTER_TICKS: u32 = 2;

/// Readiness events taken from the parker's epoll set per `epoll_wait`.
const EVENTS_PER_WAIT: usize = 256;

/// Resumes per poll of the parker's task before it yields (a mass
/// wake-up: the hard stop, a broadcast to every parked subscriber).
const RESUMES_PER_POLL: usize = 1024;

/// A parked connection, whatever its protocol.
trait Parked: Send {
    fn socket(&self) -> BorrowedFd<'_>;
    fn events(&self) -> &Arc<EventQueue>;
    fn wake_due(&self) -> bool;
    /// Back into a task of its own.
    fn resume(self: Box<Self>, parker: &Arc<Parker>);
}

/// A transport whose connection can be parked: what it keeps while out of
/// tokio (its socket, deregistered, and whatever else it cannot do
/// without), and the way back.
pub(crate) trait ParkableIo: Transport + Sized + 'static {
    type Parked: AsFd + Send + 'static;
    /// Out of tokio; the transport is at rest ([`Transport::is_at_rest`]).
    fn park(self) -> std::io::Result<Self::Parked>;
    /// Back in tokio.
    fn resume(parked: Self::Parked) -> std::io::Result<Self>;
}

impl ParkableIo for TcpStream {
    type Parked = std::net::TcpStream;

    fn park(self) -> std::io::Result<std::net::TcpStream> {
        self.into_std()
    }

    fn resume(parked: std::net::TcpStream) -> std::io::Result<Self> {
        TcpStream::from_std(parked)
    }
}

/// A parked WebSocket over plain TCP: its socket and its framing's
/// settings (the framing is at rest: no cut frame header, no message
/// under way, nothing owed to the peer).
pub(crate) struct ParkedWs {
    socket: std::net::TcpStream,
    framing: WsAtRest,
}

impl AsFd for ParkedWs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl ParkableIo for WsByteStream<TcpStream> {
    type Parked = ParkedWs;

    fn park(self) -> std::io::Result<ParkedWs> {
        let Some((io, framing)) = self.into_rest() else {
            // The driver parks only over a transport at rest.
            return Err(std::io::Error::other("WebSocket framing not at rest"));
        };
        Ok(ParkedWs {
            socket: io.into_std()?,
            framing,
        })
    }

    fn resume(parked: ParkedWs) -> std::io::Result<Self> {
        let io = TcpStream::from_std(parked.socket)?;
        Ok(WsByteStream::from_rest(io, parked.framing))
    }
}

/// A parked connection: its driver's state, its transport out of tokio
/// and what its task held besides the driver.
struct ParkedConn<C, T: ParkableIo> {
    driver: ParkedDriver<C>,
    socket: T::Parked,
    tail: ParkedTail,
}

impl<C: ProtocolConnection, T: ParkableIo> Parked for ParkedConn<C, T> {
    fn socket(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    fn events(&self) -> &Arc<EventQueue> {
        self.driver.events()
    }

    fn wake_due(&self) -> bool {
        self.driver.wake_due()
    }

    fn resume(self: Box<Self>, parker: &Arc<Parker>) {
        let ParkedConn {
            driver,
            socket,
            tail,
        } = *self;
        match T::resume(socket) {
            Ok(io) => {
                let tail = tail.resume(driver.conn_id());
                tokio::spawn(ParkableTask::new(
                    driver.resume(io),
                    tail,
                    Arc::clone(parker),
                ));
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot resume a parked connection; closing");
                driver.close();
            }
        }
    }
}

/// The parked connections of one server, and the task that resumes them.
pub(crate) struct Parker {
    /// The epoll set of the parked sockets, readable (in tokio's eyes)
    /// when one of them is.
    epoll: AsyncFd<OwnedFd>,
    slots: Mutex<Slots>,
    /// Keys of parked connections whose sink was woken.
    woken: Mutex<Vec<u32>>,
    /// The parker's task.
    waker: AtomicWaker,
    hard_stop: Arc<HardStop>,
    /// Resumes of parked connections (for `/metrics`).
    resumes: AtomicU64,
    me: Weak<Parker>,
}

/// The slab of parked connections.
#[derive(Default)]
struct Slots {
    parked: Vec<Option<Box<dyn Parked>>>,
    free: Vec<u32>,
    /// The hard stop came: nothing parks any more.
    closed: bool,
    /// Connections parked now.
    len: usize,
}

impl Slots {
    fn reserve(&mut self) -> Option<u32> {
        if let Some(key) = self.free.pop() {
            return Some(key);
        }
        let key = u32::try_from(self.parked.len()).ok()?;
        self.parked.push(None);
        Some(key)
    }

    fn take(&mut self, key: u32) -> Option<Box<dyn Parked>> {
        let taken = self.parked.get_mut(key as usize)?.take()?;
        self.free.push(key);
        self.len -= 1;
        Some(taken)
    }
}

impl Parker {
    /// A parker for a server whose hard stop is `hard_stop`, and its task
    /// (spawned on the current runtime).
    pub(crate) fn start(hard_stop: Arc<HardStop>) -> std::io::Result<Arc<Parker>> {
        let fd = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        // Deprecated because a `T` that hands out a raw fd it may close
        // while registered breaks I/O safety, and its replacement is
        // `unsafe` (forbidden here). An `OwnedFd` moved in cannot: the
        // descriptor lives exactly as long as the registration.
        #[allow(deprecated)]
        let epoll = AsyncFd::with_interest(fd, tokio::io::Interest::READABLE)?;
        let parker = Arc::new_cyclic(|me| Parker {
            epoll,
            slots: Mutex::default(),
            woken: Mutex::default(),
            waker: AtomicWaker::new(),
            hard_stop,
            resumes: AtomicU64::new(0),
            me: me.clone(),
        });
        let running = Arc::clone(&parker);
        tokio::spawn(std::future::poll_fn(move |cx| running.poll_run(cx)));
        Ok(parker)
    }

    /// Wakes the parker's task (it then sees the hard stop).
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// Parks `conn`, or resumes it at once if it may not park or a wake
    /// for it is already due.
    fn park(self: &Arc<Self>, conn: Box<dyn Parked>) {
        let mut slots = self.slots.lock();
        let key = match slots.reserve() {
            Some(key) if !slots.closed => key,
            _ => {
                drop(slots);
                conn.resume(self);
                return;
            }
        };
        // Under the slab's lock, so that the parker cannot look for this
        // key before the connection is in its slot: a wake or a readiness
        // event from now on finds it there.
        conn.events().set_waker(&Waker::from(Arc::new(ParkWake {
            parker: self.me.clone(),
            key,
        })));
        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT;
        let added = epoll::add(
            self.epoll.get_ref(),
            conn.socket(),
            epoll::EventData::new_u64(u64::from(key)),
            flags,
        );
        if let Err(e) = &added {
            tracing::debug!(error = %e, "cannot park a connection; it stays in its task");
        }
        if added.is_err() || conn.wake_due() {
            slots.free.push(key);
            drop(slots);
            if added.is_ok() {
                let _ = epoll::delete(self.epoll.get_ref(), conn.socket());
            }
            conn.resume(self);
            return;
        }
        slots.parked[key as usize] = Some(conn);
        slots.len += 1;
    }

    /// How many times a parked connection was resumed.
    pub(crate) fn resumes(&self) -> u64 {
        self.resumes.load(Ordering::Relaxed)
    }

    /// How many connections are parked now.
    pub(crate) fn parked(&self) -> usize {
        self.slots.lock().len
    }

    /// Resumes the connection parked under `key`, if any (a stale key
    /// may name the next connection parked there: it resumes for nothing
    /// and parks again).
    fn unpark(self: &Arc<Self>, key: u32) {
        let Some(conn) = self.slots.lock().take(key) else {
            return;
        };
        self.resumes.fetch_add(1, Ordering::Relaxed);
        let _ = epoll::delete(self.epoll.get_ref(), conn.socket());
        conn.resume(self);
    }

    fn poll_run(self: &Arc<Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.waker.register(cx.waker());
        if self.hard_stop.is_stopped() {
            // Every parked connection back to a task, which sees the stop.
            let parked = {
                let mut slots = self.slots.lock();
                slots.closed = true;
                slots.free.clear();
                slots.len = 0;
                std::mem::take(&mut slots.parked)
            };
            for conn in parked.into_iter().flatten() {
                let _ = epoll::delete(self.epoll.get_ref(), conn.socket());
                conn.resume(self);
            }
            return Poll::Ready(());
        }
        let mut resumed = 0;
        let woken = std::mem::take(&mut *self.woken.lock());
        for key in woken {
            self.unpark(key);
            resumed += 1;
        }
        let mut events = Vec::with_capacity(EVENTS_PER_WAIT);
        while resumed < RESUMES_PER_POLL {
            let mut ready = match self.epoll.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(ready)) => ready,
                Poll::Ready(Err(e)) => {
                    tracing::error!(error = %e, "parked connections' epoll set failed");
                    return Poll::Pending;
                }
            };
            events.clear();
            let zero = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            match epoll::wait(
                self.epoll.get_ref(),
                rustix::buffer::spare_capacity(&mut events),
                Some(&zero),
            ) {
                Ok(n) if n < EVENTS_PER_WAIT => ready.clear_ready(),
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "waiting on the parked connections failed");
                    ready.clear_ready();
                }
            }
            drop(ready);
            for event in &events {
                // Our keys are u32s.
                self.unpark(event.data.u64() as u32);
                resumed += 1;
            }
        }
        // A burst: let the resumed tasks run, then go on.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The waker of a parked connection's sink: queues its key for the
/// parker.
struct ParkWake {
    parker: Weak<Parker>,
    key: u32,
}

impl Wake for ParkWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(parker) = self.parker.upgrade() {
            parker.woken.lock().push(self.key);
            parker.waker.wake();
        }
    }
}

/// The task of an authenticated-or-not connection over plain TCP or
/// plain WebSocket that may be parked: [`super::listener::ConnectionTask`]'s
/// job, plus handing the driver to the parker when it asks to be.
pub(crate) struct ParkableTask<C, T = TcpStream> {
    inner: Option<(Driver<C, T>, TaskTail)>,
    parker: Arc<Parker>,
}

impl<C, T> ParkableTask<C, T> {
    pub(crate) fn new(driver: Driver<C, T>, tail: TaskTail, parker: Arc<Parker>) -> Self {
        Self {
            inner: Some((driver, tail)),
            parker,
        }
    }
}

impl<C: ProtocolConnection, T: ParkableIo> std::future::Future for ParkableTask<C, T> {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let Some((driver, tail)) = this.inner.as_mut() else {
            return Poll::Ready(());
        };
        if !driver.may_park() && tail.is_authenticated() {
            driver.allow_parking();
        }
        if std::pin::Pin::new(&mut *driver).poll(cx).is_ready() {
            if driver.wants_to_park() {
                if let Some((driver, tail)) = this.inner.take() {
                    let (parked, io) = driver.park();
                    match io.park() {
                        Ok(socket) => this.parker.park(Box::new(ParkedConn::<C, T> {
                            driver: parked,
                            socket,
                            tail: tail.park(),
                        })),
                        Err(e) => {
                            tracing::debug!(error = %e, "cannot park a connection's socket; closing");
                            parked.close();
                        }
                    }
                }
            }
            return Poll::Ready(());
        }
        if tail.poll_expired(cx) {
            return Poll::Ready(());
        }
        if !driver.may_park() && tail.is_authenticated() {
            // Authenticated in this poll (a login checked off the task, as
            // STOMP's): once more, so that the idle driver starts its
            // spell, which nothing else may wake it for.
            driver.allow_parking();
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    //! Parked connections over real sockets, in raw MQTT 3.1.1 / 5 and
    //! STOMP 1.2 (the adapters' own tests cover the protocols; these, that
    //! a parked connection comes back for everything that concerns it).

    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use rosetta_config::{Config, ListenAddr, ListenerKind};

    use crate::RunningBroker;

    async fn broker(dir: &std::path::Path) -> RunningBroker {
        broker_with(dir, |_| {}).await
    }

    async fn broker_with(dir: &std::path::Path, adjust: impl FnOnce(&mut Config)) -> RunningBroker {
        let mut config = Config {
            data_dir: dir.join("data"),
            ..Config::default()
        };
        config.listeners.mqtt = Some(ListenAddr::new("127.0.0.1", 0));
        config.listeners.stomp = Some(ListenAddr::new("127.0.0.1", 0));
        config.listeners.amqp = None;
        config.listeners.websocket = None;
        config.listeners.mqtts = None;
        config.listeners.stomps = None;
        config.listeners.amqps = None;
        config.listeners.wss = None;
        config.listeners.any = None;
        config.sys.interval_s = 0;
        adjust(&mut config);
        crate::start(config, std::sync::Arc::new(rosetta_core::AllowAll))
            .await
            .expect("broker starts")
    }

    fn parked(broker: &RunningBroker) -> usize {
        broker.parked_connections()
    }

    /// Waits until `n` connections are parked (they park after 100 to
    /// 200 ms of quiet).
    async fn until_parked(broker: &RunningBroker, n: usize) {
        let start = Instant::now();
        while parked(broker) != n {
            assert!(
                start.elapsed() < Duration::from_secs(6),
                "{} parked, not {n}",
                parked(broker)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// MQTT CONNECT (`level` 4 or 5), clean session.
    fn connect(level: u8, client_id: &str, keep_alive_s: u16) -> Vec<u8> {
        let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', level, 0x02];
        body.extend_from_slice(&keep_alive_s.to_be_bytes());
        if level == 5 {
            body.push(0);
        }
        body.extend_from_slice(&(client_id.len() as u16).to_be_bytes());
        body.extend_from_slice(client_id.as_bytes());
        packet(0x10, &body)
    }

    fn packet(first: u8, body: &[u8]) -> Vec<u8> {
        assert!(body.len() < 128);
        let mut p = vec![first, body.len() as u8];
        p.extend_from_slice(body);
        p
    }

    fn subscribe(topic: &str) -> Vec<u8> {
        let mut body = vec![0, 1];
        body.extend_from_slice(&(topic.len() as u16).to_be_bytes());
        body.extend_from_slice(topic.as_bytes());
        body.push(0);
        packet(0x82, &body)
    }

    fn publish(topic: &str, payload: &[u8]) -> Vec<u8> {
        let mut body = (topic.len() as u16).to_be_bytes().to_vec();
        body.extend_from_slice(topic.as_bytes());
        body.extend_from_slice(payload);
        packet(0x30, &body)
    }

    /// Reads one MQTT packet (short remaining lengths only).
    async fn read_packet(stream: &mut TcpStream) -> Vec<u8> {
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).await.expect("packet head");
        assert!(head[1] < 128, "short packets only");
        let mut body = vec![0u8; head[1] as usize];
        stream.read_exact(&mut body).await.expect("packet body");
        let mut p = head.to_vec();
        p.extend_from_slice(&body);
        p
    }

    async fn mqtt_client(
        broker: &RunningBroker,
        level: u8,
        id: &str,
        keep_alive_s: u16,
    ) -> TcpStream {
        let addr = broker.local_addr(ListenerKind::Mqtt).expect("mqtt");
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(&connect(level, id, keep_alive_s))
            .await
            .expect("CONNECT");
        let connack = read_packet(&mut stream).await;
        assert_eq!(connack[0], 0x20, "CONNACK");
        stream
    }

    /// Whether the broker closed `stream` (EOF or reset) within `within`.
    async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        loop {
            match tokio::time::timeout(within, stream.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// A client with a 4 s keep-alive, silent since `connected`, was
    /// closed 6 s after (1.5 times it), not at the coarse timer's early
    /// wake-up 1.5 s before nor long after.
    fn assert_closed_at_keep_alive(connected: Instant) {
        let after = connected.elapsed();
        assert!(
            after >= Duration::from_millis(5900) && after < Duration::from_millis(7500),
            "closed after {after:?}"
        );
    }

    /// What an MQTT 5 client read after an admin close with the reason
    /// "maintenance": a DISCONNECT carrying it.
    fn assert_disconnect_with_reason(got: &[u8]) {
        assert_eq!(got.first(), Some(&0xE0), "a DISCONNECT: {got:?}");
        assert!(
            got.windows(11).any(|w| w == b"maintenance"),
            "with the reason: {got:?}"
        );
    }

    /// What a parked connection holds, against its task's future (the
    /// task cell adds tokio's header and rounds up to 128 B).
    #[test]
    fn a_parked_connection_is_smaller_than_its_task() {
        use super::{ParkableTask, ParkedConn};
        use crate::ws_frames::WsByteStream;
        type Ws = WsByteStream<TcpStream>;
        let sizes = [
            (
                "mqtt",
                std::mem::size_of::<ParkedConn<rosetta_mqtt::MqttConnection, TcpStream>>(),
                std::mem::size_of::<ParkableTask<rosetta_mqtt::MqttConnection>>(),
            ),
            (
                "stomp",
                std::mem::size_of::<ParkedConn<rosetta_stomp::StompConnection, TcpStream>>(),
                std::mem::size_of::<ParkableTask<rosetta_stomp::StompConnection>>(),
            ),
            (
                "amqp",
                std::mem::size_of::<ParkedConn<rosetta_amqp::AmqpConnection, TcpStream>>(),
                std::mem::size_of::<ParkableTask<rosetta_amqp::AmqpConnection>>(),
            ),
            (
                "mqtt-ws",
                std::mem::size_of::<ParkedConn<rosetta_mqtt::MqttConnection, Ws>>(),
                std::mem::size_of::<ParkableTask<rosetta_mqtt::MqttConnection, Ws>>(),
            ),
            (
                "stomp-ws",
                std::mem::size_of::<ParkedConn<rosetta_stomp::StompConnection, Ws>>(),
                std::mem::size_of::<ParkableTask<rosetta_stomp::StompConnection, Ws>>(),
            ),
            (
                "amqp-ws",
                std::mem::size_of::<ParkedConn<rosetta_amqp::AmqpConnection, Ws>>(),
                std::mem::size_of::<ParkableTask<rosetta_amqp::AmqpConnection, Ws>>(),
            ),
        ];
        for (protocol, parked, task) in sizes {
            println!("{protocol}: parked {parked} B, task future {task} B");
            assert!(
                parked + 64 < task,
                "{protocol}: parked {parked}, task {task}"
            );
        }
        // Within jemalloc's 192 and 224 B size classes: 8 bytes more cost
        // a parked MQTT or AMQP connection 32.
        assert!(sizes[0].1 <= 192, "mqtt: {}", sizes[0].1);
        assert!(sizes[2].1 <= 192, "amqp: {}", sizes[2].1);
        // STOMP within jemalloc's 224 B class (it was 416 B, the 448
        // class, before its login-only and busy-only state moved out).
        assert!(sizes[1].1 <= 224, "stomp: {}", sizes[1].1);
        // A WebSocket's framing adds its settings (16 B) to the socket.
        assert!(sizes[3].1 <= sizes[0].1 + 16, "mqtt-ws: {}", sizes[3].1);
    }

    #[tokio::test]
    async fn a_parked_subscriber_gets_its_delivery_promptly_and_answers_pings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let broker = broker(dir.path()).await;
        let mut sub = mqtt_client(&broker, 4, "sub", 60).await;
        sub.write_all(&subscribe("dev/cmd"))
            .await
            .expect("SUBSCRIBE");
        assert_eq!(read_packet(&mut sub).await[0], 0x90, "SUBACK");
        until_parked(&broker, 1).await;

        let mut publisher = mqtt_client(&broker, 4, "pub", 0).await;
        let sent = Instant::now();
        publisher
            .write_all(&publish("dev/cmd", b"on"))
            .await
            .expect("PUBLISH");
        let delivery = tokio::time::timeout(Duration::from_secs(2), read_packet(&mut sub))
            .await
            .expect("delivered to the parked subscriber");
        let latency = sent.elapsed();
        println!("publish to a parked subscriber's delivery: {latency:?}");
        assert_eq!(delivery, publish("dev/cmd", b"on"));
        assert!(latency < Duration::from_millis(250), "took {latency:?}");

        // Both quiet again: both park; the subscriber's socket wakes it.
        until_parked(&broker, 2).await;
        sub.write_all(&[0xC0, 0]).await.expect("PINGREQ");
        let pong = tokio::time::timeout(Duration::from_secs(2), read_packet(&mut sub))
            .await
            .expect("PINGRESP from a parked connection");
        assert_eq!(pong, [0xD0, 0]);
        // The publisher's own disconnect reaches the broker while parked.
        drop(publisher);
        until_parked(&broker, 1).await;
        broker.shutdown().await.expect("shutdown");
    }

    #[tokio::test]
    async fn a_parked_silent_client_is_dropped_at_its_keep_alive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let broker = broker(dir.path()).await;
        // Keep-alive 4 s: closed 6 s after its last packet, and parked
        // for most of that (the coarse timer wakes it 1.5 s before).
        let connected = Instant::now();
        let mut silent = mqtt_client(&broker, 4, "silent", 4).await;
        until_parked(&broker, 1).await;
        assert!(
            closed_within(&mut silent, Duration::from_secs(10)).await,
            "not closed"
        );
        assert_closed_at_keep_alive(connected);
        assert_eq!(parked(&broker), 0);
        broker.shutdown().await.expect("shutdown");
    }

    /// A connection's far deadline moves later when it logs in (from the
    /// connect deadline to its keep-alive): a parked connection must not
    /// be resumed for the deadline it no longer has (a fleet that
    /// connected together would all resume together, `connect_timeout_ms`
    /// after it came).
    #[tokio::test]
    async fn a_parked_connection_is_not_resumed_for_its_past_connect_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let broker = broker_with(dir.path(), |c| c.broker.connect_timeout_ms = 4_000).await;
        let connected = Instant::now();
        let _quiet = mqtt_client(&broker, 4, "quiet", 60).await;
        until_parked(&broker, 1).await;
        let resumes = broker.parked_resumes();
        // Past the connect deadline, and past the coarse timer's early
        // wake-up for it.
        tokio::time::sleep(Duration::from_millis(5_500).saturating_sub(connected.elapsed())).await;
        assert_eq!(broker.parked_resumes(), resumes, "resumed for nothing");
        assert_eq!(parked(&broker), 1);
        broker.shutdown().await.expect("shutdown");
    }

    #[tokio::test]
    async fn an_admin_close_reaches_a_parked_connection_with_its_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let broker = broker(dir.path()).await;
        let mut client = mqtt_client(&broker, 5, "kicked", 60).await;
        until_parked(&broker, 1).await;
        let id = broker.shared.connections.list()[0].id;
        assert!(broker.shared.connections.close(id, "maintenance".into()));
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), client.read_to_end(&mut got)).await;
        assert!(read.is_ok(), "closed promptly");
        assert_disconnect_with_reason(&got);
        broker.shutdown().await.expect("shutdown");
    }

    #[tokio::test]
    async fn shutdown_closes_parked_connections() {
        let dir = tempfile::tempdir().expect("tempdir");
        let broker = broker(dir.path()).await;
        let mut mqtt = mqtt_client(&broker, 4, "a", 60).await;
        let stomp_addr = broker.local_addr(ListenerKind::Stomp).expect("stomp");
        let mut stomp = TcpStream::connect(stomp_addr).await.expect("connect");
        stomp
            .write_all(b"CONNECT\naccept-version:1.2\nhost:/\nheart-beat:0,0\n\n\0")
            .await
            .expect("CONNECT");
        let mut buf = [0u8; 9];
        stomp.read_exact(&mut buf).await.expect("CONNECTED");
        assert_eq!(&buf, b"CONNECTED");
        until_parked(&broker, 2).await;
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), broker.shutdown())
            .await
            .expect("shutdown does not wait for parked connections")
            .expect("shutdown");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(closed_within(&mut mqtt, Duration::from_secs(2)).await);
        assert!(closed_within(&mut stomp, Duration::from_secs(2)).await);
    }

    /// MQTT over a plain WebSocket (`/mqtt`), with a tungstenite client.
    mod websocket {
        use std::time::{Duration, Instant};

        use futures_util::{SinkExt, StreamExt};
        use tokio::net::TcpStream;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::WebSocketStream;

        use rosetta_config::{ListenAddr, ListenerKind};

        use super::{
            assert_closed_at_keep_alive, assert_disconnect_with_reason, broker_with, connect,
            parked, publish, subscribe, until_parked,
        };
        use crate::RunningBroker;

        type Client = WebSocketStream<TcpStream>;

        async fn ws_broker(dir: &std::path::Path) -> RunningBroker {
            broker_with(dir, |c| {
                c.listeners.websocket = Some(ListenAddr::new("127.0.0.1", 0));
            })
            .await
        }

        async fn ws_client(
            broker: &RunningBroker,
            level: u8,
            id: &str,
            keep_alive_s: u16,
        ) -> Client {
            let addr = broker
                .local_addr(ListenerKind::WebSocket)
                .expect("websocket");
            let mut request = format!("ws://{addr}/mqtt")
                .into_client_request()
                .expect("request");
            request
                .headers_mut()
                .insert("Sec-WebSocket-Protocol", "mqtt".parse().expect("header"));
            let tcp = TcpStream::connect(addr).await.expect("connect");
            let (mut client, _) = tokio_tungstenite::client_async(request, tcp)
                .await
                .expect("upgrade");
            send(&mut client, connect(level, id, keep_alive_s)).await;
            assert_eq!(read_packet(&mut client).await[0], 0x20, "CONNACK");
            client
        }

        async fn send(client: &mut Client, packet: Vec<u8>) {
            client
                .send(Message::Binary(packet.into()))
                .await
                .expect("send");
        }

        /// The next message: one MQTT packet (the broker sends one
        /// message per flush, and these tests expect one packet at a
        /// time).
        async fn read_message(client: &mut Client) -> Message {
            tokio::time::timeout(Duration::from_secs(3), client.next())
                .await
                .expect("a message in time")
                .expect("not closed")
                .expect("a message")
        }

        async fn read_packet(client: &mut Client) -> Vec<u8> {
            match read_message(client).await {
                Message::Binary(packet) => packet.to_vec(),
                other => panic!("not a binary message: {other:?}"),
            }
        }

        /// Whether the broker closed the WebSocket (a close frame, the
        /// stream's end or an error) within `within`; the data messages
        /// before are returned too.
        async fn closed_within(client: &mut Client, within: Duration) -> (bool, Vec<u8>) {
            let mut data = Vec::new();
            loop {
                match tokio::time::timeout(within, client.next()).await {
                    Err(_) => return (false, data),
                    Ok(None | Some(Err(_)) | Some(Ok(Message::Close(_)))) => return (true, data),
                    Ok(Some(Ok(Message::Binary(b)))) => data.extend_from_slice(&b),
                    Ok(Some(Ok(_))) => {}
                }
            }
        }

        #[tokio::test]
        async fn a_parked_websocket_subscriber_gets_its_delivery_and_answers_pings() {
            let dir = tempfile::tempdir().expect("tempdir");
            let broker = ws_broker(dir.path()).await;
            let mut sub = ws_client(&broker, 4, "ws-sub", 60).await;
            send(&mut sub, subscribe("dev/cmd")).await;
            assert_eq!(read_packet(&mut sub).await[0], 0x90, "SUBACK");
            until_parked(&broker, 1).await;

            let mut publisher = ws_client(&broker, 4, "ws-pub", 0).await;
            let sent = Instant::now();
            send(&mut publisher, publish("dev/cmd", b"on")).await;
            let delivery = read_packet(&mut sub).await;
            println!(
                "publish to a parked WebSocket subscriber: {:?}",
                sent.elapsed()
            );
            assert_eq!(delivery, publish("dev/cmd", b"on"));

            // Both quiet again: both park. A WebSocket ping (the browser's
            // keep-alive) resumes the subscriber, which answers it.
            until_parked(&broker, 2).await;
            sub.send(Message::Ping(b"are you there".to_vec().into()))
                .await
                .expect("ping");
            match read_message(&mut sub).await {
                Message::Pong(payload) => assert_eq!(&payload[..], b"are you there"),
                other => panic!("not a pong: {other:?}"),
            }
            // It parks again, and MQTT still works over it.
            until_parked(&broker, 2).await;
            send(&mut sub, vec![0xC0, 0]).await;
            assert_eq!(read_packet(&mut sub).await, [0xD0, 0], "PINGRESP");
            // The publisher's own close reaches the broker while parked.
            publisher.close(None).await.expect("close");
            drop(publisher);
            until_parked(&broker, 1).await;
            broker.shutdown().await.expect("shutdown");
        }

        /// A STOMP client over WebSocket (`/stomp`), logged in.
        async fn stomp_ws_client(broker: &RunningBroker, text: bool) -> Client {
            let addr = broker
                .local_addr(ListenerKind::WebSocket)
                .expect("websocket");
            let mut request = format!("ws://{addr}/stomp")
                .into_client_request()
                .expect("request");
            request.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                "v12.stomp".parse().expect("header"),
            );
            let tcp = TcpStream::connect(addr).await.expect("connect");
            let (mut client, _) = tokio_tungstenite::client_async(request, tcp)
                .await
                .expect("upgrade");
            stomp_send(
                &mut client,
                text,
                "CONNECT\naccept-version:1.2\nhost:/\nheart-beat:0,0\n\n\0",
            )
            .await;
            assert!(stomp_frame(&mut client, text)
                .await
                .starts_with("CONNECTED"));
            client
        }

        async fn stomp_send(client: &mut Client, text: bool, frame: &str) {
            let message = if text {
                Message::Text(frame.into())
            } else {
                Message::Binary(frame.as_bytes().to_vec().into())
            };
            client.send(message).await.expect("send");
        }

        /// The next STOMP frame, in a message of the type asked for.
        async fn stomp_frame(client: &mut Client, text: bool) -> String {
            match read_message(client).await {
                Message::Text(t) if text => t.to_string(),
                Message::Binary(b) if !text => String::from_utf8_lossy(&b).into_owned(),
                other => panic!("not the message type expected (text {text}): {other:?}"),
            }
        }

        /// STOMP answers in the type of the client's last data message;
        /// parking keeps that (the framing's `reply_text`).
        #[tokio::test]
        async fn a_parked_stomp_websocket_subscriber_gets_its_message_in_its_type() {
            let dir = tempfile::tempdir().expect("tempdir");
            let broker = ws_broker(dir.path()).await;
            for text in [true, false] {
                let mut sub = stomp_ws_client(&broker, text).await;
                let subscribe = "SUBSCRIBE\nid:0\ndestination:/topic/dev\nreceipt:r\n\n\0";
                stomp_send(&mut sub, text, subscribe).await;
                assert!(stomp_frame(&mut sub, text).await.starts_with("RECEIPT"));
                until_parked(&broker, 1).await;
                let mut publisher = stomp_ws_client(&broker, true).await;
                stomp_send(&mut publisher, true, "SEND\ndestination:/topic/dev\n\non\0").await;
                let message = stomp_frame(&mut sub, text).await;
                assert!(message.starts_with("MESSAGE"), "{message}");
                assert!(message.ends_with("\n\non\0"), "{message}");
                drop(publisher);
                drop(sub);
                until_parked(&broker, 0).await;
            }
            broker.shutdown().await.expect("shutdown");
        }

        #[tokio::test]
        async fn a_parked_silent_websocket_client_is_dropped_at_its_keep_alive() {
            let dir = tempfile::tempdir().expect("tempdir");
            let broker = ws_broker(dir.path()).await;
            let connected = Instant::now();
            let mut silent = ws_client(&broker, 4, "ws-silent", 4).await;
            until_parked(&broker, 1).await;
            let (closed, _) = closed_within(&mut silent, Duration::from_secs(10)).await;
            assert!(closed, "not closed");
            assert_closed_at_keep_alive(connected);
            assert_eq!(parked(&broker), 0);
            broker.shutdown().await.expect("shutdown");
        }

        #[tokio::test]
        async fn an_admin_close_reaches_a_parked_websocket_connection() {
            let dir = tempfile::tempdir().expect("tempdir");
            let broker = ws_broker(dir.path()).await;
            let mut client = ws_client(&broker, 5, "ws-kicked", 60).await;
            until_parked(&broker, 1).await;
            let id = broker.shared.connections.list()[0].id;
            assert!(broker.shared.connections.close(id, "maintenance".into()));
            let (closed, got) = closed_within(&mut client, Duration::from_secs(2)).await;
            assert!(closed, "closed promptly");
            assert_disconnect_with_reason(&got);
            broker.shutdown().await.expect("shutdown");
        }

        #[tokio::test]
        async fn shutdown_closes_parked_websocket_connections() {
            let dir = tempfile::tempdir().expect("tempdir");
            let broker = ws_broker(dir.path()).await;
            let mut a = ws_client(&broker, 4, "ws-a", 60).await;
            let mut b = ws_client(&broker, 5, "ws-b", 60).await;
            until_parked(&broker, 2).await;
            let started = Instant::now();
            tokio::time::timeout(Duration::from_secs(10), broker.shutdown())
                .await
                .expect("shutdown does not wait for parked connections")
                .expect("shutdown");
            assert!(started.elapsed() < Duration::from_secs(5));
            assert!(closed_within(&mut a, Duration::from_secs(2)).await.0);
            assert!(closed_within(&mut b, Duration::from_secs(2)).await.0);
        }
    }
}
