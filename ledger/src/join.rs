//! Joining a container (claiming its slot and a process slot) and leaving it.

use super::*;

impl Ledger {
    /// Claim (or find, by id) the container slot and a process slot; take the
    /// liveness lock. Reaps dead slots first. Waits at most 2 s for the
    /// table lock (see [`Ledger::join_within`]).
    pub fn join(&self, req: &JoinRequest<'_>) -> Result<Membership, LedgerError> {
        self.join_within(req, lock::TABLE_LOCK_TIMEOUT)
    }

    /// [`Ledger::join`], waiting at most `wait` for the table lock (zero:
    /// one attempt). A lock still held after that is
    /// [`LedgerError::is_busy`]: the caller must not allocate unaccounted
    /// (refuse, and try again later).
    pub fn join_within(
        &self,
        req: &JoinRequest<'_>,
        wait: Duration,
    ) -> Result<Membership, LedgerError> {
        let id = req.container_id;
        if id.is_empty() || id.len() > ID_LEN || id.contains('\0') {
            return Err(LedgerError::io(
                &self.path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("container id {id:?} must be 1..={ID_LEN} bytes without NUL"),
                ),
            ));
        }
        let fd = self.fd()?;
        self.check_required()?;
        self.previous_generation_settled()?;
        let key = req.key();
        let _g = self.lock_table_within(wait)?;
        self.reap_locked();
        if let Some(why) = self.identity_damage() {
            return Err(LedgerError::Corrupt {
                path: self.path.clone(),
                why,
            });
        }
        let f = self.file();

        let (c, created) = match f.containers.iter().position(|c| c.is_container(key, id)) {
            Some(c) => {
                if let Some(diff) = settings_differ(&f.containers[c], req) {
                    tracing::warn!(
                        "container {} already runs on GPU {} with {}; this process asked for {}: it gets the container's settings (the first process's; change them with cgpuctl set)",
                        f.containers[c].id_str(),
                        f.header.uuid_str(),
                        diff.0,
                        diff.1
                    );
                }
                (c, false)
            }
            None => (self.claim_container(req)?, true),
        };

        let Some(p) = self.claim_process(fd, c) else {
            if created {
                self.free_container(c);
            }
            return Err(LedgerError::Full {
                path: self.path.clone(),
                what: "process",
            });
        };
        f.containers[c].nprocs.fetch_add(1, Ordering::AcqRel);
        Ok(Membership::new(c, p))
    }

    /// Under the table lock: claim a free container slot for `req`.
    pub(crate) fn claim_container(&self, req: &JoinRequest<'_>) -> Result<usize, LedgerError> {
        let f = self.file();
        let h = &f.header;
        let c = f
            .containers
            .iter()
            .position(|c| c.state.load(Ordering::Acquire) == SLOT_FREE)
            .ok_or_else(|| LedgerError::Full {
                path: self.path.clone(),
                what: "container",
            })?;
        let slot = &f.containers[c];
        slot.state.store(SLOT_CLAIMING, Ordering::Release);

        let quota = match req.quota {
            0 => h.default_memsize.load(Ordering::Relaxed),
            QUOTA_UNLIMITED => 0,
            q => q,
        };
        let fw = free_weight(f);
        let want = req.weight.max(1);
        let weight = if fw == 0 {
            self.weightless.store(c as u32 + 1, Ordering::Release);
            tracing::warn!(
                "container {}: free_weight is 0 on GPU {} (max_inst {} taken): it gets weight 0 and no compute until weight frees up",
                req.container_id,
                h.uuid_str(),
                h.max_inst.load(Ordering::Relaxed)
            );
            0
        } else if want > fw {
            let max = h.max_inst.load(Ordering::Relaxed);
            tracing::warn!(
                "container {}: asked for weight {want} on GPU {}, {}: it gets weight {fw}",
                req.container_id,
                h.uuid_str(),
                if want > max {
                    format!("more than the GPU's max_inst {max}")
                } else {
                    format!("but only {fw} of max_inst {max} is free")
                }
            );
            fw
        } else {
            want
        };

        // The slot is CLAIMING under the table lock: no other process
        // writes it, and readers only trust the id once the slot is LIVE.
        slot.set_id(req.container_id);
        let now = realtime_ns();
        slot.created_ns.store(now, Ordering::Relaxed);
        slot.key.store(req.key(), Ordering::Relaxed);
        slot.key_created.store(now, Ordering::Relaxed);
        slot.id_sum
            .store(id_sum(&slot.id_bytes(), req.key(), now), Ordering::Relaxed);
        slot.quota.store(quota, Ordering::Relaxed);
        slot.used.store(0, Ordering::Relaxed);
        slot.peak.store(0, Ordering::Relaxed);
        slot.weight.store(weight, Ordering::Relaxed);
        slot.nprocs.store(0, Ordering::Relaxed);
        slot.oom_count.store(0, Ordering::Relaxed);
        slot.suspect.store(0, Ordering::Relaxed);
        slot.recounts.store(0, Ordering::Relaxed);
        slot.highprio.store(req.highprio as u32, Ordering::Relaxed);
        slot.enforce_off
            .store(req.enforce_off as u32, Ordering::Relaxed);
        for w in &slot.sched {
            w.store(0, Ordering::Relaxed);
        }
        // The requested weight counts, even if clamped (`ALIYUN_COM_GPU_SCHD_WEIGHT`, README).
        self.weight_switches_policy(req.weight);
        slot.state.store(SLOT_LIVE, Ordering::Release);
        Ok(c)
    }

    /// Under the table lock: claim a free process slot for container `c` and
    /// take its liveness lock through `fd`.
    pub(crate) fn claim_process(&self, fd: i32, c: usize) -> Option<usize> {
        let f = self.file();
        let (pid, pidns, start_time) = file::self_identity();
        for (i, p) in f.processes.iter().enumerate() {
            if p.state.load(Ordering::Acquire) != SLOT_FREE {
                continue;
            }
            // A free slot whose range is still locked (cannot normally
            // happen) is skipped rather than shared.
            let off = process_slot_offset(i);
            match lock::try_lock(fd, off, std::mem::size_of::<ProcessSlot>() as u64) {
                Ok(true) => {}
                _ => continue,
            }
            p.state.store(SLOT_CLAIMING, Ordering::Release);
            let pause = TEST_JOIN_PAUSE_MS.load(Ordering::Relaxed);
            if pause > 0 {
                std::thread::sleep(Duration::from_millis(pause));
            }
            p.container.store(c as u32, Ordering::Relaxed);
            p.pid.store(pid, Ordering::Relaxed);
            p.pidns.store(pidns, Ordering::Relaxed);
            p.start_time.store(start_time, Ordering::Relaxed);
            match host_pid() {
                Some(h) => p.set_host_pid(h),
                None => p.host_pid.store(0, Ordering::Relaxed),
            }
            p.used.store(0, Ordering::Relaxed);
            p.pending.store(0, Ordering::Relaxed);
            p.gpu_time_ns.store(0, Ordering::Relaxed);
            p.launches.store(0, Ordering::Relaxed);
            p.sched_beat_ns.store(0, Ordering::Relaxed);
            p.sched_in_sync.store(0, Ordering::Relaxed);
            p.state.store(SLOT_LIVE, Ordering::Release);
            return Some(i);
        }
        None
    }

    /// Take over live process slot `i` whose liveness lock nobody holds
    /// (the node agent that held it for its process restarted, and the
    /// process still runs): hold its lock through this handle from now on
    /// and return its membership, what it holds still counted. `None` when
    /// the slot is not live or another holds its lock. Only the node agent
    /// calls this, after checking that the process the slot names is alive.
    pub fn adopt(&self, i: usize) -> Option<Membership> {
        if i >= MAX_PROCESSES {
            return None;
        }
        let fd = self.fd().ok()?;
        let _g = self.lock_table().ok()?;
        let f = self.file();
        let p = &f.processes[i];
        let c = p.container.load(Ordering::Acquire) as usize;
        if p.state.load(Ordering::Acquire) != SLOT_LIVE
            || c >= MAX_CONTAINERS
            || f.containers[c].state.load(Ordering::Acquire) != SLOT_LIVE
            || self.is_alive(i)
        {
            return None;
        }
        let len = std::mem::size_of::<ProcessSlot>() as u64;
        match lock::try_lock(fd, process_slot_offset(i), len) {
            Ok(true) => Some(Membership::new(c, i)),
            _ => None,
        }
    }

    /// Under the table lock: free container slot `c` (its knobs go with it).
    pub(crate) fn free_container(&self, c: usize) {
        let s = &self.file().containers[c];
        s.used.store(0, Ordering::Relaxed);
        s.nprocs.store(0, Ordering::Relaxed);
        s.weight.store(0, Ordering::Relaxed);
        s.state.store(SLOT_FREE, Ordering::Release);
    }

    /// Under the table lock: free process slot `i` after moving what it holds
    /// off its container.
    pub(crate) fn free_process(&self, i: usize) {
        let f = self.file();
        let p = &f.processes[i];
        let c = p.container.load(Ordering::Acquire) as usize;
        let live = p.state.load(Ordering::Acquire) == SLOT_LIVE && c < MAX_CONTAINERS;
        // What importers of its container hold of its exports is theirs to
        // pay for from now on (counted on them first); its own imports'
        // entries go with the slot, whatever state it was in.
        self.share_pass_on(i, live);
        if live {
            // Did its last CAS on the container happen? Unknowable here:
            // bytes in flight stay counted (safe), recounted when quiet.
            let (_, pending) = books::reap_process(&f.containers[c], p);
            if pending != 0 {
                tracing::debug!(
                    "process slot {i} (pid {}) died with {pending} bytes in flight: container {} recounts",
                    p.pid.load(Ordering::Relaxed),
                    f.containers[c].id_str()
                );
            }
        }
        p.state.store(SLOT_FREE, Ordering::Release);
    }

    /// Give back everything `m` holds and free its process slot (normal
    /// exit). Safe to call while other threads of this process allocate:
    /// it first waits (at most [`LEAVE_WAIT`]) for reservations in flight
    /// through `m` to finish; later ones are refused and releases ignored.
    /// If some thread stays inside a reservation longer than that, the slot
    /// is kept (still counted, never under-counted) and freed when this
    /// process dies. Idempotent. Returns true when this call gave the
    /// bytes back and dropped the liveness lock.
    pub fn leave(&self, m: impl std::borrow::Borrow<Membership>) -> bool {
        let m = m.borrow();
        if self.stale.load(Ordering::Acquire) {
            return false; // the parent's membership: not ours to give back
        }
        if m.left.swap(true, Ordering::SeqCst) {
            return false;
        }
        crate::sync::fence(Ordering::SeqCst); // see `Membership::enter`
        let t0 = std::time::Instant::now();
        while m.inflight.load(Ordering::SeqCst) != 0 {
            if t0.elapsed() > LEAVE_WAIT {
                tracing::warn!(
                    "leaving ledger {}: a thread is still inside an allocation after {} ms; the process slot is freed when the process ends",
                    self.path.display(),
                    LEAVE_WAIT.as_millis()
                );
                return false;
            }
            std::thread::yield_now();
        }
        let f = self.file();
        let p = &f.processes[m.process];
        let c = &f.containers[m.container];
        // Under the table lock (waiting at most LEAVE_LOCK_WAIT: an exit
        // never hangs on a stalled lock holder), so that no import of what
        // this process exported can be recorded between the look and the
        // give-back. Memory it exported that an importer of its container
        // holds is passed on by the reap below, before its bytes go; then
        // nothing is given back here. Without the lock nothing is given
        // back either: the next reap does it all (counted meanwhile).
        let table = self.lock_table_within(LEAVE_LOCK_WAIT);
        if table.is_ok() && !self.exports_shared(m.process) {
            // Move the bytes under the same `pending` marker as a release (a
            // concurrent recount then cannot subtract them a second time),
            // then drop the liveness lock: a reaper that sees us dead finds
            // nothing left to subtract twice.
            books::give_back_all(c, p);
        }
        if let Ok(fd) = self.fd() {
            let _ = lock::unlock(
                fd,
                process_slot_offset(m.process),
                std::mem::size_of::<ProcessSlot>() as u64,
            );
        }
        // Free the slot now if we hold the lock; otherwise the next reap
        // does, our liveness lock being gone.
        match table {
            Ok(_g) => {
                self.reap_locked();
            }
            Err(e) => tracing::debug!("leave: {e}; the slot and its bytes are reaped later"),
        }
        true
    }
}

/// How a joining process's request differs from the live container it
/// joins: `(what the container has, what was asked)`, each a readable list
/// of the settings that differ; `None` when they agree. Settings the
/// request leaves at their defaults (no quota, weight 1, not high
/// priority) never count as asking for something.
pub(crate) fn settings_differ(
    slot: &ContainerSlot,
    req: &JoinRequest<'_>,
) -> Option<(String, String)> {
    let quota = slot.quota.load(Ordering::Relaxed);
    let off = slot.enforce_off.load(Ordering::Relaxed) != 0;
    let weight = slot.weight.load(Ordering::Relaxed);
    let high = slot.highprio.load(Ordering::Relaxed) != 0;
    let q = |b: u64| {
        if b == 0 || b == QUOTA_UNLIMITED {
            "no quota".to_string()
        } else {
            format!("quota {}", human_bytes(b))
        }
    };
    let (mut has, mut asked) = (Vec::new(), Vec::new());
    let asked_quota = match req.quota {
        0 => None,
        QUOTA_UNLIMITED => Some(0),
        b => Some(b),
    };
    if asked_quota.is_some_and(|a| a != quota) {
        has.push(q(quota));
        asked.push(q(req.quota));
    }
    if req.enforce_off != off {
        has.push(format!("CGPU_DISABLE {}", if off { "on" } else { "off" }));
        asked.push(format!(
            "CGPU_DISABLE {}",
            if req.enforce_off { "on" } else { "off" }
        ));
    }
    if req.weight > 1 && req.weight != weight {
        has.push(format!("weight {weight}"));
        asked.push(format!("weight {}", req.weight));
    }
    if req.highprio != high {
        has.push(format!("high priority {}", if high { "on" } else { "off" }));
        asked.push(format!(
            "high priority {}",
            if req.highprio { "on" } else { "off" }
        ));
    }
    // The same container (by identity) under another name: the first
    // process's name stays.
    let name = slot.id_str();
    if name != req.container_id {
        has.push(format!("name {name}"));
        asked.push(format!("name {}", req.container_id));
    }
    (!has.is_empty()).then(|| (has.join(", "), asked.join(", ")))
}
