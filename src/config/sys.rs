//! `[sys]`: the `$SYS/broker/...` topics the broker publishes for MQTT
//! clients, as Mosquitto does (issue 18).

use serde::Deserialize;

/// Seconds between refreshes by default: Mosquitto's `sys_interval`.
pub const SYS_INTERVAL_S_DEFAULT: u64 = 10;
/// Longest refresh interval accepted: a day.
pub const SYS_INTERVAL_S_MAX: u64 = 86_400;

/// `[sys]`: how often the `$SYS` topics are refreshed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SysConfig {
    /// Seconds between refreshes of the retained `$SYS/broker/...`
    /// messages; 0 publishes none.
    pub interval_s: u64,
}

impl Default for SysConfig {
    fn default() -> Self {
        Self {
            interval_s: SYS_INTERVAL_S_DEFAULT,
        }
    }
}

impl SysConfig {
    /// The refresh interval, or `None` when the topics are off.
    pub fn interval(&self) -> Option<std::time::Duration> {
        (self.interval_s > 0).then(|| std::time::Duration::from_secs(self.interval_s))
    }
}
