//! TOML text into `Config::parse` (syntax, types, unknown keys, the
//! cross-key checks, and the error locator that names file, line and key).
//! Oracles: no panic; every accepted configuration passes
//! `Config::validate` and answers the questions the server asks of it
//! (listeners, users file); every refusal names the origin, and its line,
//! when it has one, is a line of the text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rosetta_config::Config;

const ORIGIN: &str = "fuzz.toml";

fuzz_target!(|data: &[u8]| {
    // Lossy rather than skipping non-UTF-8 input: every execution parses.
    let text = String::from_utf8_lossy(data);
    match Config::parse(&text, ORIGIN) {
        Ok(config) => {
            if let Err(e) = config.validate() {
                panic!("parse accepted a configuration that validate refuses: {e}");
            }
            let _ = config.active_listeners();
            let _ = config.users_file();
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.starts_with(ORIGIN),
                "error without its origin: {message}"
            );
            if let Some(line) = e.line() {
                // A position at the very end may sit on the line after the last newline.
                let lines = text.lines().count() + 1;
                assert!(
                    (1..=lines).contains(&line),
                    "error on line {line} of a {lines}-line text: {message}"
                );
            }
        }
    }
});
