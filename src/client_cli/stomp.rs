//! STOMP 1.2 with the broker's own frame codec (`rosetta-stomp`'s
//! `FrameWriter` and `Decoder`, which read and write every command), over
//! TCP or TLS.

use anyhow::{bail, Context};
use rosetta_stomp::{Command, Decoder, Frame, FrameWriter, StompConfig, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::stream::{self, Io};
use super::{connecting, PublishPlan, Receiving, Target};

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;
/// The receipt asked for on the last SEND: the broker answers it once it
/// has taken every earlier frame of the connection, in order.
const LAST_SEND_RECEIPT: &str = "rosetta-pub-last";
const SUBSCRIBE_RECEIPT: &str = "rosetta-sub-subscribed";
const DISCONNECT_RECEIPT: &str = "rosetta-bye";
const SUBSCRIPTION_ID: &str = "0";

/// One connection: frames out through `out`, frames in through the decoder.
struct Client {
    io: Box<dyn Io>,
    decoder: Decoder,
    /// Bytes read and not yet taken by the decoder (it takes at most a
    /// frame's limit at a time).
    unfed: Vec<u8>,
    out: Vec<u8>,
}

impl Client {
    /// Connects and logs in: CONNECT, then CONNECTED or the broker's ERROR.
    async fn connect(target: &Target) -> anyhow::Result<Client> {
        connecting(&target.endpoint, async {
            let io = stream::open(target).await?;
            let limits = StompConfig::default().limits();
            let mut client = Client {
                io,
                decoder: Decoder::new(limits, Version::V1_0),
                unfed: Vec::new(),
                out: Vec::new(),
            };
            let e = &target.endpoint;
            let mut headers = vec![
                ("accept-version", "1.2"),
                ("host", e.host.as_str()),
                ("heart-beat", "0,0"),
                ("client-id", target.client_id.as_str()),
            ];
            if let Some(user) = &e.user {
                headers.push(("login", user));
                headers.push(("passcode", e.password.as_deref().unwrap_or_default()));
            }
            client.send(Command::Connect, &headers, b"").await?;
            let answer = client.read().await?;
            if answer.command != Command::Connected {
                bail!("the broker answered CONNECT with {}", answer.command);
            }
            client.decoder.set_version(Version::V1_2);
            Ok(client)
        })
        .await
    }

    async fn send(
        &mut self,
        command: Command,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<()> {
        let mut frame = FrameWriter::new(&mut self.out, Version::V1_2, command);
        for (name, value) in headers {
            frame.header(name, value);
        }
        frame.finish(body);
        self.io.write_all(&self.out).await?;
        self.out.clear();
        Ok(())
    }

    /// The next frame; an ERROR frame is an error with the broker's text.
    async fn read(&mut self) -> anyhow::Result<Frame> {
        let mut chunk = vec![0; READ_CHUNK_BYTES];
        loop {
            if let Some(frame) = self.decoder.decode().context("a malformed frame")? {
                if frame.command == Command::Error {
                    bail!("the broker sent ERROR: {}", error_text(&frame));
                }
                return Ok(frame);
            }
            if !self.unfed.is_empty() {
                let took = self.decoder.feed(&self.unfed);
                if took == 0 {
                    bail!("a frame larger than the decoder's limit");
                }
                self.unfed.drain(..took);
                continue;
            }
            let n = self.io.read(&mut chunk).await?;
            if n == 0 {
                bail!("the broker closed the connection");
            }
            self.unfed
                .extend_from_slice(chunk.get(..n).unwrap_or_default());
        }
    }

    /// Reads until the RECEIPT `id`; `on_message` gets the MESSAGEs before it.
    async fn until_receipt(
        &mut self,
        id: &str,
        mut on_message: impl FnMut(Frame),
    ) -> anyhow::Result<()> {
        loop {
            let frame = self.read().await?;
            match frame.command {
                Command::Receipt if frame.header("receipt-id") == Some(id) => return Ok(()),
                Command::Message => on_message(frame),
                _ => {}
            }
        }
    }

    /// DISCONNECT with a receipt, so everything sent before is taken.
    async fn disconnect(mut self) -> anyhow::Result<()> {
        self.send(Command::Disconnect, &[("receipt", DISCONNECT_RECEIPT)], b"")
            .await?;
        // MESSAGEs still coming are not acknowledged: the broker keeps them.
        self.until_receipt(DISCONNECT_RECEIPT, drop).await
    }
}

/// An ERROR frame's `message` header and body, once each: brokers often
/// repeat the one in the other.
fn error_text(frame: &Frame) -> String {
    let message = frame.header("message").unwrap_or_default();
    let body = String::from_utf8_lossy(&frame.body);
    let body = body.trim();
    if body.is_empty() || body == message {
        message.to_owned()
    } else if body.starts_with(message) {
        body.to_owned()
    } else {
        format!("{message}: {body}")
    }
}

pub(super) async fn publish(target: &Target, plan: &PublishPlan) -> anyhow::Result<()> {
    let mut client = Client::connect(target).await?;
    let destination = target.endpoint.address.canonical();
    let mut pacer = plan.pacer.clone();
    for n in 1..=plan.count {
        pacer.wait().await;
        let mut headers = vec![("destination", destination.as_str())];
        if target.qos > 0 {
            headers.push(("persistent", "true"));
        }
        if n == plan.count {
            headers.push(("receipt", LAST_SEND_RECEIPT));
        }
        client
            .send(Command::Send, &headers, &plan.payload(n))
            .await
            .with_context(|| format!("sending message {n} to {}", target.endpoint))?;
    }
    // --count is at least 1: the last SEND asked for this receipt.
    client
        .until_receipt(LAST_SEND_RECEIPT, drop)
        .await
        .with_context(|| format!("publishing to {}", target.endpoint))?;
    client.disconnect().await
}

pub(super) async fn subscribe(target: &Target, receiving: &mut Receiving) -> anyhow::Result<()> {
    let mut client = Client::connect(target).await?;
    let destination = target.endpoint.address.canonical();
    // client-individual: each message printed is acknowledged, and one
    // received past --count goes back to the broker at DISCONNECT.
    let ack_mode = if target.qos == 0 {
        "auto"
    } else {
        "client-individual"
    };
    client
        .send(
            Command::Subscribe,
            &[
                ("id", SUBSCRIPTION_ID),
                ("destination", &destination),
                ("ack", ack_mode),
                ("receipt", SUBSCRIBE_RECEIPT),
            ],
            b"",
        )
        .await?;
    let mut early = Vec::new();
    client
        .until_receipt(SUBSCRIBE_RECEIPT, |m| early.push(m))
        .await
        .with_context(|| format!("subscribing to {}", target.endpoint))?;
    receiving.subscribed(&target.endpoint);
    let mut early = early.into_iter();
    while receiving.wants_more() {
        let frame = match early.next() {
            Some(f) => f,
            None => client.read().await?,
        };
        if frame.command != Command::Message {
            continue;
        }
        receiving.take(&frame.body)?;
        if let (Some(ack), true) = (frame.header("ack"), target.qos > 0) {
            client.send(Command::Ack, &[("id", ack)], b"").await?;
        }
    }
    client.disconnect().await
}
