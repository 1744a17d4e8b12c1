//! A queue's page file: where the messages of a queue that are over the
//! memory budget wait on disk until the queue needs them (paging).
//!
//! The file is a cache, not a record. The journal stays the only source of
//! truth (a durable message is in the journal before it is paged, and a
//! restart rebuilds every queue from the journal), so a page file is never
//! synced and is thrown away on restart. Each record carries a CRC32C of its
//! bytes so that a disk that returns the wrong bytes is caught, not
//! delivered.
//!
//! Writes are buffered and go to the OS in large chunks (no syscall per
//! message); a read of bytes still in the buffer flushes first. The file is
//! truncated when the queue has nothing paged any more, which is how its
//! space is reclaimed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::storage::{Storage, StorageFile};

/// Buffered bytes at which writes go to the file.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;
/// Bytes of CRC32C in front of each record.
const CRC_BYTES: u64 = 4;

/// Where one record is in a page file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRef {
    /// Offset of the record (its CRC) in the file.
    pub offset: u64,
    /// Bytes of the record body (without the CRC).
    pub len: u32,
}

impl PageRef {
    /// Offset just past this record.
    pub fn end(&self) -> u64 {
        self.offset + CRC_BYTES + u64::from(self.len)
    }
}

/// Why a page file operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// The file system failed.
    #[error("page file {path}: {op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A record read back does not match its checksum.
    #[error("page file {path}: record at {offset} is corrupt")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Offset of the record.
        offset: u64,
    },
    /// A record is larger than a page file record can be.
    #[error("a paged record of {0} bytes is too large")]
    TooLarge(usize),
}

/// One queue's page file. Removed from disk when dropped.
#[derive(Debug)]
pub struct PageFile {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    file: Box<dyn StorageFile>,
    /// Bytes already handed to the OS.
    flushed: u64,
    /// Bytes appended but not yet written.
    buffer: Vec<u8>,
}

impl PageFile {
    /// Creates (or truncates) the page file at `path`. Never synced, its
    /// directory neither: a cache needs no durability.
    pub fn create(storage: Arc<dyn Storage>, path: &Path) -> Result<Self, PageError> {
        let file = storage.create(path, true).map_err(|source| PageError::Io {
            op: "create",
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            storage,
            path: path.to_owned(),
            file,
            flushed: 0,
            buffer: Vec::new(),
        })
    }

    /// Bytes the file holds, buffered ones included.
    pub fn len(&self) -> u64 {
        self.flushed + self.buffer.len() as u64
    }

    /// True when nothing was appended since the last [`clear`](Self::clear).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends one record and returns where it is.
    pub fn append(&mut self, body: &[u8]) -> Result<PageRef, PageError> {
        let len = u32::try_from(body.len()).map_err(|_| PageError::TooLarge(body.len()))?;
        let at = PageRef {
            offset: self.len(),
            len,
        };
        self.buffer
            .extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
        self.buffer.extend_from_slice(body);
        if self.buffer.len() >= WRITE_BUFFER_BYTES {
            self.flush()?;
        }
        Ok(at)
    }

    /// Reads the records `refs` (consecutive, in file order) with one read,
    /// checks them, and returns their bodies.
    pub fn read(&mut self, refs: &[PageRef]) -> Result<Vec<bytes::Bytes>, PageError> {
        let (Some(first), Some(last)) = (refs.first(), refs.last()) else {
            return Ok(Vec::new());
        };
        if last.end() > self.flushed {
            self.flush()?;
        }
        let span = usize::try_from(last.end() - first.offset)
            .map_err(|_| PageError::TooLarge(usize::MAX))?;
        let mut raw = vec![0u8; span];
        self.file
            .read_at(&mut raw, first.offset)
            .map_err(|source| self.io("read", source))?;
        let raw = bytes::Bytes::from(raw);
        let mut bodies = Vec::with_capacity(refs.len());
        for r in refs {
            let start = usize::try_from(r.offset - first.offset)
                .map_err(|_| PageError::TooLarge(usize::MAX))?;
            let body_start = start + CRC_BYTES as usize;
            let body_end = body_start + r.len as usize;
            let (Some(crc), Some(body)) =
                (raw.get(start..body_start), raw.get(body_start..body_end))
            else {
                return Err(self.corrupt(r.offset));
            };
            let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
            if crc != crc32c::crc32c(body) {
                return Err(self.corrupt(r.offset));
            }
            bodies.push(raw.slice(body_start..body_end));
        }
        Ok(bodies)
    }

    /// Forgets every record and gives the space back.
    pub fn clear(&mut self) -> Result<(), PageError> {
        self.buffer.clear();
        self.flushed = 0;
        self.file
            .set_len(0)
            .map_err(|source| self.io("truncate", source))
    }

    fn flush(&mut self) -> Result<(), PageError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let written = self.file.write_at(&self.buffer, self.flushed);
        if let Err(source) = written {
            return Err(self.io("write", source));
        }
        self.flushed += self.buffer.len() as u64;
        self.buffer.clear();
        Ok(())
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> PageError {
        PageError::Io {
            op,
            path: self.path.clone(),
            source,
        }
    }

    fn corrupt(&self, offset: u64) -> PageError {
        PageError::Corrupt {
            path: self.path.clone(),
            offset,
        }
    }
}

impl Drop for PageFile {
    fn drop(&mut self) {
        // A cache: nothing in it is needed once its queue is gone.
        let _ = self.storage.remove(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::OsStorage;
    use std::os::unix::fs::FileExt;

    #[test]
    fn records_read_back_across_buffer_flushes_and_clear() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.page");
        let mut f = PageFile::create(Arc::new(OsStorage), &path).expect("create");
        let bodies: Vec<Vec<u8>> = (0..2000u32)
            .map(|i| vec![(i % 251) as u8; (i as usize * 37) % 3000])
            .collect();
        let refs: Vec<PageRef> = bodies
            .iter()
            .map(|b| f.append(b).expect("append"))
            .collect();
        // Some were flushed by the buffer limit, the tail is still buffered.
        assert!(f.flushed > 0 && !f.buffer.is_empty());
        let got = f.read(&refs[..1000]).expect("read head");
        assert!(got.iter().zip(&bodies).all(|(g, b)| g[..] == b[..]));
        let got = f.read(&refs[1990..]).expect("read buffered tail");
        assert!(got.iter().zip(&bodies[1990..]).all(|(g, b)| g[..] == b[..]));
        f.clear().expect("clear");
        assert!(f.is_empty());
        assert_eq!(std::fs::metadata(&path).expect("file").len(), 0);
        let r = f.append(b"again").expect("append after clear");
        assert_eq!(r.offset, 0);
        assert_eq!(f.read(&[r]).expect("read")[0], &b"again"[..]);
        drop(f);
        assert!(!path.exists(), "a dropped page file is removed");
    }

    #[test]
    fn a_flipped_byte_is_reported_not_returned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.page");
        let mut f = PageFile::create(Arc::new(OsStorage), &path).expect("create");
        let r = f.append(b"payload").expect("append");
        f.flush().expect("flush");
        let other = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        other.write_all_at(b"X", r.offset + 6).expect("flip");
        assert!(matches!(
            f.read(&[r]),
            Err(PageError::Corrupt { offset: 0, .. })
        ));
    }
}
