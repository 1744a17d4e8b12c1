//! Scale-out, first slice: several independent Rosetta nodes, each owning
//! the sessions and queues of the clients steered to it.
//!
//! Two halves with one job each:
//!
//! - [`balancer`]: sans-IO. From what a connection says about itself
//!   ([`ConnectionFacts`]) it derives a target key, and from a pool of
//!   targets and a policy it decides where the connection belongs
//!   ([`Decision`]): here, another node's address, or nowhere (no quorum).
//!   Time is passed in; tests drive it without sockets.
//! - [`etcd`] and [`membership`]: the IO. A node registers itself in etcd
//!   under a lease it keeps alive, publishes its client-facing addresses
//!   and connection count, and keeps the balancer's pool equal to what it
//!   sees under the prefix; [`health`] connects to every remote target
//!   periodically and marks it ready or not. [`balancers`] is a node's
//!   set of balancers (one per listener group) fed as one pool;
//!   [`shared_cache`] shares their choices through etcd
//!   (`cache_in_etcd`).
//!
//! The server asks through [`rosetta_neutral::Broker::place_connection`];
//! without `[cluster]` none of this runs. See `docs/cluster.md`.

pub mod balancer;
pub mod balancers;
pub mod etcd;
pub mod health;
pub mod membership;
pub mod proxy_header;
pub mod shared_cache;
/// For tests (this crate's and the broker's): a throwaway etcd.
#[doc(hidden)]
pub mod testing;

pub use balancer::{
    Balancer, BalancerSettings, ConnectionFacts, Decision, KeySource, Placed, Policy,
    SettingsError, Target,
};
pub use balancers::Balancers;
pub use membership::{Membership, MembershipSettings, NodeRecord};
