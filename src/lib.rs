//! Rosetta
