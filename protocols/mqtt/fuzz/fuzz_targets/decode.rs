//! Arbitrary bytes into the MQTT decoder (after an optional valid CONNECT,
//! so post-CONNECT packets of both versions are reached).
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;
#[path = "../../tests/state_machine/fake.rs"]
#[allow(dead_code)]
mod fake;

fuzz_target!(|data: &[u8]| common::run_decoder(data));
