//! Damage: checking the header and the slots' identities, retiring a damaged or
//! replaced generation.

use super::*;

impl Ledger {
    /// Can this mapping still be trusted? False once another process
    /// truncated the file under it (the access faulted and the SIGBUS guard
    /// put anonymous memory in its place), or wiped or overwrote its header.
    #[inline]
    pub fn is_damaged(&self) -> bool {
        if guard::is_damaged(self.guard) {
            return true;
        }
        let h = &self.file().header;
        // Volatile loads: another process may rewrite them.
        let (magic, version, header_size, file_size) = (
            h.read_magic(),
            h.read_version(),
            h.read_header_size(),
            h.read_file_size(),
        );
        magic != LEDGER_MAGIC
            || version != FORMAT_VERSION
            || header_size as usize != std::mem::size_of::<LedgerHeader>()
            || file_size as usize != std::mem::size_of::<LedgerFile>()
            || h.ready.load(Ordering::Acquire) != 1
    }

    /// A live container slot whose identity fails its check
    /// ([`ContainerSlot::id_intact`]): why, for the error. Under the table
    /// lock (claims are made under it, so no slot is seen half-written).
    pub(crate) fn identity_damage(&self) -> Option<String> {
        let f = self.file();
        // A live process (dead ones are reaped first) always belongs to a
        // live container: otherwise a container's state was damaged, and
        // its processes' bytes would be missing from a fresh slot's books.
        let orphan = f.processes.iter().enumerate().find_map(|(i, p)| {
            if p.state.load(Ordering::Acquire) != SLOT_LIVE {
                return None;
            }
            let c = p.container.load(Ordering::Acquire) as usize;
            let live = f
                .containers
                .get(c)
                .is_some_and(|s| s.state.load(Ordering::Acquire) == SLOT_LIVE);
            (!live).then(|| {
                format!("live process slot {i} belongs to container slot {c}, which is not live (damaged)")
            })
        });
        if orphan.is_some() {
            return orphan;
        }
        // A process holding its liveness lock on a slot that does not say
        // LIVE: that slot's state was damaged (its bytes would be reaped
        // from the books while it holds them).
        let mut unlisted = None;
        self.locked_slots(0, MAX_PROCESSES, &mut |i| {
            if f.processes[i].state.load(Ordering::Acquire) != SLOT_LIVE {
                unlisted = Some(format!(
                    "process slot {i} is held by a live process but is not marked live (damaged)"
                ));
            }
            unlisted.is_none()
        });
        if unlisted.is_some() {
            return unlisted;
        }
        f.containers.iter().enumerate().find_map(|(i, c)| {
            (c.state.load(Ordering::Acquire) == SLOT_LIVE && c.id_intact() == Some(false)).then(
                || {
                    format!(
                        "container slot {i} ({:?}): its id or key does not match its id_sum (damaged)",
                        c.id_str()
                    )
                },
            )
        })
    }

    /// Calls `each` with every process slot in `[lo, hi)` whose liveness
    /// lock a process holds (our own included: probed through `probe_fd`),
    /// until it returns false. One lock query per held slot and per gap
    /// between them, not one per slot.
    pub(crate) fn locked_slots(
        &self,
        lo: usize,
        hi: usize,
        each: &mut dyn FnMut(usize) -> bool,
    ) -> bool {
        let fd = self.probe_fd.load(Ordering::Acquire);
        if lo >= hi || fd < 0 {
            return true;
        }
        let size = std::mem::size_of::<ProcessSlot>() as u64;
        let start = process_slot_offset(lo);
        let Ok(Some((s, len))) = lock::held_lock(fd, start, (hi - lo) as u64 * size) else {
            return true;
        };
        let base = process_slot_offset(0);
        let first = (s.max(start) - base) / size;
        let end = if len == 0 {
            hi as u64
        } else {
            (s + len - base).div_ceil(size)
        };
        let (first, end) = (first as usize, (end as usize).clamp(first as usize + 1, hi));
        self.locked_slots(lo, first, each)
            && (first..end).all(&mut *each)
            && self.locked_slots(end, hi, each)
    }

    /// [`Ledger::identity_damage`], taking the table lock for at most
    /// `wait` (`None` also when it could not be taken: the join checks
    /// again under the lock).
    pub(crate) fn identity_damage_within(&self, wait: Duration) -> Option<String> {
        let _g = self.lock_table_within(wait).ok()?;
        self.reap_locked();
        self.identity_damage()
    }

    /// A new generation is joined only once the processes still mapped to
    /// the damaged one it replaced have moved (each leaves it within one
    /// watcher period and re-registers what it holds here): joined before,
    /// a newcomer would see books without their bytes. Waited for at most
    /// [`SETTLE_LIMIT`] after the generation was built (a stopped process
    /// does not hold newcomers back for longer). `Err` ([`LedgerError::is_busy`]):
    /// refuse, and try again later.
    pub(crate) fn previous_generation_settled(&self) -> Result<(), LedgerError> {
        if self.generation == 0 {
            return Ok(());
        }
        let created = self.file().header.read_created_ns();
        if realtime_ns().saturating_sub(created) > SETTLE_LIMIT.as_nanos() as u64 {
            return Ok(());
        }
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        let Some((uuid, _)) = file::parse_name(&name) else {
            return Ok(());
        };
        let prev = file::generation_path(dir, &uuid, self.generation - 1);
        if !file::has_live_processes(&prev) {
            return Ok(());
        }
        Err(LedgerError::io(
            &self.path,
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "was just built past the damaged {}, whose processes have not all moved here yet",
                    prev.display()
                ),
            ),
        ))
    }

    /// Are the header's identity fields as they were when this handle was
    /// opened (the GPU's uuid), besides [`Ledger::is_damaged`]'s checks?
    /// For the allocation path and the watcher (it reads the uuid's bytes).
    pub fn header_intact(&self) -> bool {
        !self.is_damaged() && self.file().header.uuid_bytes() == self.uuid0
    }

    /// Stop referring to the file at all (after [`Ledger::abandon`], when
    /// the handle is replaced by another): its mapping is swapped, in
    /// place, for private zeroed memory (every pointer into it stays valid
    /// and reads a damaged ledger), and its SIGBUS guard slot is freed for
    /// the live mapping. A handle that is dropped instead is unmapped.
    pub fn retire(&self) {
        // SAFETY: `[map, map + size)` is our own mapping; replacing it in
        // place keeps every reference into it valid (zeroed memory is a
        // valid value of every field). It is never unmapped while
        // references may exist (retired handles are never dropped).
        let p = unsafe {
            libc::mmap(
                self.map.as_ptr().cast(),
                std::mem::size_of::<LedgerFile>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == self.map.as_ptr().cast() {
            guard::unregister(self.guard);
        }
    }

    /// Can this handle still be used for shared state (scheduling)? False
    /// once damaged, abandoned (its file was replaced: the process moved to
    /// another ledger) or inherited across `fork`.
    #[inline]
    pub fn is_usable(&self) -> bool {
        !self.is_stale() && !self.is_damaged()
    }

    /// Is `m` still this process's place here (slots live, as joined)?
    #[inline]
    pub fn membership_intact(&self, m: &Membership) -> bool {
        let f = self.file();
        let (Some(p), Some(c)) = (f.processes.get(m.process), f.containers.get(m.container)) else {
            return false;
        };
        p.state.load(Ordering::Acquire) == SLOT_LIVE
            && p.container.load(Ordering::Acquire) as usize == m.container
            && c.state.load(Ordering::Acquire) == SLOT_LIVE
    }

    /// Does the ledger's path now name another file (deleted, or replaced
    /// by another file), so that new processes no longer see this one?
    /// Two `stat`s: for a periodic check, not the hot path.
    pub fn is_replaced(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.ino => {}
            _ => return true,
        }
        // A newer generation was built (this one was found damaged).
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        let Some((uuid, _)) = file::parse_name(&name) else {
            return false;
        };
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        file::generation_path(dir, &uuid, self.generation + 1).exists()
    }

    /// Stop using this handle because its file is damaged or replaced:
    /// close both descriptors, which drops this process's locks on it (so
    /// that a damaged file can be set aside and rebuilt). The mapping stays
    /// (other threads may still be reading it); later reserve/release on it
    /// do nothing harmful, `join` fails.
    pub fn abandon(&self) {
        self.stale.store(true, Ordering::Release);
        for fd in [&self.fd, &self.probe_fd] {
            let fd = fd.swap(-1, Ordering::AcqRel);
            if fd >= 0 {
                // SAFETY: we own this descriptor and nobody uses it after
                // the swap.
                unsafe { libc::close(fd) };
            }
        }
    }

    /// `Err` when the file requires an addition this build does not know
    /// ([`LedgerHeader::required`]): its books cannot be kept right here.
    pub fn check_required(&self) -> Result<(), LedgerError> {
        let req = self.file().header.required.load(Ordering::Acquire);
        let unknown = req & !ADDITIONS;
        if unknown == 0 {
            return Ok(());
        }
        Err(LedgerError::io(
            &self.path,
            std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!(
                    "written by a newer cgpu that requires format additions {unknown:#x} this version does not know; upgrade libcgpu.so to share it"
                ),
            ),
        ))
    }
}
