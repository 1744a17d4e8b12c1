//! A minimal etcd v3 client (placeholder).
