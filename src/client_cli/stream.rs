//! The byte stream under STOMP and AMQP: TCP, or TLS over TCP.

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::Target;

/// A connected stream of either kind.
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> Io for T {}

/// Connects to the target's host and port, with TLS if its URL asks.
pub(super) async fn open(target: &Target) -> anyhow::Result<Box<dyn Io>> {
    let e = &target.endpoint;
    let tcp = TcpStream::connect((e.host.as_str(), e.port))
        .await
        .context("TCP connect")?;
    // Small frames (a receipt, an ACK) go out at once.
    tcp.set_nodelay(true)?;
    Ok(match &target.tls {
        Some(config) => Box::new(super::tls::connect(config.clone(), &e.host, tcp).await?),
        None => Box::new(tcp),
    })
}
