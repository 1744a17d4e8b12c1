//! What recovery found: the [`RecoveryReport`] that [`super::Store::open`]
//! returns and logs, and that `rosetta store check` prints.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::manifest::ManifestState;
use super::record::{MessageSeq, QueueId};
use super::segment::{Damage, SegmentId};

/// A range of a segment that held no valid entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedRange {
    /// The segment file.
    pub path: PathBuf,
    /// Its id.
    pub segment: SegmentId,
    /// Where the damage starts.
    pub offset: u64,
    /// Where the next valid entry starts (or the file ended).
    pub end: u64,
    /// What was wrong at `offset`.
    pub damage: Damage,
    /// The file was cut at `offset`: a torn tail of the newest segment (a
    /// crash during a write). Otherwise the range was skipped and left in
    /// place.
    pub cut: bool,
    /// The whole file was removed (shorter than a segment header).
    pub segment_removed: bool,
    /// The entry seqs it held, `[from, to)`; `to` unknown when nothing
    /// after the damage says. `None` for a torn tail (what a crash tears
    /// was never acknowledged under the default sync policy) and for a
    /// damaged segment header (the entries were kept).
    pub lost_entries: Option<(u64, Option<u64>)>,
    /// Where the bytes were copied for inspection.
    pub saved_to: Option<PathBuf>,
    /// What a damaged entry whose header was intact probably held
    /// (decoded without a valid checksum).
    pub suspect: Option<SuspectRecords>,
}

/// The records a damaged entry probably held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuspectRecords {
    /// Records decoded.
    pub records: usize,
    /// Its messages: (seq, queues).
    pub messages: Vec<(MessageSeq, Vec<QueueId>)>,
}

/// A segment that is missing, or shorter than it was when sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingSegment {
    /// The segment file.
    pub path: PathBuf,
    /// Its id.
    pub segment: SegmentId,
    /// The file is there, but shorter than it was (else it is missing).
    pub present: bool,
    /// Bytes found, when measured.
    pub found_bytes: Option<u64>,
    /// Bytes it had when sealed, when known.
    pub expected_bytes: Option<u64>,
    /// The entry seqs lost, `[from, to)`; `to` unknown for a segment that
    /// was still being written.
    pub lost_entries: Option<(u64, Option<u64>)>,
}

/// Everything recovery knows was lost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LostSummary {
    /// Entries lost (appends: a message, a transaction, acknowledgements),
    /// counted over the ranges whose end is known.
    pub entries: u64,
    /// Some range's end is not known: more entries may be lost.
    pub entries_unbounded: bool,
    /// The entry seq ranges lost, `[from, to)`.
    pub entry_ranges: Vec<(u64, Option<u64>)>,
    /// Bytes of damaged or missing journal.
    pub bytes: u64,
    /// Queues that lost messages, as far as can be known (damaged entries
    /// that still decode, delivery states of messages whose record is
    /// gone).
    pub queues: Vec<QueueId>,
    /// Messages lost, as far as known (at most 64 listed).
    pub messages: Vec<MessageSeq>,
}

/// What recovery did.
#[derive(Debug, Clone)]
pub struct RecoveryReport {
    /// Segments replayed.
    pub segments_read: u64,
    /// Entries (append units) replayed.
    pub entries_replayed: u64,
    /// Records replayed.
    pub records_replayed: u64,
    /// Bytes of verified entries.
    pub bytes_replayed: u64,
    /// Damaged ranges, in file order: torn tails cut, damage skipped,
    /// segment headers re-derived.
    pub damaged: Vec<DamagedRange>,
    /// Segments missing or cut short.
    pub missing: Vec<MissingSegment>,
    /// Segments compaction had retired before a crash, removed unread.
    pub retired_removed: Vec<PathBuf>,
    /// What was found of the manifest.
    pub manifest: ManifestState,
    /// What was lost, added up.
    pub lost: LostSummary,
    /// Bytes cut off torn tails.
    pub truncated_bytes: u64,
    /// Missing segments were accepted ([`super::StoreConfig::accept_data_loss`]).
    pub loss_accepted: bool,
    /// Queue names by id, for the report (filled in by `open`/`check`).
    pub queue_names: Vec<(QueueId, String)>,
    /// How long replay took.
    pub duration: Duration,
}

impl Default for RecoveryReport {
    fn default() -> Self {
        Self {
            segments_read: 0,
            entries_replayed: 0,
            records_replayed: 0,
            bytes_replayed: 0,
            damaged: Vec::new(),
            missing: Vec::new(),
            retired_removed: Vec::new(),
            manifest: ManifestState::Absent,
            lost: LostSummary::default(),
            truncated_bytes: 0,
            loss_accepted: false,
            queue_names: Vec::new(),
            duration: Duration::ZERO,
        }
    }
}

fn range(r: &(u64, Option<u64>)) -> String {
    match r.1 {
        Some(to) => format!("{}..{}", r.0, to),
        None => format!("{}..(unknown)", r.0),
    }
}

impl RecoveryReport {
    /// True when nothing was wrong (a torn tail alone counts as clean: it
    /// held nothing acknowledged).
    pub fn is_clean(&self) -> bool {
        self.damaged.iter().all(|d| d.cut)
            && self.missing.is_empty()
            && self.manifest != ManifestState::Lost
    }

    /// The name of queue `id`, or its id.
    fn queue(&self, id: QueueId) -> String {
        match self.queue_names.iter().find(|(q, _)| *q == id) {
            Some((_, name)) => format!("{name} (id {id})"),
            None => format!("id {id}"),
        }
    }

    /// What is missing, in words (the [`super::StoreError::Incomplete`]
    /// message).
    pub fn loss_text(&self) -> String {
        let mut parts: Vec<String> = self
            .missing
            .iter()
            .map(|m| {
                let what = match (m.present, m.found_bytes, m.expected_bytes) {
                    (false, _, _) => "missing".to_owned(),
                    (true, Some(found), Some(exp)) => format!("cut short ({found} of {exp} bytes)"),
                    (true, Some(found), None) => format!("cut short ({found} bytes)"),
                    (true, None, _) => "cut short".to_owned(),
                };
                let entries = m
                    .lost_entries
                    .map(|r| format!(", entries {} lost", range(&r)))
                    .unwrap_or_default();
                let size = match (m.present, m.expected_bytes) {
                    (false, Some(e)) => format!(", {e} bytes"),
                    _ => String::new(),
                };
                format!("segment {} is {what}{entries}{size}", m.path.display())
            })
            .collect();
        if self.manifest == ManifestState::Lost {
            parts.push(
                "both manifest copies are missing or damaged, so missing segments cannot be ruled out"
                    .into(),
            );
        }
        format!(
            "{}; to start anyway and accept the loss, set [store] accept_data_loss = true",
            parts.join("; ")
        )
    }
}

impl fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} segments, {} entries, {} records, {} bytes replayed",
            self.segments_read, self.entries_replayed, self.records_replayed, self.bytes_replayed
        )?;
        match &self.manifest {
            ManifestState::Absent => writeln!(
                f,
                "manifest: none (a new journal, or one from before manifests)"
            )?,
            ManifestState::Read {
                generation,
                other_copy_bad,
            } => writeln!(
                f,
                "manifest: generation {generation}{}",
                if *other_copy_bad {
                    " (the other copy is torn or damaged)"
                } else {
                    ""
                }
            )?,
            ManifestState::Lost => writeln!(f, "manifest: LOST (both copies missing or damaged)")?,
        }
        for d in &self.damaged {
            let what = if d.cut {
                if d.segment_removed {
                    "torn segment removed"
                } else {
                    "torn tail cut"
                }
            } else if d.damage == Damage::BadSegmentHeader {
                "segment header damaged, re-derived, entries kept"
            } else {
                "damaged, skipped"
            };
            write!(
                f,
                "{}: bytes {}..{} {what} ({:?})",
                d.path.display(),
                d.offset,
                d.end,
                d.damage
            )?;
            if let Some(r) = &d.lost_entries {
                write!(f, "; entries {} lost", range(r))?;
            }
            if let Some(s) = &d.suspect {
                let msgs: Vec<String> = s
                    .messages
                    .iter()
                    .map(|(seq, qs)| {
                        let qs: Vec<String> = qs.iter().map(|q| self.queue(*q)).collect();
                        format!("message {seq} for {}", qs.join(", "))
                    })
                    .collect();
                write!(f, "; probably held {} records", s.records)?;
                if !msgs.is_empty() {
                    write!(f, " ({})", msgs.join("; "))?;
                }
            }
            if let Some(p) = &d.saved_to {
                write!(f, "; saved to {}", p.display())?;
            }
            writeln!(f)?;
        }
        for m in &self.missing {
            write!(f, "{}: ", m.path.display())?;
            match (m.present, m.found_bytes, m.expected_bytes) {
                (false, _, Some(e)) => write!(f, "MISSING ({e} bytes)")?,
                (false, _, None) => write!(f, "MISSING")?,
                (true, Some(found), Some(e)) => write!(f, "CUT SHORT ({found} of {e} bytes)")?,
                (true, Some(found), None) => write!(f, "CUT SHORT ({found} bytes)")?,
                (true, None, _) => write!(f, "CUT SHORT")?,
            }
            if let Some(r) = &m.lost_entries {
                write!(f, "; entries {} lost", range(r))?;
            }
            if self.loss_accepted {
                write!(f, "; loss accepted")?;
            }
            writeln!(f)?;
        }
        for p in &self.retired_removed {
            writeln!(
                f,
                "{}: retired by compaction before a crash; removed",
                p.display()
            )?;
        }
        let lost = &self.lost;
        if lost.entries > 0 || lost.entries_unbounded || !lost.queues.is_empty() {
            let ranges: Vec<String> = lost.entry_ranges.iter().map(range).collect();
            write!(
                f,
                "lost: {}{} entries ({}), {} bytes",
                lost.entries,
                if lost.entries_unbounded { "+" } else { "" },
                ranges.join(", "),
                lost.bytes
            )?;
            if !lost.queues.is_empty() {
                let qs: Vec<String> = lost.queues.iter().map(|q| self.queue(*q)).collect();
                write!(f, "; queues that lost messages: {}", qs.join(", "))?;
            }
            if !lost.messages.is_empty() {
                write!(f, "; messages: {:?}", lost.messages)?;
            }
            writeln!(f)?;
        }
        if self.is_clean() {
            writeln!(f, "clean")?;
        }
        Ok(())
    }
}
