//! The admin HTTP API.
