//! A simulated disk: in memory, seeded and deterministic, that loses what
//! a real disk may lose and fails the way a real disk may fail.
//!
//! Modelled on TigerBeetle's testing storage (`src/testing/storage.zig`):
//! the disk remembers, per file, what was made durable by the last
//! `fdatasync` and which writes came after it, and per directory, which
//! creations and removals were made durable by a directory sync. A
//! simulated power loss ([`SimDisk::power_loss`], or
//! [`SimDisk::power_fails_at_op`] at a chosen point) keeps:
//!
//! - every file's synced contents;
//! - of the writes after the last sync, each 512-byte sector (by absolute
//!   offset) written or not, chosen by the seed: a torn write. Sectors
//!   past the old end that were written leave zeros in the sectors before
//!   them that were not (the file grew, the data did not land). An
//!   unsynced truncation happens or not;
//! - each file created or removed since its directory's last sync: there
//!   or not, chosen by the seed.
//!
//! Everything else the disk can be told to do, to one operation or at a
//! seeded rate:
//!
//! - fail a write or a `fdatasync` with `EIO`. A failed `fdatasync` models
//!   Linux after a writeback error: some of the unsynced sectors reached
//!   the disk, the rest are dropped, and a later successful sync does not
//!   bring them back (reads still show them until the next power loss);
//! - return corrupted bytes on reads of a range (a latent sector error or
//!   a misdirected read: the data itself is intact);
//! - flip bytes in, or truncate, a file's durable contents (bit rot, a
//!   lost tail);
//! - lose a file.
//!
//! After a power loss the handles opened before it fail with `EIO`, so a
//! store that was running fails closed and is dropped; a new store opened
//! on the same disk sees what survived.
//!
//! Determinism: the same seed and the same sequence of calls give the same
//! result, byte for byte. The store calls the disk from its writer thread,
//! so simulations run the store without its own threads (see
//! [`super::StoreConfig::background_writer`]) to fix the order of calls.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::storage::{LockGuard, Storage, StorageFile};

/// Granularity of a torn write: what a disk writes atomically.
pub const SECTOR_BYTES: u64 = 512;
/// Operations kept in the trace printed when a simulation fails.
const TRACE_OPS_MAX: usize = 256;

/// A small, fast, seedable generator (SplitMix64): the same seed gives the
/// same sequence on every platform and build, which a simulation's replay
/// by seed depends on.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }

    /// A fair coin.
    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

/// Kinds of operations a fault can be aimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimOp {
    /// `write_at`.
    Write,
    /// `fdatasync` of a file.
    Sync,
    /// `read_at`.
    Read,
    /// Creating a file.
    Create,
    /// Removing a file.
    Remove,
    /// Syncing a directory.
    SyncDir,
}

/// Seeded fault rates, in operations per thousand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimFaultRates {
    /// `write_at` fails with `EIO` (nothing written).
    pub write_eio_per_mille: u32,
    /// `fdatasync` fails with `EIO` (unsynced sectors torn, then dropped).
    pub sync_eio_per_mille: u32,
}

/// Counters of what the disk did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Mutating operations (writes, syncs, truncations, creations,
    /// removals, directory syncs).
    pub mutating_ops: u64,
    /// `write_at` calls.
    pub writes: u64,
    /// `fdatasync` calls.
    pub syncs: u64,
    /// Directory syncs.
    pub dir_syncs: u64,
    /// Power losses.
    pub power_losses: u64,
    /// Faults injected (EIO, corrupted reads).
    pub faults: u64,
    /// Bytes of the largest single read: what one read call fetches.
    pub largest_read: u64,
}

#[derive(Debug)]
enum Unsynced {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Inode {
    /// What reads see.
    data: Vec<u8>,
    /// What a power loss keeps for sure.
    durable: Vec<u8>,
    /// Changes since the last sync, in order.
    unsynced: Vec<Unsynced>,
}

#[derive(Debug)]
struct OneShot {
    op: SimOp,
    path: Option<PathBuf>,
}

#[derive(Debug)]
struct State {
    seed: u64,
    rng: SimRng,
    /// Increments at each power loss; handles of an older epoch fail.
    epoch: u64,
    next_inode: u64,
    inodes: HashMap<u64, Inode>,
    /// The namespace now.
    names: BTreeMap<PathBuf, u64>,
    /// The namespace as of each directory's last sync.
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    locks: BTreeMap<PathBuf, u64>,
    next_lock: u64,
    rates: SimFaultRates,
    one_shots: Vec<OneShot>,
    corrupt_reads: Vec<(PathBuf, u64, u64)>,
    /// File bytes at or past this position are said not to be in the page
    /// cache (`is_cached`); `None`: all are.
    uncached_from: Option<u64>,
    power_fails_at_op: Option<u64>,
    /// What [`Storage::free_bytes`] reports, whatever the directory.
    free_bytes: u64,
    stats: SimStats,
    trace: VecDeque<String>,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated EIO: {what}"))
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl State {
    fn note(&mut self, what: String) {
        if self.trace.len() == TRACE_OPS_MAX {
            self.trace.pop_front();
        }
        self.trace.push_back(what);
    }

    /// Counts a mutating operation; the power fails here if so planned
    /// (the operation is then not done).
    fn mutation(&mut self, op: SimOp, path: &Path) -> io::Result<()> {
        self.stats.mutating_ops += 1;
        let n = self.stats.mutating_ops;
        self.note(format!("#{n} {op:?} {}", path.display()));
        if self.power_fails_at_op.is_some_and(|at| n >= at) {
            self.power_fails_at_op = None;
            self.power_loss();
            return Err(eio("power lost"));
        }
        Ok(())
    }

    /// Takes a one-shot fault planned for `op` on `path`, if any.
    fn one_shot(&mut self, op: SimOp, path: &Path) -> bool {
        let hit = self
            .one_shots
            .iter()
            .position(|f| f.op == op && f.path.as_deref().is_none_or(|p| p == path));
        match hit {
            Some(i) => {
                self.one_shots.remove(i);
                self.stats.faults += 1;
                self.note(format!("  fault: {op:?} {} fails", path.display()));
                true
            }
            None => false,
        }
    }

    fn seeded_fault(&mut self, per_mille: u32) -> bool {
        if per_mille == 0 {
            return false;
        }
        let hit = self.rng.chance(per_mille);
        if hit {
            self.stats.faults += 1;
        }
        hit
    }

    fn inode_of(&self, path: &Path) -> io::Result<u64> {
        self.names
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }

    /// Applies the unsynced changes of `ino` to its durable contents, each
    /// sector or truncation kept or dropped by the seed; clears them.
    fn tear(&mut self, ino: u64) {
        let Some(inode) = self.inodes.get_mut(&ino) else {
            return;
        };
        let unsynced = std::mem::take(&mut inode.unsynced);
        for change in unsynced {
            match change {
                Unsynced::SetLen(len) => {
                    if self.rng.coin() {
                        inode
                            .durable
                            .resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
                    }
                }
                Unsynced::Write { offset, bytes } => {
                    let end = offset + bytes.len() as u64;
                    let mut at = offset;
                    while at < end {
                        let sector_end = ((at / SECTOR_BYTES) + 1) * SECTOR_BYTES;
                        let piece_end = sector_end.min(end);
                        if self.rng.coin() {
                            let from = (at - offset) as usize;
                            let to = (piece_end - offset) as usize;
                            put(&mut inode.durable, at, &bytes[from..to]);
                        }
                        at = piece_end;
                    }
                }
            }
        }
    }

    fn power_loss(&mut self) {
        self.stats.power_losses += 1;
        self.note("power loss".into());
        let inodes: Vec<u64> = self.inodes.keys().copied().collect();
        let mut sorted = inodes;
        sorted.sort_unstable();
        for ino in sorted {
            self.tear(ino);
        }
        let paths: BTreeSet<PathBuf> = self
            .names
            .keys()
            .chain(self.durable_names.keys())
            .cloned()
            .collect();
        let mut survivors = BTreeMap::new();
        for path in paths {
            let now = self.names.get(&path).copied();
            let synced = self.durable_names.get(&path).copied();
            let keep = match (now, synced) {
                (Some(a), Some(b)) if a == b => Some(a),
                (Some(a), Some(b)) => Some(if self.rng.coin() { a } else { b }),
                (Some(a), None) | (None, Some(a)) => self.rng.coin().then_some(a),
                (None, None) => None,
            };
            if let Some(ino) = keep {
                self.note(format!("  survives: {}", path.display()));
                survivors.insert(path, ino);
            } else {
                self.note(format!("  lost: {}", path.display()));
            }
        }
        let live: BTreeSet<u64> = survivors.values().copied().collect();
        self.inodes.retain(|ino, _| live.contains(ino));
        for inode in self.inodes.values_mut() {
            inode.data = inode.durable.clone();
        }
        self.names = survivors.clone();
        self.durable_names = survivors;
        self.locks.clear();
        self.epoch += 1;
    }
}

/// Writes `bytes` at `offset`, zero-filling up to it.
fn put(buf: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let at = usize::try_from(offset).unwrap_or(usize::MAX);
    let end = at + bytes.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[at..end].copy_from_slice(bytes);
}

/// Free space a new simulated disk reports: plenty (1 TiB).
pub const SIM_FREE_BYTES_DEFAULT: u64 = 1 << 40;

/// The simulated disk. Cheap to clone; clones share one disk.
///
/// A program run on the disk (a store) gets its own handle from
/// [`SimDisk::attach`]: after a power loss every operation through that
/// handle fails, as the program died with the power, so a store still
/// running when the power failed can no longer create or remove files on
/// the disk that comes back.
#[derive(Debug, Clone)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
    /// The power cycle this handle belongs to (`None`: the test's own
    /// handle, which outlives power losses).
    epoch: Option<u64>,
}

impl SimDisk {
    /// An empty disk whose every random choice follows `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                seed,
                rng: SimRng::new(seed ^ 0x5EED_D15C),
                epoch: 0,
                next_inode: 1,
                inodes: HashMap::new(),
                names: BTreeMap::new(),
                durable_names: BTreeMap::new(),
                dirs: BTreeSet::new(),
                locks: BTreeMap::new(),
                next_lock: 1,
                rates: SimFaultRates::default(),
                one_shots: Vec::new(),
                corrupt_reads: Vec::new(),
                uncached_from: None,
                power_fails_at_op: None,
                free_bytes: SIM_FREE_BYTES_DEFAULT,
                stats: SimStats::default(),
                trace: VecDeque::new(),
            })),
            epoch: None,
        }
    }

    /// Sets the free space every directory reports from now on (a disk
    /// filling up, or freed).
    pub fn set_free_bytes(&self, bytes: u64) {
        self.state.lock().free_bytes = bytes;
    }

    /// A handle for one run of a program on the disk, until the next
    /// power loss.
    pub fn attach(&self) -> SimDisk {
        SimDisk {
            state: Arc::clone(&self.state),
            epoch: Some(self.state.lock().epoch),
        }
    }

    /// Locks the state for an operation through this handle.
    fn live(&self) -> io::Result<parking_lot::MutexGuard<'_, State>> {
        let st = self.state.lock();
        match self.epoch {
            Some(e) if e != st.epoch => Err(eio("the power failed since this handle was attached")),
            _ => Ok(st),
        }
    }

    /// The seed it was made with.
    pub fn seed(&self) -> u64 {
        self.state.lock().seed
    }

    /// What the disk did so far.
    pub fn stats(&self) -> SimStats {
        self.state.lock().stats
    }

    /// The last operations, for a failure message.
    pub fn trace(&self) -> Vec<String> {
        self.state.lock().trace.iter().cloned().collect()
    }

    /// Sets seeded fault rates.
    pub fn set_fault_rates(&self, rates: SimFaultRates) {
        self.state.lock().rates = rates;
    }

    /// The next `op` (on `path`, or on any file) fails with `EIO`.
    pub fn fail_next(&self, op: SimOp, path: Option<&Path>) {
        self.state.lock().one_shots.push(OneShot {
            op,
            path: path.map(Path::to_path_buf),
        });
    }

    /// From now on, [`StorageFile::is_cached`] says `!uncached` of every
    /// read: a disk whose page cache holds nothing, or everything.
    pub fn set_uncached(&self, uncached: bool) {
        self.state.lock().uncached_from = uncached.then_some(0);
    }

    /// From now on, [`StorageFile::is_cached`] says a range of any file is
    /// cached only if it ends at or before `pos`: a page cache that holds
    /// the start of the files and not the rest.
    pub fn set_uncached_from(&self, pos: u64) {
        self.state.lock().uncached_from = Some(pos);
    }

    /// From now on, reads of `path` overlapping `offset..offset + len`
    /// return those bytes inverted (the stored data stays intact).
    pub fn corrupt_reads(&self, path: &Path, offset: u64, len: u64) {
        self.state
            .lock()
            .corrupt_reads
            .push((path.to_path_buf(), offset, offset + len));
    }

    /// The power fails when the mutating operation number `op` (counted
    /// from the disk's creation, see [`SimStats::mutating_ops`]) is
    /// attempted: it and everything after it on handles opened before
    /// fail with `EIO`.
    pub fn power_fails_at_op(&self, op: u64) {
        self.state.lock().power_fails_at_op = Some(op);
    }

    /// The power fails now.
    pub fn power_loss(&self) {
        self.state.lock().power_loss();
    }

    /// Changes the inode of `path` by hand (damage the disk did).
    fn damage(&self, path: &Path, f: impl FnOnce(&mut Inode)) -> io::Result<()> {
        let mut st = self.state.lock();
        let ino = st.inode_of(path)?;
        let inode = st
            .inodes
            .get_mut(&ino)
            .ok_or_else(|| eio("no such inode"))?;
        f(inode);
        Ok(())
    }

    /// Flips the bits of `mask` in the byte at `offset` of `path`, in its
    /// durable contents and in what reads see: bit rot.
    pub fn flip_byte(&self, path: &Path, offset: u64, mask: u8) -> io::Result<()> {
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        self.damage(path, |inode| {
            for buf in [&mut inode.data, &mut inode.durable] {
                if let Some(b) = buf.get_mut(at) {
                    *b ^= mask;
                }
            }
        })
    }

    /// Overwrites bytes of `path` at `offset`, durably (damage by hand).
    pub fn overwrite(&self, path: &Path, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.damage(path, |inode| {
            put(&mut inode.data, offset, bytes);
            put(&mut inode.durable, offset, bytes);
        })
    }

    /// Cuts `path` to `len` bytes, durably (a lost tail).
    pub fn truncate_durably(&self, path: &Path, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        self.damage(path, |inode| {
            inode.data.truncate(len);
            inode.durable.truncate(len);
        })
    }

    /// Loses `path` entirely, as if it had never been written.
    pub fn lose_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        let ino = st.inode_of(path)?;
        st.names.remove(path);
        st.durable_names.remove(path);
        st.inodes.remove(&ino);
        Ok(())
    }

    /// Files of `dir` now, sorted.
    pub fn files(&self, dir: &Path) -> Vec<PathBuf> {
        let st = self.state.lock();
        st.names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .cloned()
            .collect()
    }

    /// What reads of `path` return now (`None`: no such file).
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.state.lock();
        let ino = st.names.get(path)?;
        st.inodes.get(ino).map(|i| i.data.clone())
    }

    /// What a power loss now would keep of `path` for sure: its synced
    /// contents, if its name is durable (`None` otherwise).
    pub fn durable_contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.state.lock();
        let ino = st.durable_names.get(path)?;
        if st.names.get(path) != Some(ino) {
            return None;
        }
        st.inodes.get(ino).map(|i| i.durable.clone())
    }

    /// Whether any file of `dir` surely survives a power loss now with
    /// `needle` in it: the test of "acknowledged only once durable".
    pub fn durably_contains(&self, dir: &Path, needle: &[u8]) -> bool {
        self.files(dir).iter().any(|p| {
            self.durable_contents(p).is_some_and(|data| {
                !needle.is_empty() && data.windows(needle.len()).any(|w| w == needle)
            })
        })
    }

    fn file(&self, path: &Path, ino: u64, epoch: u64) -> Box<dyn StorageFile> {
        Box::new(SimFile {
            state: Arc::clone(&self.state),
            path: path.to_path_buf(),
            ino,
            epoch,
        })
    }
}

impl Storage for SimDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.live()?;
        let missing: Vec<PathBuf> = dir
            .ancestors()
            .filter(|a| !a.as_os_str().is_empty() && !st.dirs.contains(*a))
            .map(Path::to_path_buf)
            .collect();
        for d in missing.into_iter().rev() {
            st.mutation(SimOp::SyncDir, &d)?;
            // Created and synced along with its parent: durable at once.
            st.dirs.insert(d);
        }
        Ok(())
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let st = self.live()?;
        let ino = st.inode_of(path)?;
        let epoch = st.epoch;
        drop(st);
        Ok(self.file(path, ino, epoch))
    }

    fn create(&self, path: &Path, truncate: bool) -> io::Result<Box<dyn StorageFile>> {
        let mut st = self.live()?;
        if !st.dirs.contains(&parent_of(path)) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no directory for {}", path.display()),
            ));
        }
        if let Some(&ino) = st.names.get(path) {
            if !truncate {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    path.display().to_string(),
                ));
            }
            st.mutation(SimOp::Write, path)?;
            if let Some(inode) = st.inodes.get_mut(&ino) {
                inode.data.clear();
                inode.unsynced.push(Unsynced::SetLen(0));
            }
            let epoch = st.epoch;
            drop(st);
            return Ok(self.file(path, ino, epoch));
        }
        st.mutation(SimOp::Create, path)?;
        if st.one_shot(SimOp::Create, path) {
            return Err(eio("create"));
        }
        let ino = st.next_inode;
        st.next_inode += 1;
        st.inodes.insert(ino, Inode::default());
        st.names.insert(path.to_path_buf(), ino);
        let epoch = st.epoch;
        drop(st);
        Ok(self.file(path, ino, epoch))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.live()?;
        st.inode_of(path)?;
        st.mutation(SimOp::Remove, path)?;
        if st.one_shot(SimOp::Remove, path) {
            return Err(eio("remove"));
        }
        st.names.remove(path);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.live()?;
        st.mutation(SimOp::SyncDir, dir)?;
        st.stats.dir_syncs += 1;
        if st.one_shot(SimOp::SyncDir, dir) {
            return Err(eio("directory sync"));
        }
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        let now: Vec<(PathBuf, u64)> = st
            .names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        st.durable_names.retain(|p, _| !in_dir(p));
        st.durable_names.extend(now);
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.live()?;
        if !st.dirs.contains(dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                dir.display().to_string(),
            ));
        }
        Ok(st
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn random_u32(&self) -> u32 {
        self.state.lock().rng.next_u64() as u32
    }

    fn free_bytes(&self, dir: &Path) -> io::Result<u64> {
        let st = self.live()?;
        if !st.dirs.contains(dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no directory {}", dir.display()),
            ));
        }
        Ok(st.free_bytes)
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        let mut st = self.live()?;
        if st.locks.contains_key(path) {
            return Ok(None);
        }
        let id = st.next_lock;
        st.next_lock += 1;
        st.locks.insert(path.to_path_buf(), id);
        Ok(Some(Box::new(SimLock {
            state: Arc::clone(&self.state),
            path: path.to_path_buf(),
            id,
        })))
    }
}

#[derive(Debug)]
struct SimLock {
    state: Arc<Mutex<State>>,
    path: PathBuf,
    id: u64,
}

impl LockGuard for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut st = self.state.lock();
        if st.locks.get(&self.path) == Some(&self.id) {
            st.locks.remove(&self.path);
        }
    }
}

#[derive(Debug)]
struct SimFile {
    state: Arc<Mutex<State>>,
    path: PathBuf,
    ino: u64,
    epoch: u64,
}

impl SimFile {
    fn live<'a>(&self, st: &'a mut State) -> io::Result<&'a mut State> {
        if st.epoch != self.epoch {
            return Err(eio("the disk lost power since this file was opened"));
        }
        Ok(st)
    }
}

impl StorageFile for SimFile {
    fn is_cached(&self, offset: u64, len: usize) -> bool {
        self.state
            .lock()
            .uncached_from
            .is_none_or(|from| offset.saturating_add(len as u64) <= from)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut guard = self.state.lock();
        let st = self.live(&mut guard)?;
        st.one_shot(SimOp::Read, &self.path)
            .then(|| Err::<(), _>(eio("read")))
            .transpose()?;
        let inode = st
            .inodes
            .get(&self.ino)
            .ok_or_else(|| eio("no such inode"))?;
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = at.saturating_add(buf.len());
        let Some(src) = inode.data.get(at..end) else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read past the end of {}", self.path.display()),
            ));
        };
        buf.copy_from_slice(src);
        st.stats.largest_read = st.stats.largest_read.max(buf.len() as u64);
        let mut corrupted = false;
        for (p, from, to) in &st.corrupt_reads {
            if *p != self.path {
                continue;
            }
            let lo = (*from).max(offset);
            let hi = (*to).min(offset + buf.len() as u64);
            for i in lo..hi {
                buf[(i - offset) as usize] ^= 0xFF;
                corrupted = true;
            }
        }
        if corrupted {
            st.stats.faults += 1;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut guard = self.state.lock();
        let st = self.live(&mut guard)?;
        st.mutation(SimOp::Write, &self.path)?;
        st.stats.writes += 1;
        let rate = st.rates.write_eio_per_mille;
        if st.one_shot(SimOp::Write, &self.path) || st.seeded_fault(rate) {
            return Err(eio("write"));
        }
        let inode = st
            .inodes
            .get_mut(&self.ino)
            .ok_or_else(|| eio("no such inode"))?;
        put(&mut inode.data, offset, buf);
        inode.unsynced.push(Unsynced::Write {
            offset,
            bytes: buf.to_vec(),
        });
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut guard = self.state.lock();
        let st = self.live(&mut guard)?;
        st.mutation(SimOp::Sync, &self.path)?;
        st.stats.syncs += 1;
        let rate = st.rates.sync_eio_per_mille;
        if st.one_shot(SimOp::Sync, &self.path) || st.seeded_fault(rate) {
            // Writeback failed: what reached the disk is a torn subset,
            // and the rest is marked clean, never to be written.
            st.tear(self.ino);
            return Err(eio("fdatasync"));
        }
        let inode = st
            .inodes
            .get_mut(&self.ino)
            .ok_or_else(|| eio("no such inode"))?;
        for change in std::mem::take(&mut inode.unsynced) {
            match change {
                Unsynced::Write { offset, bytes } => put(&mut inode.durable, offset, &bytes),
                Unsynced::SetLen(len) => inode
                    .durable
                    .resize(usize::try_from(len).unwrap_or(usize::MAX), 0),
            }
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut guard = self.state.lock();
        let st = self.live(&mut guard)?;
        st.mutation(SimOp::Write, &self.path)?;
        let inode = st
            .inodes
            .get_mut(&self.ino)
            .ok_or_else(|| eio("no such inode"))?;
        inode
            .data
            .resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
        inode.unsynced.push(Unsynced::SetLen(len));
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        let mut guard = self.state.lock();
        let st = self.live(&mut guard)?;
        let inode = st
            .inodes
            .get(&self.ino)
            .ok_or_else(|| eio("no such inode"))?;
        Ok(inode.data.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        PathBuf::from("/sim/data")
    }

    fn ready(seed: u64) -> SimDisk {
        let d = SimDisk::new(seed);
        assert!(d.create_dir_all(&dir()).is_ok());
        d
    }

    fn create(d: &SimDisk, name: &str) -> Box<dyn StorageFile> {
        match d.create(&dir().join(name), false) {
            Ok(f) => f,
            Err(e) => panic!("create: {e}"),
        }
    }

    #[test]
    fn synced_data_and_synced_names_survive_a_power_loss() {
        let d = ready(1);
        let f = create(&d, "a");
        assert!(f.write_at(b"durable", 0).is_ok());
        assert!(f.sync_data().is_ok());
        assert!(d.sync_dir(&dir()).is_ok());
        d.power_loss();
        assert_eq!(d.contents(&dir().join("a")), Some(b"durable".to_vec()));
        // The old handle is dead.
        assert!(f.write_at(b"x", 0).is_err());
        assert!(f.size().is_err());
    }

    /// One synced sector, then three unsynced ones, then a power loss:
    /// what is left of the file.
    fn torn_three_sectors(seed: u64) -> Vec<u8> {
        let d = ready(seed);
        let f = create(&d, "a");
        assert!(d.sync_dir(&dir()).is_ok());
        assert!(f.write_at(&[1u8; 512], 0).is_ok());
        assert!(f.sync_data().is_ok());
        assert!(f.write_at(&[2u8; 1536], 512).is_ok());
        d.power_loss();
        d.contents(&dir().join("a")).unwrap_or_default()
    }

    #[test]
    fn unsynced_writes_tear_at_sector_granularity_by_seed() {
        let mut outcomes = BTreeSet::new();
        for seed in 0..64 {
            let data = torn_three_sectors(seed);
            assert_eq!(&data[..512], &[1u8; 512][..], "synced sector kept");
            let sectors: Vec<u8> = data[512..].chunks(512).map(|c| c[0]).collect();
            for c in data[512..].chunks(512) {
                assert!(c.iter().all(|b| *b == c[0]), "whole sectors only");
            }
            outcomes.insert(sectors);
            assert_eq!(torn_three_sectors(seed), data, "same seed, same outcome");
        }
        assert!(outcomes.len() >= 4, "seeds tear differently: {outcomes:?}");
        assert!(outcomes.contains(&vec![]), "nothing landed");
        assert!(outcomes.contains(&vec![2, 2, 2]), "everything landed");
        assert!(outcomes.contains(&vec![0, 0, 2]), "a hole of zeros");
    }

    #[test]
    fn names_without_a_directory_sync_may_or_may_not_survive() {
        let mut kept = BTreeSet::new();
        for seed in 0..32 {
            let d = ready(seed);
            let f = create(&d, "old");
            assert!(f.sync_data().is_ok());
            assert!(d.sync_dir(&dir()).is_ok());
            create(&d, "new");
            assert!(d.remove(&dir().join("old")).is_ok());
            d.power_loss();
            let names: Vec<PathBuf> = d.files(&dir());
            kept.insert(names);
        }
        assert_eq!(kept.len(), 4, "each of the two names either way: {kept:?}");
    }

    #[test]
    fn a_failed_sync_drops_what_it_did_not_write_even_after_a_later_sync() {
        let mut lost_some = false;
        for seed in 0..16 {
            let d = ready(seed);
            let f = create(&d, "a");
            assert!(d.sync_dir(&dir()).is_ok());
            assert!(f.write_at(&[7u8; 2048], 0).is_ok());
            d.fail_next(SimOp::Sync, None);
            assert!(f.sync_data().is_err());
            let path = dir().join("a");
            assert_eq!(
                d.contents(&path).map(|c| c.len()),
                Some(2048),
                "reads still see it"
            );
            assert!(f.sync_data().is_ok(), "a later sync succeeds");
            let durable = d.durable_contents(&path).unwrap_or_default();
            lost_some |= durable != vec![7u8; 2048];
            d.power_loss();
            assert_eq!(
                d.contents(&path),
                Some(durable),
                "the later sync saved nothing more"
            );
        }
        assert!(lost_some, "some seed drops sectors at the failed sync");
    }

    #[test]
    fn the_power_fails_at_the_planned_operation() {
        let d = ready(3);
        let start = d.stats().mutating_ops;
        let f = create(&d, "a");
        d.power_fails_at_op(start + 3);
        assert!(f.write_at(b"one", 0).is_ok());
        assert!(
            f.write_at(b"two", 3).is_err(),
            "op 3 is where the power fails"
        );
        assert!(f.sync_data().is_err(), "and nothing works after");
        assert_eq!(d.stats().power_losses, 1);
    }

    #[test]
    fn corrupted_reads_leave_the_data_intact() {
        let d = ready(4);
        let f = create(&d, "a");
        assert!(f.write_at(b"abcdef", 0).is_ok());
        d.corrupt_reads(&dir().join("a"), 2, 2);
        let mut buf = [0u8; 6];
        assert!(f.read_at(&mut buf, 0).is_ok());
        assert_eq!(&buf[..2], b"ab");
        assert_ne!(&buf[2..4], b"cd");
        assert_eq!(&buf[4..], b"ef");
        assert_eq!(d.contents(&dir().join("a")), Some(b"abcdef".to_vec()));
    }

    #[test]
    fn an_attached_handle_dies_with_the_power() {
        let d = ready(6);
        let program = d.attach();
        assert!(program.create(&dir().join("a"), false).is_ok());
        d.power_loss();
        assert!(program.create(&dir().join("b"), false).is_err());
        assert!(program.list(&dir()).is_err());
        assert!(d.attach().list(&dir()).is_ok(), "a new run works");
    }

    #[test]
    fn locks_are_exclusive_and_a_power_loss_releases_them() {
        let d = ready(5);
        let lock = dir().join("LOCK");
        let held = d.try_lock(&lock);
        assert!(matches!(held, Ok(Some(_))));
        assert!(matches!(d.try_lock(&lock), Ok(None)));
        d.power_loss();
        let again = d.try_lock(&lock);
        assert!(matches!(again, Ok(Some(_))), "released by the power loss");
        drop(held);
        assert!(
            matches!(d.try_lock(&lock), Ok(None)),
            "the old guard does not free the new lock"
        );
    }
}
