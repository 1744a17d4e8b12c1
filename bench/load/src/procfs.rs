//! Broker resource use read from `/proc/<pid>`: CPU time (`stat`, utime +
//! stime) and resident memory (`status`, VmRSS). The load generator shares
//! the machine's cores with the broker, so wall-clock throughput alone would
//! mix the two; CPU per message is the broker's own cost.

use std::path::PathBuf;

/// Why a `/proc` reading failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProcError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: unexpected format: {what}")]
    Format { path: PathBuf, what: &'static str },
}

/// utime + stime in clock ticks from the text of `/proc/<pid>/stat`.
///
/// The command name (field 2) is in parentheses and may itself contain
/// spaces and parentheses, so fields are counted after the *last* `)`.
/// utime and stime are fields 14 and 15 (1-based), i.e. the 12th and 13th
/// after the name.
pub(crate) fn parse_stat_ticks(text: &str) -> Option<u64> {
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_ascii_whitespace();
    // fields after ')' start at field 3 (state); utime is field 14.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS in bytes from the text of `/proc/<pid>/status` (`VmRSS:  1234 kB`).
pub(crate) fn parse_status_rss_bytes(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_ascii_whitespace();
    let kib: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => Some(kib * 1024),
        _ => None,
    }
}

/// Clock ticks per second (`getconf CLK_TCK`), the unit of utime/stime.
/// `libc::sysconf` would need `unsafe`, which the workspace forbids; the
/// fallback is the Linux default of 100.
fn clock_ticks_per_s() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t: &u64| t > 0)
        .unwrap_or(100)
}

/// A broker process observed through `/proc`.
#[derive(Debug, Clone)]
pub(crate) struct Broker {
    pid: u32,
    ticks_per_s: u64,
}

impl Broker {
    pub(crate) fn new(pid: u32) -> Self {
        Self {
            pid,
            ticks_per_s: clock_ticks_per_s(),
        }
    }

    fn read(&self, file: &str) -> Result<(PathBuf, String), ProcError> {
        let path = PathBuf::from(format!("/proc/{}/{file}", self.pid));
        let text = std::fs::read_to_string(&path).map_err(|source| ProcError::Io {
            path: path.clone(),
            source,
        })?;
        Ok((path, text))
    }

    /// CPU time (user + system) the broker has used so far, in microseconds.
    pub(crate) fn cpu_us(&self) -> Result<u64, ProcError> {
        let (path, text) = self.read("stat")?;
        let ticks = parse_stat_ticks(&text).ok_or(ProcError::Format {
            path,
            what: "utime/stime",
        })?;
        Ok(ticks * 1_000_000 / self.ticks_per_s)
    }

    /// Resident set size in bytes.
    pub(crate) fn rss_bytes(&self) -> Result<u64, ProcError> {
        let (path, text) = self.read("status")?;
        parse_status_rss_bytes(&text).ok_or(ProcError::Format {
            path,
            what: "VmRSS",
        })
    }
}

/// CPU time this load generator has used, in µs (`None` if `/proc` is
/// unreadable): shows how much of the two cores the clients took.
pub(crate) fn self_cpu_us() -> Option<u64> {
    Broker::new(std::process::id()).cpu_us().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces_and_parens() {
        // Real layout: pid (comm) state ppid pgrp session tty tpgid flags
        // minflt cminflt majflt cmajflt utime stime ...
        let text =
            "4242 (beam (smp) x) S 1 4242 4242 0 -1 4194560 900 0 3 0 1234 567 0 0 20 0 30 0";
        assert_eq!(parse_stat_ticks(text), Some(1234 + 567));
    }

    #[test]
    fn stat_truncated_is_none() {
        assert_eq!(parse_stat_ticks("1 (x) S 1 2 3"), None);
        assert_eq!(parse_stat_ticks("no parens at all"), None);
    }

    #[test]
    fn rss_from_status() {
        let text = "Name:\tmosquitto\nVmPeak:\t  9000 kB\nVmRSS:\t    5120 kB\nThreads:\t1\n";
        assert_eq!(parse_status_rss_bytes(text), Some(5120 * 1024));
        assert_eq!(parse_status_rss_bytes("VmRSS:\t12 MB\n"), None);
        assert_eq!(parse_status_rss_bytes("Name:\tx\n"), None);
    }

    #[test]
    fn own_process_is_readable() {
        let me = Broker::new(std::process::id());
        assert!(me.rss_bytes().expect("own VmRSS") > 0);
        me.cpu_us().expect("own cpu");
    }
}
