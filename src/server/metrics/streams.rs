//! Stream series: each open log's offsets, size and readers (label
//! `stream`), and each consumer group's committed offset and lag (labels
//! `stream`, `group`). A log not used since the start is not opened for a
//! scrape, so it is absent until first used (the admin API's
//! `/api/v1/streams` opens the logs on its page).

use rosetta_core::{Core, StreamGroupStats, StreamStats};

use super::{escape_label, render_series, Series};

const STREAM_METRICS: &[Series<StreamStats>] = &[
    Series {
        name: "rosetta_stream_messages",
        kind: "gauge",
        help: "Records kept in the stream log (next offset minus first offset).",
        value: |s| s.messages as f64,
    },
    Series {
        name: "rosetta_stream_bytes",
        kind: "gauge",
        help: "Bytes of the stream log's segment files.",
        value: |s| s.bytes as f64,
    },
    Series {
        name: "rosetta_stream_segments",
        kind: "gauge",
        help: "Segment files of the stream log.",
        value: |s| s.segments as f64,
    },
    Series {
        name: "rosetta_stream_first_offset",
        kind: "gauge",
        help: "The oldest offset the stream log keeps.",
        value: |s| s.first_offset as f64,
    },
    Series {
        name: "rosetta_stream_next_offset",
        kind: "gauge",
        help: "The offset the stream log's next append gets.",
        value: |s| s.next_offset as f64,
    },
    Series {
        name: "rosetta_stream_readers",
        kind: "gauge",
        help: "Readers attached to the stream log.",
        value: |s| s.readers as f64,
    },
];

const GROUP_METRICS: &[Series<StreamGroupStats>] = &[
    Series {
        name: "rosetta_stream_group_committed_offset",
        kind: "gauge",
        help: "The consumer group's committed offset: its next reader starts there.",
        value: |g| g.committed_offset as f64,
    },
    Series {
        name: "rosetta_stream_group_lag",
        kind: "gauge",
        help: "Records the consumer group has not committed that the log still holds.",
        value: |g| g.lag as f64,
    },
];

pub(super) fn render(out: &mut String, core: &Core) {
    let logs = core.open_stream_stats();
    if logs.is_empty() {
        return;
    }
    let by_log: Vec<(String, &StreamStats)> = logs
        .iter()
        .map(|s| (format!("stream=\"{}\"", escape_label(&s.name)), s))
        .collect();
    render_series(out, STREAM_METRICS, &by_log);
    let by_group: Vec<(String, &StreamGroupStats)> = logs
        .iter()
        .flat_map(|s| {
            s.groups.iter().map(|g| {
                let labels = format!(
                    "stream=\"{}\",group=\"{}\"",
                    escape_label(&s.name),
                    escape_label(&g.name)
                );
                (labels, g)
            })
        })
        .collect();
    if !by_group.is_empty() {
        render_series(out, GROUP_METRICS, &by_group);
    }
}
