//! Membership (placeholder).
