//! Both directions of a proxied connection, copied until either side
//! closes (then the other is closed too), the connection goes idle, or the
//! broker stops.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::HardStop;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Buffer of each direction: the most a proxied connection holds in
/// flight per direction; TCP's own windows do the rest.
pub(crate) const SPLICE_BUFFER_BYTES: usize = 16 * 1024;

/// Once one side has closed, how long the other direction may still
/// deliver what is in flight (a STOMP ERROR before the close) before the
/// connection is dropped.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// Why a splice ended (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The client closed (or failed) first.
    Client,
    /// The target closed (or failed) first.
    Target,
    /// Nothing either way for the idle timeout.
    Idle,
    /// The broker is stopping.
    Stopped,
}

/// Copies `client` to `target` and back until one of them closes, nothing
/// moves for `idle_timeout`, or the broker's hard stop comes.
pub(crate) async fn splice<C, T>(
    client: C,
    target: T,
    idle_timeout: Duration,
    stop: Arc<HardStop>,
) -> Ended
where
    C: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let last_ms = Arc::new(AtomicU64::new(0));
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut target_read, mut target_write) = tokio::io::split(target);
    let up = pump(&mut client_read, &mut target_write, &last_ms, started);
    let down = pump(&mut target_read, &mut client_write, &last_ms, started);
    tokio::pin!(up, down);
    let idle = async {
        loop {
            let last = Duration::from_millis(last_ms.load(Ordering::Relaxed));
            let quiet = started.elapsed().saturating_sub(last);
            if quiet >= idle_timeout {
                return;
            }
            tokio::time::sleep(idle_timeout - quiet).await;
        }
    };
    let stopping = stop.stopped();
    let ended = tokio::select! {
        () = &mut up => Ended::Client,
        () = &mut down => Ended::Target,
        () = idle => return Ended::Idle,
        () = stopping => return Ended::Stopped,
    };
    // Let the other direction finish what it was sending.
    let rest = async {
        match ended {
            Ended::Client => down.await,
            _ => up.await,
        }
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, rest).await;
    ended
}

/// Copies `from` into `to` until `from` ends or either fails; then shuts
/// `to` down, so its reader sees the end too.
async fn pump<R, W>(from: &mut R, to: &mut W, last_ms: &AtomicU64, started: Instant)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; SPLICE_BUFFER_BYTES];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        last_ms.store(elapsed, Ordering::Relaxed);
        let Some(chunk) = buf.get(..n) else { break };
        if to.write_all(chunk).await.is_err() || to.flush().await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_cross_both_ways_and_a_close_ends_both() {
        let (client, mut client_peer) = tokio::io::duplex(64);
        let (target, mut target_peer) = tokio::io::duplex(64);
        let stop = Arc::new(HardStop::default());
        let task = tokio::spawn(splice(client, target, Duration::from_secs(30), stop));
        client_peer.write_all(b"ping").await.expect("write");
        let mut got = [0u8; 4];
        target_peer
            .read_exact(&mut got)
            .await
            .expect("target reads");
        assert_eq!(&got, b"ping");
        target_peer.write_all(b"pong").await.expect("write");
        client_peer
            .read_exact(&mut got)
            .await
            .expect("client reads");
        assert_eq!(&got, b"pong");
        // The target closes: the client sees the end.
        drop(target_peer);
        let mut rest = Vec::new();
        client_peer.read_to_end(&mut rest).await.expect("end");
        assert!(rest.is_empty());
        assert_eq!(task.await.expect("joined"), Ended::Target);
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed() {
        let (client, _client_peer) = tokio::io::duplex(64);
        let (target, _target_peer) = tokio::io::duplex(64);
        let stop = Arc::new(HardStop::default());
        let ended = tokio::time::timeout(
            Duration::from_secs(5),
            splice(client, target, Duration::from_millis(100), stop),
        )
        .await
        .expect("ends");
        assert_eq!(ended, Ended::Idle);
    }

    #[tokio::test]
    async fn the_hard_stop_ends_a_relay() {
        let (client, _client_peer) = tokio::io::duplex(64);
        let (target, _target_peer) = tokio::io::duplex(64);
        let stop = Arc::new(HardStop::default());
        let task = tokio::spawn(splice(
            client,
            target,
            Duration::from_secs(30),
            stop.clone(),
        ));
        tokio::task::yield_now().await;
        stop.stop();
        let ended = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("ends")
            .expect("joined");
        assert_eq!(ended, Ended::Stopped);
    }
}
