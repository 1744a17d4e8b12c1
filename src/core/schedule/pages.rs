//! The page files a queue's schedule writes the bodies of its scheduled
//! messages to past the memory budget.
//!
//! Unlike the backlog's page file, which is read back in the order it was
//! written and truncated when the queue has nothing paged, a schedule's
//! file is read back in due order, which is not the order of writing, so
//! it cannot be truncated while any message in it waits. The schedule
//! writes to one file (a *generation*) until it holds
//! [`SCHEDULE_PAGE_FILE_BYTES`], then starts the next; a generation is
//! deleted once its last message has been read back. A queue that always
//! has messages scheduled keeps on disk about what its longest delay
//! spans, never everything it ever scheduled. Like every page file these
//! are a cache: never synced, thrown away at restart (the journal rebuilds
//! the schedule).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rosetta_store::{PageError, PageFile, PageRef, QueueId, Storage};

use crate::codec::encode_message;
use crate::queue::Entry;

/// Bytes after which a schedule stops appending to a page file and starts
/// the next: the most disk a fully read-back file can hold on to while one
/// of its messages still waits.
pub(super) const SCHEDULE_PAGE_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// A generation number, naming one page file of a schedule.
pub(super) type Generation = u32;

/// Why a schedule's page file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub(super) enum SchedulePageError {
    #[error(transparent)]
    Page(#[from] PageError),
    /// A reference to a page file the schedule no longer has (a bug: a
    /// generation is deleted only when nothing in it waits).
    #[error("scheduled-messages page file {0} is gone")]
    Gone(Generation),
}

/// One page file and how many of its messages still wait.
#[derive(Debug)]
struct PageGeneration {
    file: PageFile,
    waiting: usize,
}

/// A schedule's page files.
#[derive(Debug, Default)]
pub(super) struct SchedulePages {
    files: BTreeMap<Generation, PageGeneration>,
    /// The generation appended to.
    active: Option<Generation>,
    next: Generation,
    /// A page file failed: this schedule keeps everything in memory from
    /// now on.
    pub(super) off: bool,
}

impl SchedulePages {
    /// Writes `entry`'s message to the active page file (starting one if
    /// none is active or it is full) and returns where.
    pub(super) fn append(
        &mut self,
        entry: &Entry,
        storage: &Arc<dyn Storage>,
        dir: &Path,
        queue: QueueId,
    ) -> Result<(Generation, PageRef), SchedulePageError> {
        let full = |g: &PageGeneration| g.file.len() >= SCHEDULE_PAGE_FILE_BYTES;
        let generation = match self
            .active
            .filter(|a| self.files.get(a).is_some_and(|g| !full(g)))
        {
            Some(active) => active,
            None => self.start_generation(storage, dir, queue)?,
        };
        let mut body = Vec::with_capacity(entry.message.memory_size());
        encode_message(&entry.message, &mut body);
        let page = self
            .files
            .get_mut(&generation)
            .ok_or(SchedulePageError::Gone(generation))?;
        let at = page.file.append(&body)?;
        page.waiting += 1;
        Ok((generation, at))
    }

    fn start_generation(
        &mut self,
        storage: &Arc<dyn Storage>,
        dir: &Path,
        queue: QueueId,
    ) -> Result<Generation, PageError> {
        let generation = self.next;
        let path = dir.join(format!("{queue}.scheduled.{generation}.page"));
        let file = PageFile::create(Arc::clone(storage), &path)?;
        if self.files.is_empty() {
            tracing::info!(
                queue,
                "scheduled messages are over the memory budget: paging them to disk"
            );
        }
        self.files
            .insert(generation, PageGeneration { file, waiting: 0 });
        self.active = Some(generation);
        self.next = self.next.wrapping_add(1);
        Ok(generation)
    }

    /// Reads back the records `refs` of `generation` (consecutive, in file
    /// order) with one read.
    pub(super) fn read(
        &mut self,
        generation: Generation,
        refs: &[PageRef],
    ) -> Result<Vec<Bytes>, SchedulePageError> {
        let page = self
            .files
            .get_mut(&generation)
            .ok_or(SchedulePageError::Gone(generation))?;
        Ok(page.file.read(refs)?)
    }

    /// One message of `generation` was read back (or dropped): the file
    /// goes once nothing in it waits (the active one is truncated instead,
    /// and appended to again).
    pub(super) fn forget(&mut self, generation: Generation, queue: QueueId) {
        let Some(page) = self.files.get_mut(&generation) else {
            return;
        };
        page.waiting = page.waiting.saturating_sub(1);
        if page.waiting > 0 {
            return;
        }
        if self.active == Some(generation) {
            if let Err(e) = page.file.clear() {
                tracing::warn!(queue, error = %e, "cannot truncate a scheduled-messages page file");
            }
        } else {
            // Dropping a page file deletes it.
            self.files.remove(&generation);
        }
    }

    /// Deletes every page file (the queue is deleted).
    pub(super) fn clear(&mut self) {
        self.files.clear();
        self.active = None;
    }
}
