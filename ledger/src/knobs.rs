//! Knob writes (`cgpuctl set`) and the free weight.

use super::*;

/// Knob writes (`cgpuctl set`), range-checked as cGPU does. Each bumps
/// `knob_generation` so running jobs notice. A smaller `memsize` than what
/// is held refuses further allocations; it never frees memory under a job.
impl Ledger {
    /// A weight > 1 switches the GPU to policy 2 unless an
    /// operator set the policy explicitly (at join and on `set_weight`).
    pub(crate) fn weight_switches_policy(&self, weight: u32) {
        let h = &self.file().header;
        if weight > 1
            && h.policy_explicit.load(Ordering::Acquire) == 0
            && h.policy.swap(2, Ordering::AcqRel) != 2
        {
            h.knob_generation.fetch_add(1, Ordering::AcqRel);
            tracing::info!(
                "GPU {}: weight {weight} > 1 switches policy to 2",
                h.uuid_str()
            );
        }
    }
    pub(crate) fn bump(&self) {
        self.file()
            .header
            .knob_generation
            .fetch_add(1, Ordering::AcqRel);
    }
    pub(crate) fn live_container(&self, c: usize) -> Result<&ContainerSlot, String> {
        self.file()
            .containers
            .get(c)
            .filter(|s| s.state.load(Ordering::Acquire) == SLOT_LIVE)
            .ok_or_else(|| format!("no live container in slot {c}"))
    }
    /// Policy 0..=5; marks it explicit (a weight > 1 no longer switches it).
    pub fn set_policy(&self, policy: u32) -> Result<(), String> {
        if policy > POLICY_MAX {
            return Err(format!("policy {policy} out of range 0..={POLICY_MAX}"));
        }
        let h = &self.file().header;
        h.policy.store(policy, Ordering::Release);
        h.policy_explicit.store(1, Ordering::Release);
        self.bump();
        Ok(())
    }
    pub fn set_max_inst(&self, v: u32) -> Result<(), String> {
        if !MAX_INST_RANGE.contains(&v) {
            return Err(format!("max_inst {v} out of range {MAX_INST_RANGE:?}"));
        }
        self.file().header.max_inst.store(v, Ordering::Release);
        self.bump();
        Ok(())
    }
    pub fn set_prio_ratio(&self, v: u32) -> Result<(), String> {
        if !PRIO_RATIO_RANGE.contains(&v) {
            return Err(format!("prio_ratio {v} out of range {PRIO_RATIO_RANGE:?}"));
        }
        self.file().header.prio_ratio.store(v, Ordering::Release);
        self.bump();
        Ok(())
    }
    /// Bytes; 0 = containers without a quota are not limited.
    pub fn set_default_memsize(&self, bytes: u64) -> Result<(), String> {
        self.file()
            .header
            .default_memsize
            .store(bytes, Ordering::Release);
        self.bump();
        Ok(())
    }
    /// Weight of container slot `c` (0 = no compute). As in cGPU, the
    /// weights of live containers may not sum to more than `max_inst`: the
    /// most it may get is its current weight plus `free_weight`.
    ///
    /// Check and write happen under the table lock (the same lock `join`
    /// takes to hand out weights), so two operators, or an operator and an
    /// arriving container, can never together push the sum past `max_inst`.
    pub fn set_weight(&self, c: usize, w: u32) -> Result<(), String> {
        let _g = self.lock_table().map_err(|e| e.to_string())?;
        let slot = self.live_container(c)?;
        let max = self.file().header.max_inst.load(Ordering::Acquire);
        let most = slot
            .weight
            .load(Ordering::Acquire)
            .saturating_add(free_weight(self.file()));
        if w > max || w > most {
            return Err(format!(
                "weight {w} out of range 0..={} (max_inst {max}, weights of live containers may not sum past it)",
                most.min(max)
            ));
        }
        let pause = TEST_SET_WEIGHT_PAUSE_MS.load(Ordering::Relaxed);
        if pause > 0 {
            std::thread::sleep(Duration::from_millis(pause));
        }
        slot.weight.store(w, Ordering::Release);
        self.weight_switches_policy(w);
        self.bump();
        Ok(())
    }
    /// Container slot `c` has weight 0 because this process claimed it
    /// when none was free: give it weight 1 if one is free now (a weight 0
    /// an operator set is never overridden). One attempt at the table lock,
    /// never waiting; rate-limited per GPU handle (at most every 10 ms), so
    /// a waiting launch may call it on each turn of its wait. True when it
    /// took a weight.
    pub fn take_free_weight(&self, c: usize) -> bool {
        if self.weightless.load(Ordering::Acquire) != c as u32 + 1 {
            return false; // not a container that arrived with no weight free
        }
        let now = crate::clock::monotonic_ns();
        let last = self.weight_try_ns.load(Ordering::Relaxed);
        if now < last.saturating_add(10_000_000)
            || self
                .weight_try_ns
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let Some(_g) = self.try_lock_table() else {
            return false;
        };
        let Ok(slot) = self.live_container(c) else {
            return false;
        };
        if slot.weight.load(Ordering::Acquire) != 0 {
            // It got weight another way (an operator): from now on a
            // weight 0 is theirs to give.
            self.weightless.store(0, Ordering::Release);
            return false;
        }
        if free_weight(self.file()) == 0 {
            // A container that held weight may have died: reap first.
            if self.needs_reap() {
                self.reap_locked();
            }
            if free_weight(self.file()) == 0 {
                return false;
            }
        }
        slot.weight.store(1, Ordering::Release);
        self.weightless.store(0, Ordering::Release);
        self.bump();
        true
    }
    /// Quota in bytes of container slot `c` (0 = not limited).
    pub fn set_memsize(&self, c: usize, bytes: u64) -> Result<(), String> {
        self.live_container(c)?
            .quota
            .store(bytes, Ordering::Release);
        self.bump();
        Ok(())
    }
    pub fn set_highprio(&self, c: usize, on: bool) -> Result<(), String> {
        self.live_container(c)?
            .highprio
            .store(on as u32, Ordering::Release);
        self.bump();
        Ok(())
    }
}

/// `free_weight`: `max_inst − Σ weights of live containers`, never below 0.
pub fn free_weight(f: &LedgerFile) -> u32 {
    let used: u32 = f
        .containers
        .iter()
        .filter(|c| c.state.load(Ordering::Acquire) == SLOT_LIVE)
        .map(|c| c.weight.load(Ordering::Relaxed))
        .fold(0u32, |a, w| a.saturating_add(w));
    f.header
        .max_inst
        .load(Ordering::Relaxed)
        .saturating_sub(used)
}
