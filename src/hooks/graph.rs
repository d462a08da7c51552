//! Graph memory: the device memory that memory-alloc nodes of CUDA graphs
//! take (`cuGraphAddMemAllocNode`, `cuGraphAddNode` with a mem-alloc node,
//! `cuMemAllocAsync` captured into a graph).
//!
//! The driver reserves it on the node's device when a graph exec is
//! **launched**, in 2 MiB units, into the device's graph memory pool, and
//! keeps it reserved after the allocation is freed, until
//! `cuDeviceGraphMemTrim`. The charge therefore follows what the driver
//! reserves, per device, not the allocations:
//!
//! - at instantiation the graph is walked once (child graphs included) and
//!   an exec with alloc nodes is remembered with its bytes per device
//!   (each node rounded up to 2 MiB);
//! - before such an exec is launched, the most the launch can add to the
//!   pool (its bytes, less what the pool holds reserved and unused) is
//!   reserved on the container's quota; a launch that does not fit is
//!   refused with `CUDA_ERROR_OUT_OF_MEMORY` and never reaches the driver;
//! - `cuGraphUpload` and an instantiation with
//!   `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` are charged the same way (a driver
//!   may reserve there);
//! - after the launch, and after `cuDeviceGraphMemTrim` /
//!   `cuDeviceSetGraphMemAttribute`, the charge is set to what the driver
//!   reports reserved (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`): the excess
//!   is given back.
//!
//! The charge belongs to the device, not to a context. Launches of execs
//! without alloc nodes cost one atomic load when the process has no such
//! exec, else a lock-free probe of a fixed table (no allocation, no lock).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::sig;
use super::types::*;
use crate::driver::RealFn;
use crate::memory::Gpu;

/// The driver's graph memory unit.
const GRANULE: u64 = 2 << 20;
/// `CU_GRAPH_NODE_TYPE_GRAPH` (a child graph).
const NODE_CHILD_GRAPH: u32 = 4;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
const NODE_MEM_ALLOC: u32 = 10;
/// `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`.
const ATTR_USED: u32 = 0;
/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
const ATTR_RESERVED: u32 = 2;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`.
const INSTANTIATE_FLAG_UPLOAD: u64 = 2;
/// Deepest nesting of child graphs walked.
const MAX_DEPTH: u32 = 64;

/// Execs with alloc nodes, as a lock-free open-addressed set read by every
/// graph launch: 0 = never used, `TOMB` = removed.
const SLOTS: usize = 1024;
const TOMB: usize = usize::MAX;
static KEYS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// Execs with alloc nodes alive (0: every launch takes the fast path).
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Slots probed from an exec's home slot (bounded: tombstones never make a
/// launch scan the whole table).
const PROBE: usize = 16;
/// Live execs that found no slot within `PROBE`: while there are any,
/// launches that miss the table also look in `State::needs`.
static OVERFLOWED: AtomicUsize = AtomicUsize::new(0);

/// This process's execs with alloc nodes, one table per fork generation: a
/// child never waits on a lock a parent thread held, nor keeps the parent's
/// execs (unusable after a fork). The charge itself is the device's graph
/// pool's, in `memory::charges` (`Charges::graph_pools`, also per
/// generation).
struct State {
    generation: u64,
    /// Bytes per device (driver ordinal) of each remembered exec.
    needs: Mutex<BTreeMap<usize, Vec<(CUdevice, u64)>>>,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());

/// The state of this fork generation (a previous one is leaked, never
/// touched again).
fn state() -> &'static State {
    let generation = crate::process::fork::generation();
    loop {
        let cur = STATE.load(Ordering::Acquire);
        // SAFETY: a non-null STATE points to a leaked Box, never freed.
        if let Some(s) = unsafe { cur.as_ref() } {
            if s.generation == generation {
                return s;
            }
        }
        let new = Box::into_raw(Box::new(State {
            generation,
            needs: Mutex::new(BTreeMap::new()),
        }));
        match STATE.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: just published; leaked from here on.
            Ok(_) => return unsafe { &*new },
            // SAFETY: `new` was never published: ours to free.
            Err(_) => drop(unsafe { Box::from_raw(new) }),
        }
    }
}

static WALK_WARNED: AtomicBool = AtomicBool::new(false);

fn slot_of(exec: usize) -> usize {
    (exec >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) % SLOTS
}

/// Is `exec` remembered as having alloc nodes? Lock-free unless the table
/// overflowed.
#[inline(always)]
fn has_memory(exec: CUgraphExec) -> bool {
    if LIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    has_memory_slow(exec as usize)
}

#[inline(never)]
fn has_memory_slow(exec: usize) -> bool {
    let start = slot_of(exec);
    for i in 0..PROBE {
        let k = KEYS[(start + i) % SLOTS].load(Ordering::Acquire);
        if k == exec {
            return true;
        }
        if k == 0 {
            // Slots are filled in probe order and never emptied again.
            break;
        }
    }
    OVERFLOWED.load(Ordering::Acquire) > 0 && state().needs.lock().contains_key(&exec)
}

fn remember(exec: usize, needs: Vec<(CUdevice, u64)>) {
    if exec == 0 || exec == TOMB {
        return;
    }
    let fresh = state().needs.lock().insert(exec, needs).is_none();
    if !fresh {
        return;
    }
    let start = slot_of(exec);
    let mut placed = false;
    for i in 0..PROBE {
        let s = &KEYS[(start + i) % SLOTS];
        let k = s.load(Ordering::Acquire);
        if (k == 0 || k == TOMB)
            && s.compare_exchange(k, exec, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            placed = true;
            break;
        }
    }
    if !placed {
        OVERFLOWED.fetch_add(1, Ordering::AcqRel);
    }
    LIVE.fetch_add(1, Ordering::AcqRel);
}

fn forget(exec: usize) {
    if state().needs.lock().remove(&exec).is_none() {
        return;
    }
    let start = slot_of(exec);
    let found = (0..PROBE).any(|i| {
        KEYS[(start + i) % SLOTS]
            .compare_exchange(exec, TOMB, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    });
    if !found {
        OVERFLOWED.fetch_sub(1, Ordering::AcqRel);
    }
    LIVE.fetch_sub(1, Ordering::AcqRel);
}

/// Adds the alloc nodes of `graph` (and of its child graphs) to `out`;
/// false when the graph could not be read.
fn walk(graph: CUgraph, out: &mut BTreeMap<CUdevice, u64>, depth: u32) -> bool {
    let (Some(get_nodes), Some(get_type), Some(get_alloc), Some(get_child)) = (
        super::real::cuGraphGetNodes.get(),
        super::real::cuGraphNodeGetType.get(),
        super::real::cuGraphMemAllocNodeGetParams.get(),
        super::real::cuGraphChildGraphNodeGetGraph.get(),
    ) else {
        return false;
    };
    if depth > MAX_DEPTH {
        return false;
    }
    let mut n: usize = 0;
    // SAFETY: the real driver function; a null array asks for the count only.
    if unsafe { get_nodes(graph, std::ptr::null_mut(), &mut n) } != CUDA_SUCCESS {
        return false;
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries, the count passed in.
    if n > 0 && unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut n) } != CUDA_SUCCESS {
        return false;
    }
    nodes.truncate(n);
    for node in nodes {
        let mut t: CUgraphNodeType = 0;
        // SAFETY: a node of the graph and a valid out-pointer.
        if unsafe { get_type(node, &mut t) } != CUDA_SUCCESS {
            return false;
        }
        match t {
            NODE_MEM_ALLOC => {
                // SAFETY: all-zero is a valid value of this plain C struct.
                let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: an alloc node and a valid out-pointer of the
                // header's layout.
                if unsafe { get_alloc(node, &mut p) } != CUDA_SUCCESS {
                    return false;
                }
                let bytes = (p.bytesize as u64)
                    .div_ceil(GRANULE)
                    .saturating_mul(GRANULE);
                let e = out.entry(p.poolProps.location.id).or_insert(0);
                *e = e.saturating_add(bytes);
            }
            NODE_CHILD_GRAPH => {
                let mut child: CUgraph = std::ptr::null_mut();
                // SAFETY: a child-graph node and a valid out-pointer.
                if unsafe { get_child(node, &mut child) } != CUDA_SUCCESS
                    || !walk(child, out, depth + 1)
                {
                    return false;
                }
            }
            _ => {}
        }
    }
    true
}

/// After a successful instantiation of `graph` into `*pe`: remember the
/// exec if it has alloc nodes.
///
/// # Safety
/// `pe` is the caller's out-pointer the driver just wrote (or null).
unsafe fn instantiated(rc: CUresult, pe: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    if rc != CUDA_SUCCESS || pe.is_null() || !crate::memory::tracking() {
        return rc;
    }
    // SAFETY: per the contract above, written by the driver on success.
    let exec = unsafe { pe.read_unaligned() } as usize;
    let mut per_dev = BTreeMap::new();
    if !walk(graph, &mut per_dev, 0) {
        if !WALK_WARNED.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "cgpu: cannot read a graph's memory nodes at instantiation: its graph memory is charged after each launch (the quota may be passed by one launch)"
            );
        }
        remember(exec, Vec::new());
    } else if !per_dev.is_empty() {
        remember(exec, per_dev.into_iter().collect());
    }
    rc
}

fn attr(dev: CUdevice, which: u32) -> Option<u64> {
    let f = super::real::cuDeviceGetGraphMemAttribute.get()?;
    let mut v: u64 = 0;
    // SAFETY: the real driver function; both attributes are 64-bit values.
    (unsafe { f(dev, which, (&mut v as *mut u64).cast()) } == CUDA_SUCCESS).then_some(v)
}

/// The charge held on `dev` (0 after a fork made a new `gpu`).
fn held(map: &BTreeMap<CUdevice, (usize, u64)>, dev: CUdevice, gpu: &'static Gpu) -> u64 {
    match map.get(&dev) {
        Some(&(g, b)) if g == gpu as *const Gpu as usize => b,
        _ => 0,
    }
}

/// Sets the charge of `dev` to what the driver reserves; `extra` bytes were
/// reserved on top of the charge before a launch. Called with the graph
/// pools' lock held.
fn settle(
    map: &mut BTreeMap<CUdevice, (usize, u64)>,
    dev: CUdevice,
    gpu: &'static Gpu,
    extra: u64,
) {
    let have = held(map, dev, gpu).saturating_add(extra);
    let now = match attr(dev, ATTR_RESERVED) {
        Some(v) => v,
        None => have, // keep what was taken: never under-count
    };
    if now < have {
        gpu.release(have - now);
    } else if now > have && !gpu.reserve(now - have) {
        tracing::error!(
            "cgpu: the driver reserved {} bytes of graph memory beyond the container's quota on GPU {}",
            now - have,
            gpu.visible_index
        );
        // Counted anyway would need a forced charge; keep what we hold.
        map.insert(dev, (gpu as *const Gpu as usize, have));
        return;
    }
    map.insert(dev, (gpu as *const Gpu as usize, now));
}

/// The launch of `exec`: through `launch` directly when it has no alloc
/// nodes, else charged as described in the module documentation.
#[inline(always)]
pub fn launch(exec: CUgraphExec, launch: impl FnOnce() -> CUresult) -> CUresult {
    if !has_memory(exec) {
        return launch();
    }
    launch_with_memory(exec as usize, launch)
}

#[cold]
#[inline(never)]
fn launch_with_memory(exec: usize, launch: impl FnOnce() -> CUresult) -> CUresult {
    let Some(needs) = state().needs.lock().get(&exec).cloned() else {
        return launch();
    };
    charged_around(&needs, launch)
}

/// Reserves what `launch` can add to the pools of `needs`' devices, runs
/// it, then settles the charges on what the driver reserves.
fn charged_around(needs: &[(CUdevice, u64)], launch: impl FnOnce() -> CUresult) -> CUresult {
    let _g = super::context::alloc_guard();
    let mut map = crate::memory::proc_state().charges.graph_pools().lock();
    let mut taken: Vec<(CUdevice, &'static Gpu, u64)> = Vec::with_capacity(needs.len());
    for &(dev, bytes) in needs {
        let Some(gpu) = crate::memory::cuda_gpu(dev) else {
            continue;
        };
        let spare = match (attr(dev, ATTR_RESERVED), attr(dev, ATTR_USED)) {
            (Some(r), Some(u)) => r.saturating_sub(u).min(held(&map, dev, gpu)),
            _ => 0,
        };
        let want = bytes.saturating_sub(spare);
        if !gpu.reserve(want) {
            tracing::debug!(
                "cgpu: graph launch needing {want} bytes of graph memory refused: container would pass its quota on GPU {}",
                gpu.visible_index
            );
            for &(_, g, b) in &taken {
                g.release(b);
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        taken.push((dev, gpu, want));
    }
    // Execs whose graph could not be read: charge what the launch reserved.
    if needs.is_empty() {
        if let Some(dev) = crate::process::gpus::current_device() {
            if let Some(gpu) = crate::memory::cuda_gpu(dev) {
                taken.push((dev, gpu, 0));
            }
        }
    }
    let rc = launch();
    for (dev, gpu, want) in taken {
        settle(&mut map, dev, gpu, want);
    }
    rc
}

/// Runs `call` (a trim or an attribute reset on `dev`), then re-reads what
/// the driver reserves on `dev` and gives back the excess. No launch with
/// memory runs meanwhile.
fn resettled(dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let _g = super::context::alloc_guard();
    let mut map = crate::memory::proc_state().charges.graph_pools().lock();
    let rc = call();
    if rc == CUDA_SUCCESS && map.contains_key(&dev) {
        if let Some(gpu) = crate::memory::cuda_gpu(dev) {
            settle(&mut map, dev, gpu, 0);
        }
    }
    rc
}

/// `cuGraphAddMemAllocNode`: the pool's device as the container numbers it
/// (`ALIYUN_COM_GPU_VISIBLE_DEVICES`) becomes the host's, as for
/// `cuMemCreate`, so that the memory lands (and is charged) on the GPU the
/// application chose; the address the driver picked is written back.
///
/// # Safety
/// The driver's contract.
pub unsafe fn add_mem_alloc_node(
    real: &RealFn<sig::cuGraphAddMemAllocNode>,
    pn: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    p: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    if p.is_null() {
        return super::call_real!(real, pn, g, deps, n, p);
    }
    // SAFETY: p is the caller's non-null params struct (the header's
    // layout); read unaligned, as a copy.
    let mut q = unsafe { p.read_unaligned() };
    let id = q.poolProps.location.id;
    if q.poolProps.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return super::call_real!(real, pn, g, deps, n, p);
    }
    let host = crate::process::gpus::host_device_for_location(id);
    if host == id {
        return super::call_real!(real, pn, g, deps, n, p);
    }
    q.poolProps.location.id = host;
    let rc = super::call_real!(real, pn, g, deps, n, &mut q);
    if rc == CUDA_SUCCESS {
        // SAFETY: as above; `dptr` is the params' output field.
        unsafe { std::ptr::addr_of_mut!((*p).dptr).write_unaligned(q.dptr) };
    }
    rc
}

/// `cuGraphInstantiate` / `_v2` (legacy signature).
///
/// # Safety
/// The driver's contract.
pub unsafe fn instantiate_legacy(
    real: &RealFn<sig::cuGraphInstantiate>,
    pe: *mut CUgraphExec,
    g: CUgraph,
    err: *mut CUgraphNode,
    log: *mut c_char,
    n: usize,
) -> CUresult {
    let rc = super::call_real!(real, pe, g, err, log, n);
    // SAFETY: pe is the caller's out-pointer.
    unsafe { instantiated(rc, pe, g) }
}

/// `cuGraphInstantiateWithFlags`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn instantiate_with_flags(
    real: &RealFn<sig::cuGraphInstantiateWithFlags>,
    pe: *mut CUgraphExec,
    g: CUgraph,
    flags: u64,
) -> CUresult {
    let rc = super::call_real!(real, pe, g, flags);
    // SAFETY: pe is the caller's out-pointer.
    unsafe { instantiated(rc, pe, g) }
}

/// `cuGraphInstantiateWithParams` and `_ptsz`. With
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` the driver may reserve the graph's
/// memory while instantiating: charged like a launch.
///
/// # Safety
/// The driver's contract.
pub unsafe fn instantiate_with_params(
    real: &RealFn<sig::cuGraphInstantiateWithParams>,
    pe: *mut CUgraphExec,
    g: CUgraph,
    p: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    // SAFETY: a non-null p is the caller's CUDA_GRAPH_INSTANTIATE_PARAMS,
    // whose first field is the 64-bit `flags`.
    let flags = if p.is_null() {
        0
    } else {
        unsafe { p.cast::<u64>().read_unaligned() }
    };
    if flags & INSTANTIATE_FLAG_UPLOAD != 0 && crate::memory::tracking() {
        let mut per_dev = BTreeMap::new();
        if walk(g, &mut per_dev, 0) && !per_dev.is_empty() {
            let needs: Vec<(CUdevice, u64)> = per_dev.into_iter().collect();
            let rc = charged_around(&needs, || super::call_real!(real, pe, g, p));
            // SAFETY: pe is the caller's out-pointer.
            return unsafe { instantiated(rc, pe, g) };
        }
    }
    let rc = super::call_real!(real, pe, g, p);
    // SAFETY: pe is the caller's out-pointer.
    unsafe { instantiated(rc, pe, g) }
}

/// `cuGraphUpload` and `_ptsz`: a driver may reserve the exec's graph
/// memory at upload, so an upload is charged like a launch.
///
/// # Safety
/// The driver's contract.
pub unsafe fn upload(
    real: &RealFn<sig::cuGraphUpload>,
    exec: CUgraphExec,
    stream: CUstream,
) -> CUresult {
    launch(exec, || super::call_real!(real, exec, stream))
}

/// `cuGraphExecDestroy`: the exec is forgotten (its handle may be reused).
/// What its launches reserved stays in the device's pool, and charged.
///
/// # Safety
/// The driver's contract.
pub unsafe fn exec_destroy(real: &RealFn<sig::cuGraphExecDestroy>, exec: CUgraphExec) -> CUresult {
    forget(exec as usize);
    super::call_real!(real, exec)
}

/// `cuDeviceGraphMemTrim`: what the pool gives back is released.
///
/// # Safety
/// The driver's contract.
pub unsafe fn device_graph_mem_trim(
    real: &RealFn<sig::cuDeviceGraphMemTrim>,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    resettled(dev, || super::call_real!(real, dev))
}

/// `cuDeviceSetGraphMemAttribute` (high-water mark resets): the charge is
/// re-read.
///
/// # Safety
/// The driver's contract.
pub unsafe fn device_set_graph_mem_attribute(
    real: &RealFn<sig::cuDeviceSetGraphMemAttribute>,
    dev: CUdevice,
    attr: CUgraphMem_attribute,
    value: *mut c_void,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    resettled(dev, || super::call_real!(real, dev, attr, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exec table: every remembered exec is found (in its slots or, past
    /// them, in the map), forgotten execs are not, and the counters return
    /// to zero, so that launches take the one-load fast path again.
    #[test]
    fn the_exec_table_finds_exactly_the_remembered_execs() {
        let execs: Vec<usize> = (1..=3 * SLOTS).map(|i| 0x7000_0000 + i * 0x40).collect();
        for &e in &execs {
            remember(e, vec![(0, GRANULE)]);
        }
        assert_eq!(LIVE.load(Ordering::Acquire), execs.len());
        assert!(OVERFLOWED.load(Ordering::Acquire) > 0);
        for &e in &execs {
            assert!(has_memory(e as CUgraphExec), "{e:#x}");
            assert!(!has_memory((e + 0x20) as CUgraphExec));
        }
        for &e in &execs[..execs.len() / 2] {
            forget(e);
            assert!(!has_memory(e as CUgraphExec));
        }
        for &e in &execs[execs.len() / 2..] {
            assert!(has_memory(e as CUgraphExec), "{e:#x}");
            forget(e);
        }
        assert_eq!(LIVE.load(Ordering::Acquire), 0);
        assert_eq!(OVERFLOWED.load(Ordering::Acquire), 0);
        assert!(!has_memory(execs[0] as CUgraphExec));
        // Tombstones are reused: the table takes execs again.
        remember(execs[0], vec![(0, GRANULE)]);
        assert!(has_memory(execs[0] as CUgraphExec));
        forget(execs[0]);
        assert_eq!(LIVE.load(Ordering::Acquire), 0);
    }
}
