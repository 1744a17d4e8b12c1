//! `rosetta-load`: drives real MQTT, STOMP and AMQP 1.0 clients against any
//! broker at host:port and reports msg/s, end-to-end latency (p50/p99, from
//! a timestamp in each payload) and the broker's CPU microseconds per
//! message (from `/proc/<broker-pid>/stat`), or RSS per idle connection.
//!
//! Each run prints one `RESULT {json}` line for scripts (`bench/run.sh`)
//! and one line for people. Every socket has TCP_NODELAY set.
//!
//! Layout: `run` (target, tally, supervisor), `stats` (percentiles, the
//! payload timestamp, the report), `procfs` (CPU and RSS), one module per
//! protocol, and three small clients of our own: `stomp_client`,
//! `amqp_client` and `mqtt_client`.

mod amqp;
mod amqp_client;
mod idle;
mod mqtt;
mod mqtt_client;
mod procfs;
mod run;
mod stats;
mod stomp;
mod stomp_client;
mod stream;
mod tls;

use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(version, about = "Load generator for MQTT, STOMP and AMQP 1.0 brokers")]
struct Cli {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long)]
    port: u16,
    /// PID of the broker process, for CPU per message and RSS.
    #[arg(long)]
    broker_pid: Option<u32>,
    /// Name of the broker in the report.
    #[arg(long, default_value = "broker")]
    broker_name: String,
    /// End the run with an error when nothing arrived for this long.
    #[arg(long, default_value_t = 20)]
    stall_s: u64,
    /// Longest a run may take.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
    /// Producers stop after this many seconds even before their count
    /// (0: only the count ends a run). Keeps slow brokers' runs short.
    #[arg(long, default_value_t = 0)]
    duration_s: u64,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// MQTT QoS 0, 1 publisher → 1 subscriber.
    MqttQos0 {
        #[command(flatten)]
        client: mqtt::ClientArgs,
        #[arg(long, default_value_t = 200_000)]
        count: u64,
        #[arg(long, default_value_t = 256)]
        size: usize,
    },
    /// MQTT QoS 1, 1 publisher → 1 subscriber, `inflight` unacknowledged.
    MqttQos1 {
        #[command(flatten)]
        client: mqtt::ClientArgs,
        #[arg(long, default_value_t = 100_000)]
        count: u64,
        #[arg(long, default_value_t = 256)]
        size: usize,
        #[arg(long, default_value_t = 100)]
        inflight: u16,
        /// Publishes per second, paced, for latency at a steady rate
        /// (0: as fast as the window allows; needs `--client rumqttc`).
        #[arg(long, default_value_t = 0)]
        rate: u32,
    },
    /// MQTT QoS 1 fan-out, 1 publisher → `subscribers`; msg/s counts
    /// deliveries.
    MqttFanout {
        #[command(flatten)]
        client: mqtt::ClientArgs,
        #[arg(long, default_value_t = 100)]
        subscribers: usize,
        #[arg(long, default_value_t = 2_000)]
        count: u64,
        #[arg(long, default_value_t = 256)]
        size: usize,
        #[arg(long, default_value_t = 100)]
        inflight: u16,
    },
    /// N idle MQTT 3.1.1 connections; reports broker RSS growth per
    /// connection (needs --broker-pid). `idle --protocol mqtt`.
    MqttIdle {
        #[command(flatten)]
        idle: IdleArgs,
    },
    /// N idle connections of any protocol (MQTT, MQTT over WebSocket,
    /// STOMP, AMQP); reports broker RSS growth per connection (needs
    /// --broker-pid).
    Idle {
        #[arg(long, value_enum, default_value_t = idle::Protocol::Mqtt)]
        protocol: idle::Protocol,
        #[command(flatten)]
        idle: IdleArgs,
    },
    /// A QoS 1 stream between two clients while `logins` connections log
    /// in at once with a password; reports the stream's latency during
    /// the storm (p50/p99) and before it (`baseline_p99_us`).
    MqttLoginStorm {
        /// Credentials of the stream's two clients (none: anonymous).
        #[command(flatten)]
        client: mqtt::ClientArgs,
        #[arg(long, default_value_t = 500)]
        logins: usize,
        /// User name of the storm's CONNECTs.
        #[arg(long)]
        login_user: String,
        /// Password of the storm's CONNECTs.
        #[arg(long)]
        login_password: String,
        /// Stream messages per second.
        #[arg(long, default_value_t = 1000)]
        rate: u32,
        #[arg(long, default_value_t = 256)]
        size: usize,
        /// Stream time before the storm, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        before_ms: u64,
        /// Stream time after the storm's last answer, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        after_ms: u64,
    },
    /// STOMP persistent queue, producers → consumers, ack=client-individual,
    /// each SEND confirmed by a RECEIPT.
    Stomp {
        #[arg(long, default_value_t = 1)]
        producers: usize,
        #[arg(long, default_value_t = 1)]
        consumers: usize,
        #[arg(long, default_value_t = 50_000)]
        count: u64,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Outstanding receipts per producer.
        #[arg(long, default_value_t = 100)]
        window: usize,
        /// Prefetch per consumer (activemq.prefetchSize and prefetch-count).
        #[arg(long, default_value_t = 1000)]
        prefetch: u32,
        /// Send `persistent:false` instead.
        #[arg(long)]
        non_persistent: bool,
        #[arg(long)]
        login: Option<String>,
        #[arg(long)]
        passcode: Option<String>,
        /// CONNECT `host` header (RabbitMQ: the virtual host).
        #[arg(long, default_value = "/")]
        vhost: String,
        /// Each connection sends `client-id: {prefix}-{n}`.
        #[arg(long)]
        client_id_prefix: Option<String>,
    },
    /// MQTT connection rate and connect latency: `count` connections
    /// (0: until --duration-s, a churn run), `concurrency` at a time, each
    /// from TCP connect to CONNACK 0 (after following a redirect with
    /// --follow-redirect, after a full TLS handshake with --tls-ca), then
    /// DISCONNECT.
    MqttConnect {
        #[arg(long, default_value_t = 2_000)]
        count: u64,
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// 4 (MQTT 3.1.1) or 5.
        #[arg(long, default_value_t = 4)]
        version: u8,
        /// Follow CONNACK 0x9C/0x9D to the Server Reference (MQTT 5).
        #[arg(long)]
        follow_redirect: bool,
        /// Client ids are `{id_prefix}-{n}`.
        #[arg(long, default_value = "conn")]
        id_prefix: String,
        /// Connect over TLS, trusting the CA certificates in this PEM file
        /// (every connection a full handshake).
        #[arg(long)]
        tls_ca: Option<std::path::PathBuf>,
        /// The name the broker's certificate must carry.
        #[arg(long, default_value = "localhost")]
        tls_server_name: String,
        /// With --broker-pid: how long after the last connection the
        /// broker's RSS is read again, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        settle_ms: u64,
    },
    /// A stream over STOMP (issue 17): append with a batching producer
    /// (no readers), read history (`--no-append --from first`), or
    /// `readers` at the tail (`--from next`); see `stream.rs`.
    StompStream {
        /// The stream's name; the broker's `[[streams]]` must match it.
        #[arg(long)]
        stream: String,
        #[arg(long, default_value_t = 100_000)]
        count: u64,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Outstanding receipts of the producer.
        #[arg(long, default_value_t = 1000)]
        window: usize,
        #[arg(long, default_value_t = 0)]
        readers: usize,
        /// Each reader's credit (prefetch-count).
        #[arg(long, default_value_t = 1000)]
        prefetch: u32,
        /// Where readers start (x-stream-offset).
        #[arg(long, default_value = "next")]
        from: String,
        /// Read only (history): no producer.
        #[arg(long)]
        no_append: bool,
    },
    /// AMQP 1.0 queue, 1 sender → 1 receiver, unsettled with a window.
    Amqp {
        /// `wire`: our own batching client; `fe2o3`: fe2o3-amqp's.
        #[arg(long, value_enum, default_value_t = amqp::Client::Wire)]
        client: amqp::Client,
        #[arg(long, default_value_t = 50_000)]
        count: u64,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        #[arg(long, default_value_t = 1000)]
        window: usize,
        #[arg(long, default_value_t = 1000)]
        credit: u32,
        /// Send non-durable messages (broker cost without storage).
        #[arg(long)]
        non_durable: bool,
        /// Durable termini (RabbitMQ 3.x then declares a durable queue).
        #[arg(long)]
        durable_terminus: bool,
        /// SASL PLAIN user (none: no SASL layer, unless --anonymous).
        #[arg(long)]
        user: Option<String>,
        #[arg(long, default_value = "")]
        password: String,
        /// SASL ANONYMOUS (ignored with --user).
        #[arg(long)]
        anonymous: bool,
        #[arg(long, default_value = "/queue/")]
        prefix: String,
    },
}

/// The options of the idle scenarios.
#[derive(Debug, Clone, clap::Args)]
struct IdleArgs {
    #[arg(long, default_value_t = 10_000)]
    connections: usize,
    /// Each connection also subscribes to a topic of its own (MQTT at
    /// QoS 1, STOMP ack=client-individual, AMQP a receiving link), as a
    /// device waiting for commands does.
    #[arg(long)]
    subscribe: bool,
    /// MQTT keep-alive, STOMP heart-beat and so on, in seconds (0: none).
    #[arg(long, default_value_t = 0)]
    keep_alive_s: u16,
    /// After reading RSS, print `HOLDING` and keep the connections open
    /// this many more seconds (0: close at once), so that another process
    /// can measure a stream beside them (bench/idle_stream.sh).
    #[arg(long, default_value_t = 0)]
    hold_s: u64,
    /// Open at most this many connections per second (0: as fast as 100
    /// handshakes at a time allow), as a fleet that comes online over
    /// minutes does rather than a burst.
    #[arg(long, default_value_t = 0)]
    connect_rate: u32,
}

impl IdleArgs {
    fn of(self, protocol: idle::Protocol) -> idle::Idle {
        idle::Idle {
            protocol,
            connections: self.connections,
            subscribe: self.subscribe,
            keep_alive_s: self.keep_alive_s,
            hold: Duration::from_secs(self.hold_s),
            connect_rate: self.connect_rate,
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let target = run::Target {
        host: cli.host,
        port: cli.port,
        name: cli.broker_name,
        proc: cli.broker_pid.map(procfs::Broker::new),
        stall: Duration::from_secs(cli.stall_s),
        timeout: Duration::from_secs(cli.timeout_s),
        duration: (cli.duration_s > 0).then(|| Duration::from_secs(cli.duration_s)),
    };
    // Start the latency clock before any payload is stamped.
    stats::now_ns();
    let pubsub = |scenario: &str, client, qos, subscribers, count, size, inflight| mqtt::PubSub {
        scenario: scenario.into(),
        client,
        qos,
        subscribers,
        count,
        size,
        inflight,
        rate: 0,
    };
    let report = match cli.scenario {
        Scenario::MqttQos0 {
            client,
            count,
            size,
        } => {
            let p = pubsub("mqtt-qos0", client, 0, 1, count, size, 100);
            mqtt::pubsub(&target, &p).await?
        }
        Scenario::MqttQos1 {
            client,
            count,
            size,
            inflight,
            rate,
        } => {
            let p = mqtt::PubSub {
                rate,
                ..pubsub("mqtt-qos1", client, 1, 1, count, size, inflight)
            };
            mqtt::pubsub(&target, &p).await?
        }
        Scenario::MqttFanout {
            client,
            subscribers,
            count,
            size,
            inflight,
        } => {
            let name = format!("mqtt-fanout{subscribers}");
            let p = pubsub(&name, client, 1, subscribers, count, size, inflight);
            mqtt::pubsub(&target, &p).await?
        }
        Scenario::MqttIdle { idle } => idle::run(&target, idle.of(idle::Protocol::Mqtt)).await?,
        Scenario::Idle { protocol, idle } => idle::run(&target, idle.of(protocol)).await?,
        Scenario::MqttLoginStorm {
            client,
            logins,
            login_user,
            login_password,
            rate,
            size,
            before_ms,
            after_ms,
        } => {
            let storm = mqtt::login_storm::Storm {
                client,
                logins,
                user: login_user,
                password: login_password,
                rate,
                size,
                before: Duration::from_millis(before_ms),
                after: Duration::from_millis(after_ms),
            };
            mqtt::login_storm::run(&target, storm).await?
        }
        Scenario::Stomp {
            producers,
            consumers,
            count,
            size,
            window,
            prefetch,
            non_persistent,
            login,
            passcode,
            vhost,
            client_id_prefix,
        } => {
            let p = stomp::Params {
                producers,
                consumers,
                count,
                size,
                window,
                prefetch,
                persistent: !non_persistent,
                login: stomp_client::Login {
                    login,
                    passcode,
                    host: vhost,
                    client_id_prefix,
                },
            };
            stomp::run(&target, &p).await?
        }
        Scenario::MqttConnect {
            count,
            concurrency,
            version,
            follow_redirect,
            id_prefix,
            tls_ca,
            tls_server_name,
            settle_ms,
        } => {
            let tls = tls_ca
                .map(|ca| tls::TlsClient::new(&ca, &tls_server_name).map(std::sync::Arc::new))
                .transpose()?;
            let r = mqtt::connect::ConnectRun {
                count,
                concurrency,
                version,
                follow_redirect,
                id_prefix,
                tls,
                settle: Duration::from_millis(settle_ms),
            };
            mqtt::connect::run(&target, r).await?
        }
        Scenario::StompStream {
            stream,
            count,
            size,
            window,
            readers,
            prefetch,
            from,
            no_append,
        } => {
            let p = stream::Params {
                stream,
                count,
                size,
                window,
                readers,
                prefetch,
                from,
                append: !no_append,
                login: stomp_client::Login {
                    host: "/".into(),
                    ..stomp_client::Login::default()
                },
            };
            stream::run(&target, &p).await?
        }
        Scenario::Amqp {
            client,
            count,
            size,
            window,
            credit,
            non_durable,
            durable_terminus,
            user,
            password,
            anonymous,
            prefix,
        } => {
            let sasl = match user {
                Some(user) => amqp_client::Sasl::Plain { user, password },
                None if anonymous => amqp_client::Sasl::Anonymous,
                None => amqp_client::Sasl::None,
            };
            let p = amqp::Params {
                client,
                count,
                size,
                window,
                credit,
                durable: !non_durable,
                durable_terminus,
                sasl,
                prefix,
            };
            amqp::run(&target, &p).await?
        }
    };
    let failed = report.error.is_some();
    report.print();
    if failed {
        std::process::exit(2);
    }
    Ok(())
}
