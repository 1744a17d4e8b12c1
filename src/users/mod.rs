//! Users.
