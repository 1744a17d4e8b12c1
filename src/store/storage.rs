//! Every file operation of the store, behind one trait.
//!
//! The journal (segments, manifest, side files of cut damage, the `LOCK`
//! file) and the page files reach the disk only through [`Storage`] and
//! the [`StorageFile`]s it opens. [`OsStorage`] is the real file system;
//! [`super::sim::SimDisk`] is an in-memory disk that loses unsynced data
//! on a simulated power loss and fails or corrupts operations on request,
//! so that tests can check what the store promises against what a disk
//! can do.
//!
//! # The durability contract the store relies on
//!
//! - [`StorageFile::write_at`] is not durable until
//!   [`StorageFile::sync_data`] returns `Ok` (`fdatasync`: data and the
//!   file length, not the timestamps).
//! - A file created or removed ([`Storage::create`], [`Storage::remove`])
//!   is not durable until [`Storage::sync_dir`] of its directory returns.
//! - After a failed `sync_data` nothing unsynced is known to be on disk,
//!   and a later successful sync does not make it so (Linux may have
//!   dropped the dirty pages): the store fails closed instead of retrying.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The file system as the store uses it. `Send + Sync`: the writer thread,
/// recovery and the readers share one.
pub trait Storage: Send + Sync + Debug + 'static {
    /// Creates `dir` and its missing parents. Each directory created is
    /// synced, and so is its parent, so that the creation is durable.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Creates `path`: a new empty file, or an existing one truncated to
    /// zero when `truncate` (else `AlreadyExists`). Durable once its
    /// directory is synced.
    fn create(&self, path: &Path, truncate: bool) -> io::Result<Box<dyn StorageFile>>;
    /// Removes a file. Durable once its directory is synced.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the creations and removals in `dir` durable (`fsync` of the
    /// directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Names of the files in `dir` (not sorted).
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Takes an exclusive lock on `path` (created if missing), held until
    /// the returned guard is dropped; `Ok(None)` when someone else holds
    /// it. A crash of the holder releases it.
    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>>;
    /// A random number: the salt of a new journal (see `segment`). Here so
    /// that a simulated disk can draw it from its seed.
    fn random_u32(&self) -> u32;
    /// Bytes free for this process on the filesystem holding `dir` (what
    /// the disk limit of producer flow control watches).
    fn free_bytes(&self, dir: &Path) -> io::Result<u64>;
}

/// An open file.
pub trait StorageFile: Send + Sync + Debug {
    /// Fills `buf` from `offset`; `UnexpectedEof` if the file ends first.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Appends `len` bytes read from `offset` to `buf` (`UnexpectedEof` if
    /// the file ends first): into its spare capacity where the file can,
    /// so a large read is not first zeroed to be overwritten.
    fn read_at_into(&self, buf: &mut Vec<u8>, len: usize, offset: u64) -> io::Result<()> {
        let start = buf.len();
        buf.resize(start + len, 0);
        self.read_at(&mut buf[start..], offset)
    }
    /// Writes all of `buf` at `offset` (not durable until
    /// [`sync_data`](Self::sync_data)).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: everything written before is durable once this
    /// returns `Ok`.
    fn sync_data(&self) -> io::Result<()>;
    /// Truncates or extends the file (durable after `sync_data`).
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Current length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Whether a read of `len` bytes at `offset` would be served from
    /// memory (the page cache) rather than wait for the device, as far
    /// as a cheap probe can tell; `true` where it cannot tell. A reader
    /// on an async worker reads only what this says is cached and leaves
    /// the rest to a thread that may block.
    fn is_cached(&self, offset: u64, len: usize) -> bool {
        let _ = (offset, len);
        true
    }
}

/// A held lock; dropping it releases the lock.
pub trait LockGuard: Send + Sync + Debug {}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsStorage;

#[derive(Debug)]
struct OsFile(File);

#[derive(Debug)]
struct OsLock(#[allow(dead_code)] File);

impl LockGuard for OsLock {}

impl StorageFile for OsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }

    fn read_at_into(&self, buf: &mut Vec<u8>, len: usize, offset: u64) -> io::Result<()> {
        let end = buf.len() + len;
        buf.reserve(len);
        let mut at = offset;
        while buf.len() < end {
            // Reads into the spare capacity (which may pass `end`: what is
            // read beyond it is cut off below).
            match rustix::io::pread(&self.0, rustix::buffer::spare_capacity(buf), at) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => at += n as u64,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        buf.truncate(end);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    /// One byte read with `RWF_NOWAIT` at each end of the range: it fails
    /// with `EAGAIN` when its page is not in the page cache. The pages
    /// between are assumed to follow (a sequential reader's pages come
    /// in and go out of the cache in order); a kernel or file system
    /// without `RWF_NOWAIT` reads as if cached, as before the probe.
    fn is_cached(&self, offset: u64, len: usize) -> bool {
        let last = offset + len.saturating_sub(1) as u64;
        [offset, last].iter().all(|&at| {
            let mut byte = [0u8; 1];
            let mut bufs = [io::IoSliceMut::new(&mut byte)];
            !matches!(
                rustix::io::preadv2(&self.0, &mut bufs, at, rustix::io::ReadWriteFlags::NOWAIT),
                Err(rustix::io::Errno::AGAIN)
            )
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

impl Storage for OsStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        create_dirs_durably(
            dir,
            &|d| d.is_dir(),
            &|d| match std::fs::create_dir(d) {
                Ok(()) => Ok(true),
                // Created meanwhile by someone else: theirs to sync.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => Ok(false),
                Err(e) => Err(e),
            },
            &|d| self.sync_dir(d),
        )
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Box::new(OsFile(f)))
    }

    fn create(&self, path: &Path, truncate: bool) -> io::Result<Box<dyn StorageFile>> {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        if truncate {
            o.create(true).truncate(true);
        } else {
            o.create_new(true);
        }
        Ok(Box::new(OsFile(o.open(path)?)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn random_u32(&self) -> u32 {
        rand::random()
    }

    fn free_bytes(&self, dir: &Path) -> io::Result<u64> {
        // Available to an unprivileged user (f_bavail), not f_bfree: the
        // reserved blocks are not ours to fill.
        let s = rustix::fs::statvfs(dir)?;
        Ok(s.f_bavail.saturating_mul(s.f_frsize))
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Box::new(OsLock(file)))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

/// Creates `dir` and its missing parents, outermost first; after creating
/// a directory it syncs that directory and then its parent, so that the
/// new entry survives a power loss (a directory made by `mkdir` alone is
/// not durable until its parent is synced).
fn create_dirs_durably(
    dir: &Path,
    exists: &dyn Fn(&Path) -> bool,
    mkdir: &dyn Fn(&Path) -> io::Result<bool>,
    sync: &dyn Fn(&Path) -> io::Result<()>,
) -> io::Result<()> {
    if exists(dir) {
        return Ok(());
    }
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if parent != Path::new(".") {
        create_dirs_durably(parent, exists, mkdir, sync)?;
    }
    if mkdir(dir)? {
        sync(dir)?;
        sync(parent)?;
    }
    Ok(())
}

/// Reads `len` bytes at `offset`, or fewer when the file ends first.
pub(crate) fn read_up_to(file: &dyn StorageFile, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let file_len = file.size()?;
    let n = usize::try_from(file_len.saturating_sub(offset))
        .unwrap_or(usize::MAX)
        .min(len);
    let mut buf = vec![0u8; n];
    file.read_at(&mut buf, offset)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn each_directory_created_is_synced_and_then_its_parent() {
        let existing = std::cell::RefCell::new(vec![PathBuf::from("/data")]);
        let synced = std::cell::RefCell::new(Vec::new());
        let r = create_dirs_durably(
            Path::new("/data/a/b"),
            &|d| existing.borrow().iter().any(|e| e == d),
            &|d| {
                existing.borrow_mut().push(d.to_path_buf());
                Ok(true)
            },
            &|d| {
                synced.borrow_mut().push(d.to_path_buf());
                Ok(())
            },
        );
        assert!(r.is_ok());
        let want: Vec<PathBuf> = ["/data/a", "/data", "/data/a/b", "/data/a"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(*synced.borrow(), want);
        // Nothing to create, nothing to sync.
        synced.borrow_mut().clear();
        assert!(create_dirs_durably(
            Path::new("/data/a/b"),
            &|d| existing.borrow().iter().any(|e| e == d),
            &|_| Ok(true),
            &|d| {
                synced.borrow_mut().push(d.to_path_buf());
                Ok(())
            }
        )
        .is_ok());
        assert!(synced.borrow().is_empty());
    }

    /// The page-cache probe says a file just written is cached, and one
    /// whose pages were dropped from the cache is not (where the file
    /// system drops them: tmpfs keeps its pages, as it must).
    #[test]
    fn os_files_tell_whether_the_page_cache_holds_a_range() {
        let d = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        let path = d.path().join("f");
        let f = match OsStorage.create(&path, false) {
            Ok(f) => f,
            Err(e) => panic!("{e}"),
        };
        let len = 1 << 20;
        assert!(f.write_at(&vec![7u8; len], 0).is_ok());
        assert!(f.sync_data().is_ok());
        assert!(f.is_cached(0, len), "just written");
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) => panic!("{e}"),
        };
        let dropped = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).is_ok();
        let tmpfs = rustix::fs::fstatfs(&file)
            .map(|s| s.f_type == 0x0102_1994)
            .unwrap_or(true);
        if dropped && !tmpfs {
            assert!(!f.is_cached(0, len), "dropped from the page cache");
            assert!(!f.is_cached(len as u64 - 4096, 4096));
        }
        // A read still reads it, from the device.
        let mut back = Vec::new();
        assert!(f.read_at_into(&mut back, len, 0).is_ok());
        assert_eq!(back, vec![7u8; len]);
        assert!(f.is_cached(0, len), "read back in");
    }

    #[test]
    fn os_storage_round_trips_and_locks() {
        let d = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        let s = OsStorage;
        let dir = d.path().join("a/b/c");
        assert!(s.create_dir_all(&dir).is_ok());
        assert!(dir.is_dir());
        let path = dir.join("f");
        let f = match s.create(&path, false) {
            Ok(f) => f,
            Err(e) => panic!("{e}"),
        };
        assert!(s.create(&path, false).is_err(), "create without truncate");
        assert!(f.write_at(b"hello world", 0).is_ok());
        assert!(f.sync_data().is_ok());
        assert!(s.sync_dir(&dir).is_ok());
        let mut buf = [0u8; 5];
        assert!(f.read_at(&mut buf, 6).is_ok());
        assert_eq!(&buf, b"world");
        assert!(f.read_at(&mut buf, 9).is_err(), "short read is an error");
        assert_eq!(read_up_to(&*f, 6, 100).ok(), Some(b"world".to_vec()));
        assert!(f.set_len(5).is_ok());
        assert_eq!(f.size().ok(), Some(5));
        assert_eq!(s.list(&dir).ok(), Some(vec!["f".to_owned()]));
        let lock = dir.join("LOCK");
        let held = s.try_lock(&lock);
        assert!(matches!(held, Ok(Some(_))));
        assert!(matches!(s.try_lock(&lock), Ok(None)), "held once");
        drop(held);
        assert!(matches!(s.try_lock(&lock), Ok(Some(_))), "released on drop");
        assert!(s.remove(&path).is_ok());
        assert!(!path.exists());
    }
}
