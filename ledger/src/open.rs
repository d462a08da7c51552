//! Opening a GPU's ledger, its paths and generations, and the slot table's lock.

use super::*;

impl Ledger {
    /// `CGPU_LEDGER_DIR` when set, else [`DEFAULT_DIR`]: the same choice
    /// for every process of every uid, so that the processes of a
    /// container never keep their books in two places. Whether the
    /// directory can be used is decided when a ledger is opened
    /// ([`Ledger::open_or_create`]): a relative path, a path that is not a
    /// directory, a directory that is not writable, or a default directory
    /// that is a symbolic link or owned by another user is an error there,
    /// for everyone, and allocations are refused until it is fixed.
    pub fn default_dir() -> PathBuf {
        match std::env::var_os("CGPU_LEDGER_DIR").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => PathBuf::from(DEFAULT_DIR),
        }
    }
    /// `<dir>/<uuid>.ledger`: the name of a GPU's first ledger generation.
    pub fn path_for(dir: &Path, uuid: &str) -> PathBuf {
        file::generation_path(dir, uuid, 0)
    }
    /// The GPU's live ledger in `dir`: its highest generation
    /// (`<uuid>.ledger`, then `<uuid>.g<n>.ledger` for each rebuild),
    /// whether or not it exists yet.
    pub fn live_path(dir: &Path, uuid: &str) -> PathBuf {
        file::generation_path(dir, uuid, file::live_generation(dir, uuid).unwrap_or(0))
    }
    /// The live ledger file of each GPU in `dir`, sorted: regular files
    /// only (symbolic links, FIFOs and device nodes named `*.ledger` are
    /// skipped, never followed or opened), and of each GPU only its highest
    /// generation (older ones are damaged files kept where they could not
    /// be removed).
    ///
    /// A default directory that is not trusted (a symbolic link, or owned
    /// by another user) lists nothing.
    pub fn list(dir: &Path) -> Vec<PathBuf> {
        if DEFAULT_DIRS.iter().any(|d| Path::new(d) == dir) && file::trusted_dir(dir).is_err() {
            return Vec::new();
        }
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut live: std::collections::BTreeMap<String, u64> = Default::default();
        for e in rd.filter_map(|e| e.ok()) {
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let n = e.file_name();
            if let Some((uuid, g)) = file::parse_name(&n.to_string_lossy()) {
                let cur = live.entry(uuid).or_insert(g);
                *cur = (*cur).max(g);
            }
        }
        live.into_iter()
            .map(|(uuid, g)| file::generation_path(dir, &uuid, g))
            .collect()
    }
    /// Open the GPU's ledger, creating and initialising it if absent.
    pub fn open_or_create(
        dir: &Path,
        uuid: &str,
        gpu_index: u32,
        physical_total: u64,
    ) -> Result<Ledger, LedgerError> {
        file::open_or_create(dir, uuid, gpu_index, physical_total, None, SHARED_MODE)
    }
    /// [`Ledger::open_or_create`], creating the file (and any later
    /// generation) with permissions `mode`: [`SHARED_MODE`] for the
    /// cooperative mode, [`AGENT_MODE`] for a ledger only its owner (the
    /// node agent) writes. An existing file keeps its permissions.
    pub fn open_or_create_mode(
        dir: &Path,
        uuid: &str,
        gpu_index: u32,
        physical_total: u64,
        mode: u32,
    ) -> Result<Ledger, LedgerError> {
        file::open_or_create(dir, uuid, gpu_index, physical_total, None, mode)
    }
    /// The private lock file of the ledger at `path`. When it exists, every
    /// handle that opens the ledger for writing takes its table and
    /// liveness locks there instead of on the ledger: the node agent makes
    /// it (root's, mode 0600) beside each ledger it owns, so that processes
    /// that may only read a ledger cannot lock what the agent locks.
    pub fn lock_file_path(path: &Path) -> PathBuf {
        file::lock_path(path)
    }
    /// Open an existing ledger for reading and knob writes (tools). Validates
    /// magic, version and size; never creates, never joins.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        file::open(path)
    }
    /// Open an existing ledger read-only (`O_RDONLY`, mapped `PROT_READ`):
    /// it can be read, never written, locked or joined.
    pub fn open_read_only(path: &Path) -> Result<Ledger, LedgerError> {
        file::open_read_only(path)
    }
    /// Open an existing ledger to read it, as a tool does: with
    /// [`Ledger::open`] where this process may write the file, else (a
    /// secure-mode ledger, which only the node agent writes) with
    /// [`Ledger::open_read_only`].
    pub fn open_for_reading(path: &Path) -> Result<Ledger, LedgerError> {
        match Ledger::open(path) {
            Err(LedgerError::Io { err, .. })
                if err.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                Ledger::open_read_only(path)
            }
            r => r,
        }
    }
    /// Opened read-only ([`Ledger::open_read_only`]): it neither writes nor
    /// holds locks, and it cannot see the locks through which the node
    /// agent keeps its processes' liveness (in its private lock file). In
    /// secure mode only the agent writes the slots, and it frees a
    /// process's slot as soon as its connection closes, so a reader of such
    /// a ledger takes a live slot's state as the truth.
    pub fn is_read_only(&self) -> bool {
        self.fd.load(Ordering::Acquire) < 0 && self.probe_fd.load(Ordering::Acquire) >= 0
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn file(&self) -> &LedgerFile {
        // SAFETY: the mapping is valid, aligned (page) and of the right size
        // for as long as `self` lives; shared mutation goes through atomics.
        unsafe { self.map.as_ref() }
    }
    /// The GPU UUID recorded in the header.
    pub fn uuid(&self) -> String {
        self.file().header.uuid_str()
    }
    pub(crate) fn fd(&self) -> Result<i32, LedgerError> {
        match self.fd.load(Ordering::Acquire) {
            fd if fd >= 0 && !self.stale.load(Ordering::Acquire) => Ok(fd),
            _ => Err(LedgerError::io(
                &self.path,
                std::io::Error::other("ledger handle inherited across fork: re-open and re-join"),
            )),
        }
    }

    pub(crate) fn lock_table(&self) -> Result<TableGuard<'_>, LedgerError> {
        self.lock_table_within(lock::TABLE_LOCK_TIMEOUT)
    }

    /// Take the table lock, waiting at most `wait` (zero: one attempt).
    /// `Err` with `ErrorKind::TimedOut` ([`LedgerError::is_busy`]) when a
    /// live process (perhaps a stopped one) holds it all that time.
    pub(crate) fn lock_table_within(&self, wait: Duration) -> Result<TableGuard<'_>, LedgerError> {
        let fd = self.fd()?;
        let t0 = std::time::Instant::now();
        let busy = |what: &str| {
            LedgerError::io(
                &self.path,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the slot-table lock is held by {what} (waited {} ms)",
                        wait.as_millis()
                    ),
                ),
            )
        };
        let inner = if wait.is_zero() {
            self.table.try_lock()
        } else {
            self.table.try_lock_for(wait)
        }
        .ok_or_else(|| busy("another thread of this process"))?;
        let left = wait.saturating_sub(t0.elapsed());
        match lock::lock_timeout(fd, TABLE_LOCK.0, TABLE_LOCK.1, left) {
            Ok(()) => Ok(TableGuard { fd, _inner: inner }),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(busy(
                "another process that is not making progress (stopped, paused or swapped out?)",
            )),
            Err(e) => Err(LedgerError::io(&self.path, e)),
        }
    }

    /// One attempt, no waiting: for paths that must not block.
    pub(crate) fn try_lock_table(&self) -> Option<TableGuard<'_>> {
        let fd = self.fd().ok()?;
        let inner = self.table.try_lock()?;
        match lock::try_lock(fd, TABLE_LOCK.0, TABLE_LOCK.1) {
            Ok(true) => Some(TableGuard { fd, _inner: inner }),
            _ => None,
        }
    }
}
