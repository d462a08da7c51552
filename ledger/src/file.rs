//! Creating, validating and mapping ledger files.
//!
//! Creation is race-free across processes: a new file is built and fully
//! initialised under a private temporary name, then `link`ed into place
//! (which fails if another process got there first; we then use theirs). So
//! a file at the final name is always complete, and `ready` is set before it
//! gets that name.
//!
//! A damaged file is never renamed or removed to make room (in a sticky
//! directory only its owner could): the next **generation** is built
//! beside it instead. A GPU's ledgers are `<uuid>.ledger` (generation 0)
//! and `<uuid>.g<n>.ledger`; the live one is the highest generation, and
//! every process and tool looks for it the same way. The damaged
//! generation is kept for a post-mortem; older ones are removed where the
//! directory allows it (else left, and ignored).

use super::*;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

const SIZE: usize = std::mem::size_of::<LedgerFile>();

fn cpath(path: &Path) -> Result<CString, LedgerError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        LedgerError::io(
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"),
        )
    })
}

/// Can ledgers be kept in `dir`? An absolute path to an existing directory
/// that this process can write (never created here: the host makes it,
/// `deploy/host/cgpu.tmpfiles.conf`, and mounts it into containers; made
/// by a job, it would be a directory only that container sees); a default directory must also
/// be trusted ([`trusted_dir`]). Each failure names what is wrong.
pub(super) fn usable_dir(dir: &Path) -> Result<(), LedgerError> {
    let err = |kind: io::ErrorKind, os: Option<i32>, why: String| {
        let e = match os {
            Some(code) => {
                let base = io::Error::from_raw_os_error(code);
                io::Error::new(base.kind(), format!("{why} ({base})"))
            }
            None => io::Error::new(kind, why),
        };
        LedgerError::io(dir, e)
    };
    if !dir.is_absolute() {
        return Err(err(
            io::ErrorKind::InvalidInput,
            None,
            format!(
                "CGPU_LEDGER_DIR='{}' is a relative path (it would name another directory in each working directory)",
                dir.display()
            ),
        ));
    }
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(err(
                io::ErrorKind::NotADirectory,
                Some(libc::ENOTDIR),
                "not a directory".into(),
            ));
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(err(
                io::ErrorKind::NotFound,
                Some(libc::ENOENT),
                "missing (the host creates it; cgpu never does)".into(),
            ));
        }
        Err(e) => return Err(LedgerError::io(dir, e)),
    }
    if DEFAULT_DIRS.iter().any(|d| Path::new(d) == dir) {
        trusted_dir(dir).map_err(|e| LedgerError::io(dir, e))?;
    }
    if !writable(dir) {
        let e = io::Error::last_os_error();
        let code = e.raw_os_error().unwrap_or(libc::EACCES);
        let why = if code == libc::EROFS {
            "on a read-only filesystem"
        } else {
            "not writable by this process"
        };
        return Err(err(io::ErrorKind::PermissionDenied, Some(code), why.into()));
    }
    Ok(())
}

/// The file name of `uuid`'s ledger generation `g`.
pub(super) fn generation_path(dir: &Path, uuid: &str, g: u64) -> PathBuf {
    if g == 0 {
        dir.join(format!("{uuid}.ledger"))
    } else {
        dir.join(format!("{uuid}.g{g}.ledger"))
    }
}

/// `(uuid, generation)` of a ledger file name; `None` for other names
/// (hidden temporary files included).
pub(super) fn parse_name(name: &str) -> Option<(String, u64)> {
    if name.starts_with('.') {
        return None;
    }
    let stem = name.strip_suffix(".ledger")?;
    if let Some((uuid, g)) = stem.rsplit_once(".g") {
        if !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()) && !uuid.is_empty() {
            return g
                .parse()
                .ok()
                .filter(|g| *g > 0)
                .map(|g| (uuid.to_string(), g));
        }
    }
    (!stem.is_empty()).then(|| (stem.to_string(), 0))
}

/// The highest generation of `uuid`'s ledger present in `dir` as a regular
/// file (`None`: none).
pub(super) fn live_generation(dir: &Path, uuid: &str) -> Option<u64> {
    let rd = std::fs::read_dir(dir).ok()?;
    rd.filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| parse_name(&e.file_name().to_string_lossy()))
        .filter(|(u, _)| u == uuid)
        .map(|(_, g)| g)
        .max()
}

/// May a default ledger directory be trusted? It must be a real directory
/// (a symbolic link is never followed: whoever made it chooses where
/// root's ledgers go) owned by root or by this user (a directory owned by
/// someone else lets them swap the files in it).
pub(super) fn trusted_dir(dir: &Path) -> io::Result<()> {
    let m = std::fs::symlink_metadata(dir)?;
    let deny = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} {why}: not trusted", dir.display()),
        ))
    };
    if m.file_type().is_symlink() {
        return deny("is a symbolic link".into());
    }
    if !m.is_dir() {
        return deny("is not a directory".into());
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != 0 && m.uid() != me {
        return deny(format!(
            "is owned by uid {}, neither root nor this user (uid {me})",
            m.uid()
        ));
    }
    Ok(())
}

pub(super) fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// Open a ledger file: never through a symbolic link (`O_NOFOLLOW`), never
/// blocking (`O_NONBLOCK`, a FIFO), and only a regular file (anything else
/// is closed again and refused; a device node is refused before it is
/// opened, unless swapped in between).
fn open_fd(path: &Path, flags: libc::c_int) -> Result<i32, LedgerError> {
    open_fd_mode(path, flags, 0o666)
}

/// [`open_fd`], creating (with `O_CREAT`) a file of permissions `mode`
/// (less the umask).
fn open_fd_mode(path: &Path, flags: libc::c_int, mode: u32) -> Result<i32, LedgerError> {
    let c = cpath(path)?;
    let not_regular = || {
        LedgerError::io(
            path,
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file (a link, FIFO or device): not opened",
            ),
        )
    };
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_file() {
            return Err(not_regular());
        }
    }
    // SAFETY: `c` is a valid NUL-terminated path; mode is used only with O_CREAT.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ELOOP) {
            return Err(not_regular());
        }
        return Err(LedgerError::io(path, err));
    }
    // SAFETY: `st` is a valid out-pointer for fstat on the fd just opened.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        close(fd);
        return Err(not_regular());
    }
    Ok(fd)
}

fn close(fd: i32) {
    // SAFETY: the caller owns `fd` and does not use it afterwards.
    unsafe { libc::close(fd) };
}

fn map_fd(path: &Path, fd: i32) -> Result<NonNull<LedgerFile>, LedgerError> {
    map_fd_prot(path, fd, libc::PROT_READ | libc::PROT_WRITE)
}

fn map_fd_prot(
    path: &Path,
    fd: i32,
    prot: libc::c_int,
) -> Result<NonNull<LedgerFile>, LedgerError> {
    // SAFETY: a fresh shared mapping of an fd we hold; the kernel picks the
    // address. The file is exactly SIZE bytes (checked or set by the caller).
    let p = unsafe { libc::mmap(std::ptr::null_mut(), SIZE, prot, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(LedgerError::io(path, io::Error::last_os_error()));
    }
    Ok(NonNull::new(p.cast()).expect("mmap never returns NULL on success"))
}

fn unmap(p: NonNull<LedgerFile>) {
    // SAFETY: `p` came from `map_fd` with length SIZE and is not used after.
    unsafe { libc::munmap(p.as_ptr().cast(), SIZE) };
}

/// Check the first bytes and the size of an open ledger file, before
/// mapping it. Version is checked before size: another version may have
/// another size.
fn validate_fd(path: &Path, fd: i32) -> Result<(), LedgerError> {
    let corrupt = |why: String| LedgerError::Corrupt {
        path: path.to_owned(),
        why,
    };
    // SAFETY: `st` is a valid out-pointer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(LedgerError::io(path, io::Error::last_os_error()));
    }
    let len = st.st_size as u64;
    let mut head = [0u8; 24];
    // SAFETY: `head` is a valid buffer of its length.
    let n = unsafe { libc::pread(fd, head.as_mut_ptr().cast(), head.len(), 0) };
    if n < 0 {
        return Err(LedgerError::io(path, io::Error::last_os_error()));
    }
    if (n as usize) < head.len() {
        return Err(corrupt(format!("only {len} bytes long")));
    }
    let magic = u64::from_le_bytes(head[0..8].try_into().unwrap());
    let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
    let header_size = u32::from_le_bytes(head[12..16].try_into().unwrap());
    let file_size = u64::from_le_bytes(head[16..24].try_into().unwrap());
    if magic != LEDGER_MAGIC {
        return Err(corrupt(format!("bad magic {magic:#018x}")));
    }
    if version != FORMAT_VERSION {
        return Err(LedgerError::Version {
            path: path.to_owned(),
            found: version,
        });
    }
    if header_size as usize != std::mem::size_of::<LedgerHeader>() {
        return Err(corrupt(format!(
            "header_size {header_size}, expected {}",
            std::mem::size_of::<LedgerHeader>()
        )));
    }
    if file_size != SIZE as u64 || len != SIZE as u64 {
        return Err(corrupt(format!(
            "size {len} (header says {file_size}), expected {SIZE}"
        )));
    }
    Ok(())
}

/// Give every byte of the file its space on the filesystem, so that no
/// later write to the mapping can fault with SIGBUS on a full filesystem.
/// Nothing to do when the file has no holes. `fallocate(2)` itself (never
/// glibc's emulation, which writes bytes and could race with processes
/// using the file); where the filesystem cannot, a `fresh` (still private)
/// file is filled with zeros instead, and a file in use is left as it is.
/// A failure (`ENOSPC`) makes the ledger unusable, with the reason.
fn reserve_space(path: &Path, fd: i32, fresh: bool) -> Result<(), LedgerError> {
    let no_space = |err: io::Error| {
        LedgerError::io(
            path,
            io::Error::new(
                err.kind(),
                format!(
                    "cannot reserve {SIZE} bytes for the ledger ({err}); is the filesystem full?"
                ),
            ),
        )
    };
    // SAFETY: `st` is a valid out-pointer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on a descriptor we hold.
    if unsafe { libc::fstat(fd, &mut st) } == 0 && (st.st_blocks as u64) * 512 >= SIZE as u64 {
        return Ok(());
    }
    // SAFETY: plain syscall on a descriptor we hold; mode 0 only allocates
    // (and extends the size when shorter), it never changes contents.
    if unsafe { libc::fallocate(fd, 0, 0, SIZE as libc::off_t) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(no_space(err));
    }
    if !fresh {
        return Ok(());
    }
    let zeros = [0u8; 4096];
    let mut off = 0usize;
    while off < SIZE {
        let n = zeros.len().min(SIZE - off);
        // SAFETY: `zeros` is valid for `n` bytes; the file is private to us.
        let w = unsafe { libc::pwrite(fd, zeros.as_ptr().cast(), n, off as libc::off_t) };
        if w <= 0 {
            return Err(no_space(io::Error::last_os_error()));
        }
        off += w as usize;
    }
    Ok(())
}

/// Open and validate an existing ledger (no create).
pub(super) fn open(path: &Path) -> Result<Ledger, LedgerError> {
    let fd = open_fd(path, libc::O_RDWR)?;
    let probe = match open_fd(path, libc::O_RDWR) {
        Ok(p) => p,
        Err(e) => {
            close(fd);
            return Err(e);
        }
    };
    let done = |e| {
        close(fd);
        close(probe);
        Err(e)
    };
    if let Err(e) = validate_fd(path, fd) {
        return done(e);
    }
    // A file made by an older build (or by hand) may have holes.
    if let Err(e) = reserve_space(path, fd, false) {
        return done(e);
    }
    // Map through the probe description, never through `fd`: a mapping
    // holds a reference to its file description, and a forked child
    // inherits the mapping; mapped through `fd`, the child would keep the
    // parent's liveness locks alive after the parent's death.
    let map = match map_fd(path, probe) {
        Ok(m) => m,
        Err(e) => return done(e),
    };
    // SAFETY: `st` is a valid out-pointer for fstat on our descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::fstat(fd, &mut st) };
    // A ledger the node agent owns keeps its locks in a private file
    // beside it: the two lock descriptors are that file's (the mapping
    // stays the ledger's).
    let (fd, probe) = match private_locks(path) {
        None => (fd, probe),
        Some(Ok(pair)) => {
            close(fd);
            close(probe);
            pair
        }
        Some(Err(e)) => {
            unmap(map);
            return done(e);
        }
    };
    handle(path, map, fd, probe, (st.st_dev, st.st_ino))
}

/// Open an existing ledger for reading only: `O_RDONLY`, mapped
/// `PROT_READ` (a write through it would fault, never reach the file), no
/// table lock (its `fd` is -1, so every path that locks or writes the
/// table fails), nothing reserved or repaired. For processes that may read
/// the books but not write them (secure mode: the node agent writes them).
pub(super) fn open_read_only(path: &Path) -> Result<Ledger, LedgerError> {
    let fd = open_fd(path, libc::O_RDONLY)?;
    if let Err(e) = validate_fd(path, fd) {
        close(fd);
        return Err(e);
    }
    let map = match map_fd_prot(path, fd, libc::PROT_READ) {
        Ok(m) => m,
        Err(e) => {
            close(fd);
            return Err(e);
        }
    };
    // SAFETY: `st` is a valid out-pointer for fstat on our descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::fstat(fd, &mut st) };
    handle(path, map, -1, fd, (st.st_dev, st.st_ino))
}

/// The handle of an opened, validated and mapped ledger: `fd` holds the
/// table and liveness locks (-1: a read-only handle, which never locks),
/// `probe` probes them; `ino` is the file's (device, inode). Refuses a
/// ledger whose creator never finished it.
fn handle(
    path: &Path,
    map: NonNull<LedgerFile>,
    fd: i32,
    probe: i32,
    ino: (u64, u64),
) -> Result<Ledger, LedgerError> {
    let generation = path
        .file_name()
        .and_then(|n| parse_name(&n.to_string_lossy()))
        .map_or(0, |(_, g)| g);
    // SAFETY: the mapping is valid and of the right size (validated by the
    // caller); the uuid bytes are atomics, only loaded.
    let uuid0 = unsafe { map.as_ref() }.header.uuid_bytes();
    let l = Ledger {
        generation,
        uuid0,
        weight_try_ns: AtomicU64::new(0),
        weightless: AtomicU32::new(0),
        path: path.to_owned(),
        map,
        fd: AtomicI32::new(fd),
        probe_fd: AtomicI32::new(probe),
        table: parking_lot::Mutex::new(()),
        stale: AtomicBool::new(false),
        guard: super::guard::register(map.as_ptr() as usize, SIZE),
        ino,
    };
    if l.file().header.ready.load(Ordering::Acquire) != 1 {
        return Err(LedgerError::Corrupt {
            path: path.to_owned(),
            why: "never finished initialising (ready != 1)".into(),
        });
    }
    Ok(l)
}

/// Open `uuid`'s live ledger in `dir`, creating it if absent, or building
/// the next generation past a damaged one. `damaged`: (device, inode) of a
/// file this process had joined and saw damaged in use: whatever it now
/// claims to be (another format version included: no live file changes
/// version), it is damaged.
pub(super) fn open_or_create(
    dir: &Path,
    uuid: &str,
    gpu_index: u32,
    physical_total: u64,
    damaged: Option<(u64, u64)>,
    mode: u32,
) -> Result<Ledger, LedgerError> {
    if uuid.is_empty()
        || uuid.len() >= UUID_LEN
        || uuid.contains(['/', '\0'])
        || uuid.starts_with('.')
    {
        return Err(LedgerError::io(
            &generation_path(dir, uuid, 0),
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad GPU uuid {uuid:?}"),
            ),
        ));
    }
    usable_dir(dir)?;
    // Each round either opens the live generation, creates it, or builds
    // the next generation past a damaged one; a few rounds cover losing
    // races to other creators.
    let mut last = None;
    for _ in 0..5 {
        let g = live_generation(dir, uuid).unwrap_or(0);
        let path = generation_path(dir, uuid, g);
        let damaged = match open(&path) {
            Ok(l) if l.uuid() == uuid => match l.identity_damage_within(IDENTITY_CHECK_WAIT) {
                None => return Ok(l),
                Some(why) => LedgerError::Corrupt {
                    path: path.clone(),
                    why,
                },
            },
            Ok(l) => LedgerError::Corrupt {
                path: path.clone(),
                why: format!("holds GPU {:?}, expected {uuid:?}", l.uuid()),
            },
            Err(LedgerError::Io { err, .. }) if err.kind() == io::ErrorKind::NotFound => {
                create(dir, &path, uuid, gpu_index, physical_total, mode)?;
                continue;
            }
            Err(e @ LedgerError::Corrupt { .. }) => e,
            Err(LedgerError::Version { found, .. })
                if damaged.is_some()
                    && std::fs::metadata(&path).is_ok_and(|m| Some((m.dev(), m.ino())) == damaged) =>
            {
                LedgerError::Corrupt {
                    path: path.clone(),
                    why: format!(
                        "its version field changed to {found} while in use (damage: no live ledger changes version)"
                    ),
                }
            }
            Err(e) => return Err(e),
        };
        let next = generation_path(dir, uuid, g + 1);
        create(dir, &next, uuid, gpu_index, physical_total, mode)?;
        tracing::warn!(
            "{damaged}: built the next generation {} (processes still using the damaged one move to it, re-registering what they hold)",
            next.display()
        );
        remove_older(dir, uuid, g);
        last = Some(damaged);
    }
    Err(last.unwrap_or_else(|| {
        LedgerError::io(
            &generation_path(dir, uuid, 0),
            io::Error::other("ledger kept changing while opening it"),
        )
    }))
}

/// How long opening waits for the table lock to check the container
/// slots' identities (busy: the join checks them under the lock).
const IDENTITY_CHECK_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Does a process still hold its liveness lock in the ledger file at
/// `path` (one lock query over the whole process table)? False when the
/// file is gone or cannot be read.
pub(super) fn has_live_processes(path: &Path) -> bool {
    use std::os::unix::io::AsRawFd;
    let locks = lock_path(path);
    let at = if locks.exists() { &locks } else { path };
    let Ok(f) = std::fs::File::open(at) else {
        return false;
    };
    let start = std::mem::offset_of!(LedgerFile, processes) as u64;
    let len = std::mem::size_of::<[super::ProcessSlot; super::MAX_PROCESSES]>() as u64;
    super::lock::is_locked(f.as_raw_fd(), start, len).unwrap_or(false)
}

/// The private lock file of the ledger at `path`: `.<name>.locks` beside
/// it (never a ledger's name).
pub(super) fn lock_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.locks"))
}

/// The two lock descriptors of a ledger that has a private lock file
/// (`None`: it has none; its locks are on the ledger itself). The node
/// agent makes one (root's, 0600) for the ledgers it owns: locks on a file
/// only root can open are locks no tenant can take, whereas any reader of
/// the ledger could hold read locks on it and stall the agent.
fn private_locks(path: &Path) -> Option<Result<(i32, i32), LedgerError>> {
    let locks = lock_path(path);
    std::fs::symlink_metadata(&locks).ok()?;
    let a = match open_fd(&locks, libc::O_RDWR) {
        Ok(a) => a,
        Err(e) => return Some(Err(e)),
    };
    Some(match open_fd(&locks, libc::O_RDWR) {
        Ok(b) => Ok((a, b)),
        Err(e) => {
            close(a);
            Err(e)
        }
    })
}

/// Remove `uuid`'s generations older than `keep` where the directory
/// allows it (a sticky directory keeps other users' files: they stay, and
/// are ignored).
fn remove_older(dir: &Path, uuid: &str, keep: u64) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        if let Some((u, g)) = parse_name(&e.file_name().to_string_lossy()) {
            if u == uuid && g < keep {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Build a complete ledger of permissions `mode` under a temporary name
/// and link it into place. `Ok` also when another process created it first.
fn create(
    dir: &Path,
    path: &Path,
    uuid: &str,
    gpu_index: u32,
    physical_total: u64,
    mode: u32,
) -> Result<(), LedgerError> {
    let tmp = dir.join(format!(
        ".{uuid}.ledger.tmp-{}-{}",
        std::process::id(),
        realtime_ns()
    ));
    // Created for its owner alone, then given its mode: whoever the mode
    // leaves out never opens it for writing, not even under its
    // temporary name.
    let fd = open_fd_mode(&tmp, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600)?;
    let result = (|| {
        // SAFETY: plain syscalls on the fd we just created.
        unsafe {
            // `mode` exactly, whatever the umask.
            libc::fchmod(fd, mode as libc::mode_t);
        }
        // Every page is given its space now: a file with holes would get
        // SIGBUS on the first write to a hole once the filesystem is full.
        reserve_space(path, fd, true)?;
        let map = map_fd(&tmp, fd)?;
        // SAFETY: the file is private to us until linked; the fresh pages are
        // zero, which is a valid value of every field.
        unsafe { init(map.as_ptr(), uuid, gpu_index, physical_total) };
        unmap(map);
        let pause = TEST_CREATE_PAUSE_MS.load(Ordering::Relaxed);
        if pause > 0 {
            std::thread::sleep(Duration::from_millis(pause));
        }
        let (ct, cp) = (cpath(&tmp)?, cpath(path)?);
        // SAFETY: both are valid NUL-terminated paths.
        if unsafe { libc::link(ct.as_ptr(), cp.as_ptr()) } != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EEXIST) {
                return Err(LedgerError::io(path, err));
            }
            TEST_CREATE_LOST.fetch_add(1, Ordering::Relaxed);
        } else {
            tracing::info!("created ledger {} for GPU {uuid}", path.display());
        }
        Ok(())
    })();
    close(fd);
    let _ = std::fs::remove_file(&tmp);
    result
}

/// # Safety
/// `f` points to a writable, zeroed mapping of a whole `LedgerFile` that no
/// other process can see yet.
unsafe fn init(f: *mut LedgerFile, uuid: &str, gpu_index: u32, physical_total: u64) {
    // SAFETY: per the contract, `f` is valid and exclusively ours.
    let h = unsafe { &mut (*f).header };
    h.magic = LEDGER_MAGIC;
    h.version = FORMAT_VERSION;
    h.header_size = std::mem::size_of::<LedgerHeader>() as u32;
    h.file_size = SIZE as u64;
    h.gpu_index = gpu_index;
    h.set_uuid(uuid);
    h.physical_total = physical_total;
    h.created_ns = realtime_ns();
    h.policy.store(DEFAULT_POLICY, Ordering::Relaxed);
    h.max_inst.store(DEFAULT_MAX_INST, Ordering::Relaxed);
    h.prio_ratio.store(DEFAULT_PRIO_RATIO, Ordering::Relaxed);
    h.additions.store(ADDITIONS, Ordering::Relaxed);
    h.ready.store(1, Ordering::Release);
}

/// (pid, pid-namespace inode, start time in clock ticks since boot) of this
/// process, for display. 0 where /proc does not tell.
pub(super) fn self_identity() -> (i32, u64, u64) {
    let pid = std::process::id() as i32;
    let pidns = std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            let s = l.to_string_lossy().into_owned();
            s.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
        })
        .unwrap_or(0);
    // Field 22 of /proc/self/stat; fields are counted after the `)` that
    // ends the command name (which may itself contain spaces).
    let start = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().nth(19)?.parse().ok()
        })
        .unwrap_or(0);
    (pid, pidns, start)
}
