//! The balancer's word on an Open ([`Broker::place_connection`]), asked
//! with the client's container id and SASL user before the core session
//! opens. A client that belongs elsewhere is sent our Open and then a Close
//! with `amqp:connection:redirect`, whose info names `network-host`,
//! `port` and `hostname` (AMQP 1.0 §2.8.17: a client such as
//! python-qpid-proton reconnects there). With no node ready, the Close is
//! `amqp:resource-limit-exceeded`.

use fe2o3_amqp_types::definitions::{AmqpError as Cond, ConnectionError, Error, ErrorCondition};
use fe2o3_amqp_types::performatives::{Close, Open};
use fe2o3_amqp_types::primitives::{OrderedMap, Symbol, Value};
use rosetta_neutral::{Broker, Placement, PlacementRequest, Principal, Protocol};
use tracing::debug;

use super::{AmqpConnection, State};
use crate::frame::write_perf;

impl AmqpConnection {
    /// The error to close with instead of opening, if the balancer says
    /// the client does not belong here.
    pub(super) fn placement_error(
        &self,
        broker: &dyn Broker,
        principal: &Principal,
        open: &Open,
    ) -> Option<Error> {
        let request = PlacementRequest {
            protocol: Protocol::Amqp,
            client_id: Some(open.container_id.as_str()),
            user: principal.user.as_deref(),
        };
        match broker.place_connection(&request) {
            Placement::Local => None,
            Placement::Redirect(target) => {
                let mut info = OrderedMap::new();
                info.insert(
                    Symbol::from("network-host"),
                    Value::String(target.host.clone()),
                );
                info.insert(Symbol::from("port"), Value::Uint(u32::from(target.port)));
                // The virtual host to ask for there: the one asked for here.
                let hostname = open.hostname.clone().unwrap_or_else(|| target.host.clone());
                info.insert(Symbol::from("hostname"), Value::String(hostname));
                Some(Error {
                    condition: ErrorCondition::ConnectionError(ConnectionError::Redirect),
                    description: Some(format!("this client belongs on {}", target.authority())),
                    info: Some(Box::new(info)),
                })
            }
            Placement::Unavailable => Some(Error {
                condition: Cond::ResourceLimitExceeded.into(),
                description: Some("no broker of the cluster is ready to take this client".into()),
                info: None,
            }),
        }
    }

    /// Answers the client's Open with ours and a Close with `error`
    /// (AMQP 1.0 §2.4.3: a Close follows an Open), and closes.
    pub(super) fn refuse_open(&mut self, error: Error) {
        debug!(conn = self.conn_id, condition = ?error.condition, description = ?error.description, "open refused by the balancer");
        let open = self.refusal_open();
        write_perf(&mut self.out, 0, &open, &[]);
        write_perf(&mut self.out, 0, &Close { error: Some(error) }, &[]);
        self.state = State::Closed;
    }
}
