//! The shared state of one simulated machine: an `mmap`'d file
//! `$CGPU_SIM_STATE/state` with a versioned `repr(C)` layout, shared by every
//! process that uses the same directory.
//!
//! - Device records: configuration (total bytes, name, UUID), the scheduler
//!   word pair (`owner`, `seq`) used to time-slice the device between
//!   processes, and counters (busy ns, kernels).
//! - Process slots: pid, start time, per device the bytes held, device time,
//!   kernel count and whether the process wants the device. A slot is *alive*
//!   while its owner holds an `fcntl` OFD write lock on the slot's lock byte;
//!   the kernel drops it when the process dies (in any PID namespace), so a
//!   killed process never holds memory or the device for long: the next
//!   operation of any process reaps it (memory back, device released), keeping
//!   its device time and kernel count with `state = EXITED`.
//! - Stub counts: calls per name of the functions the sim only stubs.
//! - Memory used on a device is derived: the sum of the bytes held by alive
//!   slots. Allocation takes the device's OFD lock byte (a short critical
//!   section; released by the kernel if the holder dies).
//!
//! Lock bytes lie beyond the data, at `LOCK_BASE + ...` (OFD locks may cover
//! bytes past EOF).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

pub const MAGIC: [u8; 8] = *b"CGPUSIM\0";
pub const VERSION: u32 = 3;
pub const MAX_DEVICES: usize = 16;
pub const MAX_SLOTS: usize = 1024;
/// Distinct stub names counted (`stubs.rs`).
pub const MAX_STUBS: usize = 1024;
pub const STUB_NAME_WORDS: usize = 8;

pub const SLOT_FREE: u32 = 0;
pub const SLOT_ALIVE: u32 = 1;
pub const SLOT_EXITED: u32 = 2;

const LOCK_BASE: i64 = 1 << 32;
const LOCK_TABLE: i64 = LOCK_BASE;
const LOCK_DEV: i64 = LOCK_BASE + 16; // + device index
const LOCK_SLOT: i64 = LOCK_BASE + 4096; // + slot index

#[repr(C)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    /// `size_of::<StateFile>()`: a layout check on top of the version.
    pub layout_size: u32,
    pub ndev: u32,
    /// One past the highest slot ever used.
    pub nslots: AtomicU32,
    pub created_unix_ns: u64,
    pub _reserved: [u64; 8],
}

#[repr(C)]
pub struct DeviceRec {
    pub total_bytes: u64,
    pub name: [u8; 96],
    pub uuid: [u8; 48],
    /// Slot index + 1 of the process that owns the device now; 0 when free.
    pub owner: AtomicU32,
    /// Futex word: bumped at every release/handoff.
    pub seq: AtomicU32,
    pub busy_ns: AtomicU64,
    pub kernels: AtomicU64,
    /// Device time (CLOCK_MONOTONIC ns) at which the last batch ends.
    pub last_end_ns: AtomicU64,
    pub _reserved: [u64; 7],
}

#[repr(C)]
pub struct SlotRec {
    pub state: AtomicU32,
    pub pid: AtomicU32,
    /// CLOCK_REALTIME ns when the slot was claimed / reaped.
    pub start_unix_ns: AtomicU64,
    pub end_unix_ns: AtomicU64,
    pub comm: [AtomicU64; 2],
    pub mem: [AtomicU64; MAX_DEVICES],
    pub time_ns: [AtomicU64; MAX_DEVICES],
    pub kernels: [AtomicU64; MAX_DEVICES],
    /// Nonzero while the process has queued work for the device.
    pub want: [AtomicU32; MAX_DEVICES],
    /// Bit d: the process has (had) a context on device d.
    pub dev_mask: AtomicU32,
    /// Bit d: the process has a live context on device d.
    pub ctx_mask: AtomicU32,
    /// `CUprocessState` (`cuCheckpointProcess*`): 0 running, 1 locked (its
    /// CUDA calls wait), 2 checkpointed.
    pub ckpt: AtomicU32,
    /// Device memory moved out by a checkpoint, per device, until restored.
    pub ckpt_mem: [AtomicU64; MAX_DEVICES],
}

/// Calls to one stub function, summed over every process (`stubs.rs`).
#[repr(C)]
pub struct StubRec {
    /// The function's name, NUL-padded; word 0 is written last (all zero:
    /// the record is free).
    pub name: [AtomicU64; STUB_NAME_WORDS],
    pub calls: AtomicU64,
}

#[repr(C)]
pub struct StateFile {
    pub header: Header,
    pub devices: [DeviceRec; MAX_DEVICES],
    pub slots: [SlotRec; MAX_SLOTS],
    pub stubs: [StubRec; MAX_STUBS],
}

pub const STATE_SIZE: usize = std::mem::size_of::<StateFile>();

/// An open state directory.
pub struct Shared {
    file: File,
    map: &'static StateFile,
    pub dir: PathBuf,
}

// SAFETY: the mapping is only accessed through atomics (or fields written once
// before the file is published under the table lock); File is Send+Sync.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// The devices a process wants the state to describe.
pub struct DeviceInit<'a> {
    pub total_bytes: u64,
    pub name: &'a str,
}

pub fn now_mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn ofd(fd: i32, cmd: i32, typ: i32, off: i64) -> io::Result<libc::flock> {
    // SAFETY: flock is plain data; zeroed is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = off;
    fl.l_len = 1;
    loop {
        // SAFETY: fd is open, fl is a valid flock for the OFD commands.
        let r = unsafe { libc::fcntl(fd, cmd, &mut fl) };
        if r == 0 {
            return Ok(fl);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// RAII guard of an OFD lock byte.
pub struct LockGuard<'a> {
    fd: i32,
    off: i64,
    _s: std::marker::PhantomData<&'a Shared>,
}
impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        let _ = ofd(self.fd, libc::F_OFD_SETLK, libc::F_UNLCK, self.off);
    }
}

fn uuid_for(dir: &Path, index: usize) -> String {
    // FNV-1a over the directory and index, twice with different seeds.
    let key = format!("{}#{index}", dir.display());
    let h = |seed: u64| {
        let mut h = 0xcbf29ce484222325u64 ^ seed;
        for b in key.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h
    };
    let (a, b) = (h(0), h(0x9e3779b97f4a7c15));
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (a >> 32) as u32,
        (a >> 16) as u16,
        a as u16,
        (b >> 48) as u16,
        b & 0xffff_ffff_ffff
    )
}

fn cstr(buf: &[u8]) -> String {
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn put_str(buf: &mut [u8], s: &str) {
    buf.fill(0);
    let n = s.len().min(buf.len() - 1);
    buf[..n].copy_from_slice(&s.as_bytes()[..n]);
}

impl Shared {
    /// Opens (creating if needed) the state in `dir`. With `want` given and the
    /// file fresh (or holding no live process), the devices are (re)set from it.
    pub fn open(dir: &Path, want: Option<&[DeviceInit]>) -> io::Result<Shared> {
        std::fs::create_dir_all(dir)?;
        // One name for the directory whatever the cwd (UUIDs derive from it).
        let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let dir = canonical.as_path();
        let path = dir.join("state");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)?;
        let fd = file.as_raw_fd();
        ofd(fd, libc::F_OFD_SETLKW, libc::F_WRLCK, LOCK_TABLE)?;
        Self::open_locked(dir, &path, file, want)
    }

    fn open_locked(
        dir: &Path,
        path: &Path,
        mut file: File,
        want: Option<&[DeviceInit]>,
    ) -> io::Result<Shared> {
        let len = file.metadata()?.len();
        let mut fresh = len == 0;
        if !fresh {
            let mut hdr = [0u8; 16];
            use std::io::Read;
            let ok = len == STATE_SIZE as u64
                && file.read_exact(&mut hdr).is_ok()
                && hdr[..8] == MAGIC
                && u32::from_ne_bytes(hdr[8..12].try_into().unwrap_or_default()) == VERSION
                && u32::from_ne_bytes(hdr[12..16].try_into().unwrap_or_default())
                    == STATE_SIZE as u32;
            if !ok {
                let aside = dir.join(format!("state.bad-{}", now_unix_ns()));
                eprintln!(
                    "cgpu-sim: {} is corrupt or of another format version (want v{VERSION}, {STATE_SIZE} bytes); moved it to {} and starting fresh",
                    path.display(),
                    aside.display()
                );
                let _ = std::fs::rename(path, &aside);
                // The lock we hold is on the old file: retake on the new one.
                let nf = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o666)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(path)?;
                ofd(
                    nf.as_raw_fd(),
                    libc::F_OFD_SETLKW,
                    libc::F_WRLCK,
                    LOCK_TABLE,
                )?;
                drop(file); // releases the old lock
                file = nf;
                fresh = file.metadata()?.len() == 0;
                if !fresh {
                    // someone else re-created it meanwhile: validate again
                    return Self::open_locked(dir, path, file, want);
                }
            }
        }
        if fresh {
            file.set_len(STATE_SIZE as u64)?;
        }
        // Map through a description of its own: a mapping pins the open file
        // description it was made from, and a forked child inherits mappings.
        // Had we mapped `file` (which carries our liveness lock), a child
        // would keep a killed parent "alive" for as long as it lives.
        let map_file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        // SAFETY: mapping a regular file we opened read-write, of STATE_SIZE
        // bytes (we hold the table lock, so nobody renames or resizes it); the
        // mapping is never unmapped (lives for the process).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STATE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map_file.as_raw_fd(),
                0,
            )
        };
        drop(map_file);
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: p maps STATE_SIZE bytes of a file whose layout is StateFile
        // (all-zero is valid for every field: integers, atomics and arrays).
        let map: &'static StateFile = unsafe { &*(p as *const StateFile) };
        let sh = Shared {
            file,
            map,
            dir: dir.to_path_buf(),
        };
        if fresh {
            // SAFETY: we hold the table lock and nobody else can have the new
            // file mapped yet with a valid header; writing the header fields.
            let hdr = unsafe { &mut *(std::ptr::addr_of!(map.header) as *mut Header) };
            hdr.version = VERSION;
            hdr.layout_size = STATE_SIZE as u32;
            hdr.created_unix_ns = now_unix_ns();
        }
        if let Some(want) = want {
            let ndev = map.header.ndev as usize;
            let same = ndev == want.len()
                && want.iter().enumerate().all(|(i, w)| {
                    map.devices[i].total_bytes == w.total_bytes
                        && cstr(&map.devices[i].name) == w.name
                });
            if !same {
                let live = sh.reap_locked();
                if fresh || ndev == 0 || live == 0 {
                    sh.set_devices(want);
                } else {
                    eprintln!(
                        "cgpu-sim: {} already describes other GPUs and has live processes; using its devices, not CGPU_SIM_GPUS",
                        dir.display()
                    );
                }
            }
        }
        if fresh {
            // Publish: the magic is written last.
            // SAFETY: as above, under the table lock.
            let hdr = unsafe { &mut *(std::ptr::addr_of!(map.header) as *mut Header) };
            hdr.magic = MAGIC;
        }
        drop(LockGuard {
            fd: sh.fd(),
            off: LOCK_TABLE,
            _s: std::marker::PhantomData,
        });
        Ok(sh)
    }

    fn set_devices(&self, want: &[DeviceInit]) {
        for (i, w) in want.iter().enumerate().take(MAX_DEVICES) {
            // SAFETY: called under the table lock with no live process using
            // the device records; plain fields are written before use.
            let d = unsafe { &mut *(std::ptr::addr_of!(self.map.devices[i]) as *mut DeviceRec) };
            d.total_bytes = w.total_bytes;
            put_str(&mut d.name, w.name);
            put_str(&mut d.uuid, &uuid_for(&self.dir, i));
            d.owner.store(0, SeqCst);
        }
        // SAFETY: as above.
        let hdr = unsafe { &mut *(std::ptr::addr_of!(self.map.header) as *mut Header) };
        hdr.ndev = want.len().min(MAX_DEVICES) as u32;
    }

    pub fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
    pub fn map(&self) -> &'static StateFile {
        self.map
    }
    pub fn ndev(&self) -> usize {
        (self.map.header.ndev as usize).min(MAX_DEVICES)
    }
    pub fn nslots(&self) -> usize {
        (self.map.header.nslots.load(Acquire) as usize).min(MAX_SLOTS)
    }
    pub fn dev(&self, d: usize) -> &'static DeviceRec {
        &self.map.devices[d]
    }
    pub fn slot(&self, s: usize) -> &'static SlotRec {
        &self.map.slots[s]
    }
    pub fn dev_name(&self, d: usize) -> String {
        cstr(&self.map.devices[d].name)
    }
    pub fn dev_uuid(&self, d: usize) -> String {
        cstr(&self.map.devices[d].uuid)
    }
    pub fn slot_comm(&self, s: usize) -> String {
        let c = &self.map.slots[s].comm;
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&c[0].load(Relaxed).to_ne_bytes());
        b[8..].copy_from_slice(&c[1].load(Relaxed).to_ne_bytes());
        cstr(&b)
    }

    pub fn lock_table(&self) -> LockGuard<'_> {
        let _ = ofd(self.fd(), libc::F_OFD_SETLKW, libc::F_WRLCK, LOCK_TABLE);
        LockGuard {
            fd: self.fd(),
            off: LOCK_TABLE,
            _s: std::marker::PhantomData,
        }
    }
    pub fn lock_dev(&self, d: usize) -> LockGuard<'_> {
        let off = LOCK_DEV + d as i64;
        let _ = ofd(self.fd(), libc::F_OFD_SETLKW, libc::F_WRLCK, off);
        LockGuard {
            fd: self.fd(),
            off,
            _s: std::marker::PhantomData,
        }
    }

    /// Whether some other open file description holds slot `s`'s lock byte.
    /// (Our own lock does not conflict with our own description: never ask
    /// about our own slot.)
    pub fn slot_lock_held(&self, s: usize) -> bool {
        match ofd(
            self.fd(),
            libc::F_OFD_GETLK,
            libc::F_WRLCK,
            LOCK_SLOT + s as i64,
        ) {
            Ok(fl) => fl.l_type as i32 != libc::F_UNLCK,
            Err(_) => true, // cannot tell: assume alive
        }
    }

    /// Claims a slot for this process and takes its liveness lock.
    pub fn claim_slot(&self, pid: u32, comm: &str) -> io::Result<usize> {
        let _g = self.lock_table();
        for pass in 0..2 {
            let n = self.nslots();
            // free slots first, then the oldest exited one
            let mut cand: Vec<usize> = (0..MAX_SLOTS)
                .filter(|&s| self.slot(s).state.load(Acquire) == SLOT_FREE)
                .take(1)
                .collect();
            if cand.is_empty() {
                let mut ex: Vec<usize> = (0..n)
                    .filter(|&s| self.slot(s).state.load(Acquire) == SLOT_EXITED)
                    .collect();
                ex.sort_by_key(|&s| self.slot(s).end_unix_ns.load(Relaxed));
                cand = ex;
            }
            for s in cand {
                if ofd(
                    self.fd(),
                    libc::F_OFD_SETLK,
                    libc::F_WRLCK,
                    LOCK_SLOT + s as i64,
                )
                .is_err()
                {
                    continue;
                }
                let r = self.slot(s);
                for d in 0..MAX_DEVICES {
                    r.mem[d].store(0, Relaxed);
                    r.time_ns[d].store(0, Relaxed);
                    r.kernels[d].store(0, Relaxed);
                    r.want[d].store(0, Relaxed);
                    r.ckpt_mem[d].store(0, Relaxed);
                }
                r.ckpt.store(0, Relaxed);
                r.dev_mask.store(0, Relaxed);
                r.ctx_mask.store(0, Relaxed);
                r.pid.store(pid, Relaxed);
                let mut b = [0u8; 16];
                let n = comm.len().min(15);
                b[..n].copy_from_slice(&comm.as_bytes()[..n]);
                r.comm[0].store(
                    u64::from_ne_bytes(b[..8].try_into().unwrap_or_default()),
                    Relaxed,
                );
                r.comm[1].store(
                    u64::from_ne_bytes(b[8..].try_into().unwrap_or_default()),
                    Relaxed,
                );
                r.start_unix_ns.store(now_unix_ns(), Relaxed);
                r.end_unix_ns.store(0, Relaxed);
                r.state.store(SLOT_ALIVE, Release);
                self.map.header.nslots.fetch_max(s as u32 + 1, AcqRel);
                return Ok(s);
            }
            if pass == 0 {
                self.reap_locked();
            }
        }
        Err(io::Error::other("no free process slot in the state file"))
    }

    /// Marks our own slot exited (at process exit): memory back, device released.
    pub fn release_own_slot(&self, s: usize) {
        self.retire(s);
        let _ = ofd(
            self.fd(),
            libc::F_OFD_SETLK,
            libc::F_UNLCK,
            LOCK_SLOT + s as i64,
        );
    }

    fn retire(&self, s: usize) {
        let r = self.slot(s);
        if r.state.swap(SLOT_EXITED, AcqRel) != SLOT_ALIVE {
            return;
        }
        r.end_unix_ns.store(now_unix_ns(), Relaxed);
        r.ctx_mask.store(0, Release);
        r.ckpt.store(0, Release);
        for d in 0..MAX_DEVICES {
            r.mem[d].store(0, Release);
            r.ckpt_mem[d].store(0, Release);
            r.want[d].store(0, Release);
            let dev = self.dev(d);
            if dev
                .owner
                .compare_exchange(s as u32 + 1, 0, AcqRel, Acquire)
                .is_ok()
            {
                dev.seq.fetch_add(1, AcqRel);
                futex_wake(&dev.seq);
            }
        }
    }

    /// Reaps dead processes (caller holds the table lock or does not care
    /// about races with claims: reaping is idempotent). Returns live count.
    fn reap_locked(&self) -> usize {
        let mut live = 0;
        for s in 0..self.nslots() {
            if self.slot(s).state.load(Acquire) == SLOT_ALIVE {
                if self.slot_lock_held(s) || Some(s) == own_slot_hint() {
                    live += 1;
                } else {
                    self.retire(s);
                }
            }
        }
        live
    }

    /// Reaps dead processes; `except` (and our own slot, whose lock our own
    /// probe cannot see) are never checked.
    pub fn reap(&self, except: Option<usize>) -> usize {
        let mut live = 0;
        for s in 0..self.nslots() {
            if self.slot(s).state.load(Acquire) == SLOT_ALIVE {
                if Some(s) == except || Some(s) == own_slot_hint() || self.slot_lock_held(s) {
                    live += 1;
                } else {
                    self.retire(s);
                }
            }
        }
        live
    }

    /// Bytes held on device `d` by live slots.
    pub fn used(&self, d: usize) -> u64 {
        (0..self.nslots())
            .filter(|&s| self.slot(s).state.load(Acquire) == SLOT_ALIVE)
            .map(|s| self.slot(s).mem[d].load(Acquire))
            .sum()
    }

    /// Charges `bytes` on device `d` to slot `s` if it fits. Reaps dead
    /// processes before failing.
    pub fn try_charge(&self, s: usize, d: usize, bytes: u64) -> bool {
        let _g = self.lock_dev(d);
        let total = self.dev(d).total_bytes;
        for pass in 0..2 {
            let used = self.used(d);
            if used.checked_add(bytes).is_some_and(|u| u <= total) {
                self.slot(s).mem[d].fetch_add(bytes, AcqRel);
                return true;
            }
            if pass == 0 {
                self.reap(Some(s));
            }
        }
        false
    }

    pub fn uncharge(&self, s: usize, d: usize, bytes: u64) {
        let m = &self.slot(s).mem[d];
        let _ = m.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(bytes)));
    }
}

static OWN_SLOT: AtomicU32 = AtomicU32::new(u32::MAX);
/// Records our own slot so reaping never checks it through our own lock.
pub fn set_own_slot_hint(s: usize) {
    OWN_SLOT.store(s as u32, Relaxed);
}
fn own_slot_hint() -> Option<usize> {
    let v = OWN_SLOT.load(Relaxed);
    (v != u32::MAX).then_some(v as usize)
}

/// FUTEX_WAIT on a shared word with a timeout.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as _,
        tv_nsec: (timeout_ns % 1_000_000_000) as _,
    };
    // SAFETY: word is a valid aligned u32 in a shared mapping; ts is valid.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: word is a valid aligned u32; waking has no memory effects.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}
