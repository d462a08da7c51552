//! Which object owns each memory charge, and what gives it back: the
//! bookkeeping below the hooks that makes every free path return exactly
//! what was taken, once.
//!
//! The owners and their edges, as the driver frees memory:
//!
//! - a **context** owns what was allocated in it (`cuMemAlloc*`, arrays, its
//!   own reservation, the primary context's too, and what its limits
//!   reserve): destroying it (or the primary context's last release or
//!   reset) gives all of that back ([`Charges::release_context`], and its
//!   own `Kind::Context` entry);
//! - a **pool** owns its stream-ordered allocations, which also die with
//!   the context current when they were made ([`Owner::Pool`],
//!   [`Charges::release_pool`]);
//! - the **device** owns `cuMemCreate` allocations: no context frees them; a
//!   **handle** reference (created, retained or imported) keeps its
//!   allocation's charge, and so does each **mapping** of it, until the last
//!   of both is gone (`Vmm`); an allocation **exported** as a shareable
//!   handle stays charged until the process exits (other processes and
//!   descriptors cgpu cannot see keep it alive);
//! - a device's **graph pool** owns graph memory: the driver reserves it at
//!   a launch and keeps it until trimmed, whatever frees the allocations
//!   (`Charges::graph_pools`, settled by `hooks::graph`).

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use super::Gpu;
use crate::ledger::{ShareLink, SharePayer};

/// What a bookkeeping entry is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A device pointer (`cuMemAlloc*`).
    Ptr,
    /// A `cuMemCreate` handle.
    Handle,
    /// A CUDA array.
    Array,
    /// A mipmapped array.
    Mipmap,
    /// A created context.
    Context,
    /// What a context limit (`cuCtxSetLimit`, the `CUlimit` here) reserves,
    /// keyed by the context.
    Limit(u32),
    /// What a loaded module or library takes on the device (its code, its
    /// globals), keyed by its handle.
    Module,
}

/// Where a stream-ordered memory pool keeps its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolPlace {
    /// On this CUDA device (host ordinal): its allocations are charged there.
    Device(i32),
    /// Host memory (`CU_MEM_LOCATION_TYPE_HOST*`): not device memory, not charged.
    Host,
}

/// What the driver frees an allocation with: the owner of its charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// A context (0 = none known): destroying it frees the allocation.
    Context(usize),
    /// A stream-ordered allocation: freed with its pool (`cuMemPoolDestroy`;
    /// 0 = the device's current pool) or with the context current when it
    /// was made, whichever goes first.
    Pool { pool: usize, ctx: usize },
}

impl Owner {
    fn dies_with_context(self, c: usize) -> bool {
        match self {
            Owner::Context(x) | Owner::Pool { ctx: x, .. } => x == c,
        }
    }
}

/// One bookkeeping entry.
#[derive(Clone, Copy)]
pub struct Entry {
    pub gpu: &'static Gpu,
    pub bytes: u64,
    /// What frees it besides an explicit free.
    pub owner: Owner,
}

/// One `cuMemCreate` allocation: the device's, not any context's. Its charge
/// lasts while a handle to it is held (`cuMemCreate`, each
/// `cuMemRetainAllocationHandle`) or a mapping of it exists (`cuMemMap`), as
/// the driver keeps the memory until the last of both is gone. An
/// allocation another process exported and this one imported
/// (`cuMemImportFromShareableHandle`) is one too: this process keeps it
/// alive on the device while it holds it, so it is charged here as well,
/// for as much of it as is mapped (the driver tells no handle's size).
///
/// An allocation this process exported (`cuMemExportToShareableHandle`)
/// lives on in the driver while any exported descriptor or any other
/// process's imported handle exists, none of which cgpu can see: its charge
/// is kept, after its last reference and mapping here are gone, until this
/// process exits (`Vmm::kept`).
struct Phys {
    gpu: &'static Gpu,
    bytes: u64,
    /// Imported: `bytes` grows with the largest extent mapped.
    imported: bool,
    /// Exported as a shareable handle: charged until the process exits.
    exported: bool,
    /// Imported from a live exporter of this container: recorded in the
    /// ledger's table of shared allocations, paid for by the exporter (and
    /// `bytes` stays 0) until it goes; then this process's (`bytes` is what
    /// its slot was charged, and the link is dropped).
    share: Option<ShareLink>,
    /// Handle references not yet released.
    refs: u32,
    /// Live mappings.
    maps: u32,
}

/// The virtual-memory objects of this process: physical allocations by
/// handle, and mappings by start address (start -> (length, handle)).
#[derive(Default)]
struct Vmm {
    phys: HashMap<u64, Phys>,
    maps: BTreeMap<u64, (u64, u64)>,
    /// Exported allocations this process no longer holds: still charged,
    /// until it exits (their handle values may be reused).
    kept: Vec<(&'static Gpu, u64)>,
    /// Imports of this container's memory this process exported on and no
    /// longer holds: their ledger entries are kept until it exits.
    kept_shares: Vec<ShareLink>,
}

impl Vmm {
    /// Drop `h` if nothing holds it any more; what it was charged (an
    /// exported allocation's charge is kept instead).
    fn settle(&mut self, h: u64) -> Option<(&'static Gpu, u64)> {
        let p = self.phys.get(&h)?;
        if p.refs == 0 && p.maps == 0 {
            let p = self.phys.remove(&h)?;
            if let Some(link) = p.share {
                if p.exported {
                    // Exported on by this process: what its descriptor
                    // keeps stays recorded until this process exits (its
                    // slot's reap frees the entry).
                    self.kept_shares.push(link);
                } else {
                    // Gives back what this process bore for it, if anything.
                    link.release();
                }
                return None;
            }
            if p.exported {
                self.kept.push((p.gpu, p.bytes));
                return None;
            }
            return Some((p.gpu, p.bytes));
        }
        None
    }
}

/// One process's charges by owner (a [`crate::memory::Proc`] holds one;
/// a forked child starts a new one).
#[derive(Default)]
pub struct Charges {
    allocs: Mutex<HashMap<(Kind, u64), Entry>>,
    vmm: Mutex<Vmm>,
    pools: Mutex<HashMap<usize, PoolPlace>>,
    /// Graph memory per device (driver ordinal): `(gpu, bytes)` the
    /// device's graph pool holds for this process (`hooks::graph` settles
    /// it on the driver's report). Its lock also serialises launches of
    /// execs with alloc nodes and trims, so that what a pool holds spare
    /// cannot shrink between the estimate and the launch.
    graph: Mutex<BTreeMap<i32, (usize, u64)>>,
}

impl Charges {
    /// Remember that `key` holds `bytes` on `gpu`, owned by `owner`.
    pub fn track(&self, kind: Kind, key: u64, gpu: &'static Gpu, bytes: u64, owner: Owner) {
        if let Some(old) = self
            .allocs
            .lock()
            .insert((kind, key), Entry { gpu, bytes, owner })
        {
            // The driver handed out a key we still had: it was freed behind
            // our back; give its bytes back.
            old.gpu.release(old.bytes);
        }
    }

    /// Add `bytes` on `gpu` to what `key` holds (a new entry if none).
    pub fn add(&self, kind: Kind, key: u64, gpu: &'static Gpu, bytes: u64, owner: Owner) {
        self.allocs
            .lock()
            .entry((kind, key))
            .and_modify(|e| e.bytes = e.bytes.saturating_add(bytes))
            .or_insert(Entry { gpu, bytes, owner });
    }

    /// The graph pools' charges (see the field).
    pub fn graph_pools(&self) -> &Mutex<BTreeMap<i32, (usize, u64)>> {
        &self.graph
    }

    /// Forget `key`; what it held (once).
    pub fn untrack(&self, kind: Kind, key: u64) -> Option<Entry> {
        self.allocs.lock().remove(&(kind, key))
    }

    /// A context was destroyed: the driver freed everything made in it.
    /// Give back what its allocations held (the context's own reservation
    /// is released by the caller; `cuMemCreate` allocations are the
    /// device's and stay). Returns the bytes released.
    pub fn release_context(&self, ctx: usize) -> u64 {
        if ctx == 0 {
            return 0;
        }
        self.release_where(|k, e| k.0 != Kind::Context && e.owner.dies_with_context(ctx))
    }

    /// A pool was destroyed: the driver freed the allocations still out in it.
    pub fn release_pool(&self, pool: usize) -> u64 {
        if pool == 0 {
            return 0;
        }
        self.release_where(|_, e| matches!(e.owner, Owner::Pool { pool: p, .. } if p == pool))
    }

    fn release_where(&self, dead: impl Fn(&(Kind, u64), &Entry) -> bool) -> u64 {
        let mut freed = Vec::new();
        self.allocs.lock().retain(|k, e| {
            if dead(k, e) {
                freed.push(*e);
                false
            } else {
                true
            }
        });
        let mut total = 0;
        for e in freed {
            e.gpu.release(e.bytes);
            total += e.bytes;
        }
        total
    }

    /// `cuMemCreate` made handle `h` of `bytes` on `gpu` (already reserved).
    pub fn vmm_created(&self, h: u64, gpu: &'static Gpu, bytes: u64) {
        let old = self.vmm.lock().phys.insert(
            h,
            Phys {
                gpu,
                bytes,
                imported: false,
                exported: false,
                share: None,
                refs: 1,
                maps: 0,
            },
        );
        if let Some(old) = old {
            // A handle value we still had: the driver freed it behind our back.
            old.gpu.release(old.bytes);
        }
    }

    /// `cuMemImportFromShareableHandle` returned `h`, memory on `gpu`: one
    /// more reference to an allocation this process holds already (the
    /// same handle again: `share`, if any, is let go of), else a new
    /// imported allocation. With `share` it was exported by a live process
    /// of this container and the import recorded in the ledger as that
    /// link: the exporter pays for it while it lives (see `Phys::share`).
    /// Without, it is charged nothing until it is mapped
    /// ([`Charges::vmm_import_growth`]).
    pub fn vmm_imported(&self, h: u64, gpu: &'static Gpu, share: Option<ShareLink>) {
        let mut v = self.vmm.lock();
        match v.phys.get_mut(&h) {
            Some(p) => {
                p.refs = p.refs.saturating_add(1);
                if let Some(link) = share {
                    link.release();
                }
            }
            None => {
                v.phys.insert(
                    h,
                    Phys {
                        gpu,
                        bytes: 0,
                        imported: true,
                        exported: false,
                        share,
                        refs: 1,
                        maps: 0,
                    },
                );
            }
        }
    }

    /// Does this process hold handle `h`?
    pub fn vmm_holds(&self, h: u64) -> bool {
        self.vmm.lock().phys.contains_key(&h)
    }

    /// Before mapping `[offset, offset + len)` of handle `h`: if it is an
    /// imported allocation whose charge does not cover that extent yet, the
    /// GPU and the bytes to reserve first (then [`Charges::vmm_import_grown`]).
    /// An import its exporter pays for records the extent in the ledger
    /// instead (nothing to reserve); if the exporter went, this process
    /// was charged for it meanwhile and counts that as its own.
    pub fn vmm_import_growth(&self, h: u64, offset: u64, len: u64) -> Option<(&'static Gpu, u64)> {
        let mut v = self.vmm.lock();
        let p = v.phys.get_mut(&h).filter(|p| p.imported)?;
        let extent = offset.saturating_add(len);
        if let Some(link) = p.share {
            // A link into a ledger this process has left (deleted or
            // replaced) is nobody's to pass on: charge here from now on.
            let payer = if p.gpu.share_current(&link) {
                link.grow(extent)
            } else {
                SharePayer::Importer(0)
            };
            match payer {
                SharePayer::Exporter => return None,
                SharePayer::Importer(b) => {
                    p.share = None;
                    p.bytes = p.gpu.share_adopt(&link, b);
                }
            }
        }
        (extent > p.bytes).then(|| (p.gpu, extent - p.bytes))
    }

    /// A mapping up to `extent` of imported handle `h`, for which `reserved`
    /// bytes were reserved, succeeded: the charge covers `extent` now.
    /// Returns what was reserved beyond that (another thread grew it
    /// meanwhile, or the handle is gone), for the caller to give back.
    pub fn vmm_import_grown(&self, h: u64, extent: u64, reserved: u64) -> u64 {
        match self.vmm.lock().phys.get_mut(&h) {
            Some(p) if p.imported => {
                let grow = extent.saturating_sub(p.bytes).min(reserved);
                p.bytes = p.bytes.saturating_add(grow);
                reserved - grow
            }
            _ => reserved,
        }
    }

    /// `cuMemRetainAllocationHandle` returned `h`: one more reference.
    pub fn vmm_retained(&self, h: u64) {
        if let Some(p) = self.vmm.lock().phys.get_mut(&h) {
            p.refs = p.refs.saturating_add(1);
        }
    }

    /// `cuMemRelease(h)` succeeded: one reference less; the charge goes when
    /// no reference and no mapping is left.
    pub fn vmm_released(&self, h: u64) {
        let freed = {
            let mut v = self.vmm.lock();
            match v.phys.get_mut(&h) {
                Some(p) => {
                    p.refs = p.refs.saturating_sub(1);
                    v.settle(h)
                }
                None => None,
            }
        };
        if let Some((gpu, bytes)) = freed {
            gpu.release(bytes);
        }
    }

    /// `cuMemMap` mapped `[va, va + len)` to handle `h`.
    pub fn vmm_mapped(&self, va: u64, len: u64, h: u64) {
        let mut v = self.vmm.lock();
        if let Some(p) = v.phys.get_mut(&h) {
            p.maps = p.maps.saturating_add(1);
            v.maps.insert(va, (len, h));
        }
    }

    /// `cuMemUnmap` unmapped `[va, va + len)`: every mapping inside it is gone.
    pub fn vmm_unmapped(&self, va: u64, len: u64) {
        let end = va.saturating_add(len);
        let mut freed = Vec::new();
        {
            let mut v = self.vmm.lock();
            let gone: Vec<u64> = v
                .maps
                .range(va..end)
                .filter(|(s, (l, _))| s.saturating_add(*l) <= end)
                .map(|(s, _)| *s)
                .collect();
            for s in gone {
                let Some((_, h)) = v.maps.remove(&s) else {
                    continue;
                };
                if let Some(p) = v.phys.get_mut(&h) {
                    p.maps = p.maps.saturating_sub(1);
                }
                freed.extend(v.settle(h));
            }
        }
        for (gpu, bytes) in freed {
            gpu.release(bytes);
        }
    }

    /// Bytes charged for `cuMemCreate` allocations still held (tests).
    pub fn vmm_charged(&self) -> u64 {
        let v = self.vmm.lock();
        v.phys.values().map(|p| p.bytes).sum::<u64>() + v.kept.iter().map(|k| k.1).sum::<u64>()
    }

    /// `cuMemExportToShareableHandle` exported handle `h`: its charge is kept
    /// until the process exits (see `Phys`).
    pub fn vmm_exported(&self, h: u64) {
        if let Some(p) = self.vmm.lock().phys.get_mut(&h) {
            p.exported = true;
        }
    }

    /// `cuMemPoolCreate` made `pool` at `place`.
    pub fn pool_created(&self, pool: usize, place: PoolPlace) {
        self.pools.lock().insert(pool, place);
    }

    /// Where `pool` keeps its memory, if this process made it.
    pub fn pool_place(&self, pool: usize) -> Option<PoolPlace> {
        self.pools.lock().get(&pool).copied()
    }

    /// `cuMemPoolDestroy(pool)` succeeded.
    pub fn pool_destroyed(&self, pool: usize) {
        self.pools.lock().remove(&pool);
        self.release_pool(pool);
    }

    /// Number of tracked entries (tests).
    pub fn tracked(&self) -> usize {
        self.allocs.lock().len()
    }
}
