// The helpers are `pub` because fake.rs is also compiled into the fuzz
// target, where it is a public module; inside this test binary nothing is
// reachable from outside anyway.
#![allow(unreachable_pub)]

//! State-machine tests of `MqttConnection`, both versions, driven with a
//! virtual clock against an in-memory fake core.

mod auth;
mod bad_input;
mod codec_props;
mod connect;
mod deliver;
mod fake;
#[path = "../../fuzz/fuzz_targets/common.rs"]
mod fuzz_common;
mod fuzz_smoke;
mod harness;
mod login_wait;
mod placement;
mod problem_info;
mod publish;
mod resume;
mod subscribe;
