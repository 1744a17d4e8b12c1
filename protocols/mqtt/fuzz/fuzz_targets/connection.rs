//! Arbitrary bytes, timeouts and core events into `MqttConnection`, against
//! the in-memory fake core of the state-machine tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;
#[path = "../../tests/state_machine/fake.rs"]
#[allow(dead_code)]
mod fake;

fuzz_target!(|data: &[u8]| {
    common::run_connection(data);
});
