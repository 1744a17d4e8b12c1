//! Health checks (placeholder).
