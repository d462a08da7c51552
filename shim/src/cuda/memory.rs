//! Device, pitched, managed, host and stream-ordered allocations, memory
//! pools, CUDA arrays, copies and memsets, pointer attributes.
//!
//! Device memory is real memory: every allocation is its own anonymous
//! `MAP_NORESERVE` mapping (lazily backed), so copies round-trip bytes and a
//! device pointer is an address in this process. Each allocation is charged
//! to the device in the shared state, rounded up to `ALLOC_GRANULE` (512 B).
//! Stream-ordered allocations are made and freed at once (pools keep no
//! cache); copies and memsets are performed at the call, in call order.

use crate::driver::{cu, Alloc, AllocKind, Array, Driver, MemOp, Obj, Pool};
use crate::{exports, guard, put, CuRes};
use cgpu_ffi::*;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

pub const ALLOC_GRANULE: u64 = 512;

pub fn charged_size(n: u64) -> u64 {
    n.div_ceil(ALLOC_GRANULE).saturating_mul(ALLOC_GRANULE)
}

pub fn map_anon(len: usize) -> Result<u64, CUresult> {
    // SAFETY: a fresh private anonymous mapping; no existing memory touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    } else {
        Ok(p as u64)
    }
}

/// Unmaps a mapping of ours (graph allocations use it).
pub fn unmap_pub(addr: u64, len: usize) {
    unmap(addr, len)
}

fn unmap(addr: u64, len: usize) {
    if len > 0 {
        // SAFETY: addr/len is a mapping we created and nobody else owns.
        unsafe { libc::munmap(addr as *mut c_void, len) };
    }
}

/// Allocates `size` bytes of device memory on the current context's device.
pub fn alloc_dev(d: &Driver, size: u64, kind: AllocKind, pool: usize) -> Result<u64, CUresult> {
    let (ctx, c) = d.cur_ctx()?;
    alloc_on(d, ctx, c.dev, size, kind, pool)
}

pub fn alloc_on(
    d: &Driver,
    ctx: usize,
    dev: usize,
    size: u64,
    kind: AllocKind,
    pool: usize,
) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let charge = charged_size(size);
    if charge > d.devs[dev].total {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    d.charge(dev, charge)?;
    let len = charge as usize;
    match map_anon(len) {
        Ok(p) => {
            d.allocs.lock().insert(
                p,
                Alloc {
                    size,
                    charged: charge,
                    dev,
                    ctx,
                    kind,
                    map_len: len,
                    pool,
                },
            );
            Ok(p)
        }
        Err(e) => {
            d.uncharge(dev, charge);
            Err(e)
        }
    }
}

/// Frees an allocation that starts at `p`.
pub fn free_dev(d: &Driver, p: u64, allow: &[AllocKind]) -> CuRes {
    let mut allocs = d.allocs.lock();
    match allocs.get(&p) {
        Some(a) if allow.contains(&a.kind) => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    let a = allocs.remove(&p).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    drop(allocs);
    super::managed::forget(p);
    super::ipc::forget_export(p);
    unmap(p, a.map_len);
    if a.charged > 0 {
        d.uncharge(a.dev, a.charged);
    }
    Ok(())
}

/// Frees every allocation of a context (at its destruction).
/// What context `from` allocated now belongs to context `to` (a green
/// context's memory is its primary context's).
pub fn reparent_ctx_allocs(d: &Driver, from: usize, to: usize) {
    for a in d.allocs.lock().values_mut() {
        if a.ctx == from {
            a.ctx = to;
        }
    }
}

pub fn free_ctx_allocs(d: &Driver, ctx: usize) {
    let victims: Vec<(u64, Alloc)> = {
        let mut allocs = d.allocs.lock();
        let keys: Vec<u64> = allocs
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter()
            .filter_map(|k| allocs.remove(&k).map(|a| (k, a)))
            .collect()
    };
    for (p, a) in victims {
        super::ipc::forget_export(p);
        unmap(p, a.map_len);
        if a.charged > 0 {
            d.uncharge(a.dev, a.charged);
        }
    }
    let arrays: Vec<usize> = d
        .objs
        .lock()
        .iter()
        .filter_map(|(h, o)| match o {
            Obj::Array(a) if a.ctx == ctx => Some(*h),
            _ => None,
        })
        .collect();
    for h in arrays {
        let _ = array_destroy(d, h);
    }
}

/// Where `[p, p+len)` lies: `Some(())` if inside one live device allocation
/// or a mapped VMM range, `None` if it is not device memory we know.
pub fn find_dev(d: &Driver, p: u64, len: u64) -> Option<bool> {
    {
        let allocs = d.allocs.lock();
        if let Some((start, a)) = allocs.range(..=p).next_back() {
            if p < start + a.size.max(a.charged) {
                return Some(
                    p.checked_add(len)
                        .is_some_and(|e| e <= start + a.size.max(a.charged)),
                );
            }
        }
    }
    if let Some(ok) = vmm_range(d, p, len) {
        return Some(ok);
    }
    super::graph::graph_mem_range(p, len)
}

/// `[p, p+len)` in VMM memory: `Some(true)` when every byte is mapped
/// with read-write access, `Some(false)` when `p` is mapped but the range
/// runs past the mappings or into one without access (which would fault:
/// refused instead), `None` when `p` is not mapped. Mappings side by side
/// (expandable segments map a growing range chunk by chunk) form one range,
/// as on a GPU.
pub fn vmm_range(d: &Driver, p: u64, len: u64) -> Option<bool> {
    let maps = d.vmm_maps.lock();
    let (start, (mlen, _)) = maps.range(..=p).next_back()?;
    let mut end = start + mlen;
    if p >= end {
        return None;
    }
    if !super::vmm::mapping_writable(*start) {
        return Some(false);
    }
    let Some(want) = p.checked_add(len) else {
        return Some(false);
    };
    while end < want {
        match maps.get(&end) {
            Some((l, _)) if super::vmm::mapping_writable(end) => end += l,
            _ => return Some(false),
        }
    }
    Some(true)
}

/// The VMM mapping that holds `p`: (start, length, physical allocation).
fn vmm_mapping_at(d: &Driver, p: u64) -> Option<(u64, u64, Arc<crate::driver::PhysMem>)> {
    let (start, len, h) = {
        let maps = d.vmm_maps.lock();
        let (s, (l, h)) = maps.range(..=p).next_back()?;
        if p >= s + l {
            return None;
        }
        (*s, *l, *h)
    };
    let phys = d.phys.lock().get(&h).cloned()?;
    Some((start, len, phys))
}

/// A device range that must be ours.
pub fn check_dev_range(d: &Driver, p: u64, len: u64) -> CuRes {
    match find_dev(d, p, len) {
        Some(true) => Ok(()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// A range of unified address space: ours and in bounds, or host (non-NULL).
fn check_any_range(d: &Driver, p: u64, len: u64) -> CuRes {
    match find_dev(d, p, len) {
        Some(true) => Ok(()),
        Some(false) => Err(CUDA_ERROR_INVALID_VALUE),
        None if p == 0 => Err(CUDA_ERROR_INVALID_VALUE),
        None => Ok(()),
    }
}

/// Copies `n` validated bytes (recorded instead when a capture is being
/// recorded on this thread: see `stream::capture_mem_ops`).
pub fn copy_pub(dst: u64, src: u64, n: usize) {
    copy(dst, src, n)
}

fn copy(dst: u64, src: u64, n: usize) {
    if super::stream::record_mem_op(|| MemOp::Copy { dst, src, len: n }) {
        return; // captured into a graph: runs at replay
    }
    // SAFETY: both ranges were validated (device ranges are our mappings;
    // host ranges are the caller's, valid for n bytes by the API contract).
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
}

/// Performs a copy or memset recorded in a graph (at its launch); the
/// ranges are checked again, as the memory may have been freed since.
pub fn run_mem_op(d: &Driver, op: &MemOp) -> CuRes {
    match op {
        MemOp::Copy { dst, src, len } => {
            check_any_range(d, *dst, *len as u64)?;
            check_any_range(d, *src, *len as u64)?;
            // SAFETY: device ranges are live mappings of ours; host ranges
            // are the ones the application captured (valid at replay by the
            // graph's contract).
            unsafe { std::ptr::copy(*src as *const u8, *dst as *mut u8, *len) };
        }
        MemOp::Set { dst, value, count } => {
            check_dev_range(d, *dst, (value.len() * count) as u64)?;
            for i in 0..*count {
                // SAFETY: inside the device range just checked.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        value.as_ptr(),
                        (*dst as *mut u8).add(i * value.len()),
                        value.len(),
                    )
                };
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ allocation

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard(|| {
        let d = cu()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = alloc_dev(d, bytesize as u64, AllocKind::Device, 0)?;
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(dptr, p, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// Legacy 32-bit `cuMemAlloc`: the simulated address space is 64-bit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: u32) -> CUresult {
    guard(|| {
        cu()?;
        if dptr.is_null() || bytesize == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::stub_hit!("cuMemAlloc");
        Err(CUDA_ERROR_NOT_SUPPORTED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard(|| {
        let d = cu()?;
        if dptr == 0 {
            return Ok(());
        }
        if let Some(r) = super::graph::graph_mem_free(dptr) {
            return r;
        }
        free_dev(
            d,
            dptr,
            &[AllocKind::Device, AllocKind::Managed, AllocKind::Async],
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: u32,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if dptr.is_null()
            || pitch.is_null()
            || width == 0
            || height == 0
            || !matches!(elem, 4 | 8 | 16)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pt = (width as u64).div_ceil(512) * 512;
        let size = pt
            .checked_mul(height as u64)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let p = alloc_dev(d, size, AllocKind::Device, 0)?;
        // SAFETY: out pointers from the caller (checked non-null).
        unsafe {
            put(pitch, pt as usize, CUDA_ERROR_INVALID_VALUE)?;
            put(dptr, p, CUDA_ERROR_INVALID_VALUE)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: u32,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if dptr.is_null() || !(flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = alloc_dev(d, bytesize as u64, AllocKind::Managed, 0)?;
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(dptr, p, CUDA_ERROR_INVALID_VALUE) }
    })
}

fn host_alloc(pp: *mut *mut c_void, size: usize) -> CuRes {
    let d = cu()?;
    if pp.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, c) = d.cur_ctx()?;
    let len = size.div_ceil(4096) * 4096;
    let p = map_anon(len)?;
    d.allocs.lock().insert(
        p,
        Alloc {
            size: size as u64,
            charged: 0,
            dev: c.dev,
            ctx,
            kind: AllocKind::Host,
            map_len: len,
            pool: 0,
        },
    );
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pp, p as *mut c_void, CUDA_ERROR_INVALID_VALUE) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    guard(|| host_alloc(pp, bytesize))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    flags: u32,
) -> CUresult {
    guard(|| {
        if flags & !0xf != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        host_alloc(pp, bytesize)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard(|| {
        let d = cu()?;
        free_dev(d, p as u64, &[AllocKind::Host])
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: u32,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if pdptr.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let a = d.allocs.lock();
        match a.range(..=(p as u64)).next_back() {
            Some((s, al)) if al.kind == AllocKind::Host && (p as u64) < s + al.size => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(pdptr, p as u64, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    _flags: u32,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if p.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, c) = d.cur_ctx()?;
        let mut a = d.allocs.lock();
        if a.contains_key(&(p as u64)) {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        a.insert(
            p as u64,
            Alloc {
                size: size as u64,
                charged: 0,
                dev: c.dev,
                ctx,
                kind: AllocKind::Host,
                map_len: 0,
                pool: 0,
            },
        );
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guard(|| {
        let d = cu()?;
        let mut a = d.allocs.lock();
        match a.get(&(p as u64)) {
            Some(al) if al.kind == AllocKind::Host && al.map_len == 0 => {
                a.remove(&(p as u64));
                Ok(())
            }
            _ => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let d = cu()?;
        if free.is_null() || total.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (_, c) = d.cur_ctx()?;
        let (f, t) = d.mem_info(c.dev);
        // SAFETY: out pointers from the caller (checked non-null).
        unsafe {
            put(free, f as usize, CUDA_ERROR_INVALID_VALUE)?;
            put(total, t as usize, CUDA_ERROR_INVALID_VALUE)
        }
    })
}

/// Legacy 32-bit variant: values saturate at 4 GiB - 1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut u32, total: *mut u32) -> CUresult {
    guard(|| {
        let d = cu()?;
        if free.is_null() || total.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (_, c) = d.cur_ctx()?;
        let (f, t) = d.mem_info(c.dev);
        // SAFETY: out pointers from the caller (checked non-null).
        unsafe {
            put(
                free,
                f.min(u32::MAX as u64) as u32,
                CUDA_ERROR_INVALID_VALUE,
            )?;
            put(
                total,
                t.min(u32::MAX as u64) as u32,
                CUDA_ERROR_INVALID_VALUE,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let a = d.allocs.lock();
        let found = match a.range(..=dptr).next_back() {
            Some((s, al)) if dptr < s + al.size && al.kind != AllocKind::Host => {
                Some((*s, al.size))
            }
            _ => None,
        };
        drop(a);
        // VMM memory: the mapping that holds it.
        let (s, al) = match found {
            Some(x) => x,
            None => vmm_mapping_at(d, dptr)
                .map(|(s, l, _)| (s, l))
                .ok_or(CUDA_ERROR_NOT_FOUND)?,
        };
        if !pbase.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { put(pbase, s, CUDA_ERROR_INVALID_VALUE)? };
        }
        if !psize.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { put(psize, al as usize, CUDA_ERROR_INVALID_VALUE)? };
        }
        Ok(())
    })
}

// ------------------------------------------------------- stream-ordered, pools

pub fn pool_of(d: &Driver, h: usize) -> Result<Arc<Pool>, CUresult> {
    match d.objs.lock().get(h) {
        Some(Obj::Pool(p)) => Ok(Arc::clone(p)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn default_pool(d: &Driver, dev: usize) -> usize {
    *d.default_pools[dev].get_or_init(|| {
        d.objs.lock().insert(Obj::Pool(Arc::new(Pool {
            managed: false,
            dev,
            attrs: parking_lot::Mutex::new(HashMap::new()),
            handle_types: 0,
            imported_from: 0,
        })))
    })
}

/// The device's default managed memory pool (CUDA 13's `cuMemGetMemPool`
/// with `CU_MEM_ALLOCATION_TYPE_MANAGED`).
pub fn default_managed_pool(d: &Driver, dev: usize) -> usize {
    *d.default_managed_pools[dev].get_or_init(|| {
        d.objs.lock().insert(Obj::Pool(Arc::new(Pool {
            managed: true,
            dev,
            attrs: parking_lot::Mutex::new(HashMap::new()),
            handle_types: 0,
            imported_from: 0,
        })))
    })
}

/// The device's current managed memory pool.
pub fn current_managed_pool(d: &Driver, dev: usize) -> usize {
    let cur = *d.current_managed_pools[dev].lock();
    if cur != 0 {
        cur
    } else {
        default_managed_pool(d, dev)
    }
}

/// The device's current pool (`cuDeviceGetMemPool`).
pub fn current_pool_pub(d: &Driver, dev: usize) -> usize {
    current_pool(d, dev)
}

fn current_pool(d: &Driver, dev: usize) -> usize {
    let cur = *d.current_pools[dev].lock();
    if cur != 0 {
        cur
    } else {
        default_pool(d, dev)
    }
}

fn alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<usize>,
    stream: CUstream,
) -> CuRes {
    let d = cu()?;
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (sdev, _) = d.stream(stream as usize)?;
    let (ctx, _) = d.cur_ctx()?;
    // A pool of another device may be used from this stream: the memory is
    // on the pool's device.
    let (pool, dev, managed) = match pool {
        Some(h) => {
            let p = pool_of(d, h)?;
            // An imported pool only maps what its owner exports.
            if p.imported_from != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            (h, p.dev, p.managed)
        }
        None => (current_pool(d, sdev), sdev, false),
    };
    if size == 0 {
        // The driver succeeds and returns NULL (which cuMemFreeAsync accepts).
        // SAFETY: out pointer from the caller (checked non-null).
        return unsafe { put(dptr, 0, CUDA_ERROR_INVALID_VALUE) };
    }
    // Into a capturing stream, the allocation becomes a memory alloc node:
    // its address now, its memory when the graph is launched.
    let mut captured = Err(CUDA_ERROR_UNKNOWN);
    let recorded = super::stream::record_node_if_capturing(stream as usize, || {
        match super::graph::new_graph_alloc(d, dev, size as u64, managed) {
            Ok(ga) => {
                captured = Ok(ga.ptr);
                super::graph::NodeKind::MemAlloc(ga)
            }
            Err(e) => {
                captured = Err(e);
                super::graph::NodeKind::Empty
            }
        }
    })?;
    if recorded {
        let captured = captured?;
        // SAFETY: out pointer from the caller (checked non-null).
        return unsafe { put(dptr, captured, CUDA_ERROR_INVALID_VALUE) };
    }
    // A managed pool's allocations are managed memory.
    let kind = if managed {
        AllocKind::Managed
    } else {
        AllocKind::Async
    };
    let p = alloc_on(d, ctx, dev, size as u64, kind, pool)?;
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(dptr, p, CUDA_ERROR_INVALID_VALUE) }
}

exports! {
    cuMemAllocAsync | cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) => alloc_async(dptr, size, None, stream);
}

exports! {
    cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream) => alloc_async(dptr, size, Some(pool as usize), stream);
}

fn free_async(dptr: CUdeviceptr, stream: CUstream) -> CuRes {
    let d = cu()?;
    d.stream(stream as usize)?;
    if dptr == 0 {
        // What a zero-byte allocation returned.
        return Ok(());
    }
    // Freeing graph memory into a capturing stream is a memory free node.
    if super::graph::is_graph_alloc(dptr)
        && super::stream::record_node_if_capturing(stream as usize, || {
            super::graph::NodeKind::MemFree(dptr)
        })?
    {
        return Ok(());
    }
    if let Some(r) = super::graph::graph_mem_free(dptr) {
        return r;
    }
    free_dev(
        d,
        dptr,
        &[AllocKind::Async, AllocKind::Device, AllocKind::Managed],
    )
}

exports! {
    cuMemFreeAsync | cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) => free_async(dptr, stream);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if pool.is_null() || props.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null pointer to CUmemPoolProps from the caller.
        let pr = unsafe { props.read_unaligned() };
        // Pinned (1) or managed (2) memory on a device; a managed pool
        // cannot be exported.
        let managed = pr.allocType == 2;
        if !(pr.allocType == 1 || managed && pr.handleTypes == 0) || pr.location.type_ != 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = d.check_dev(pr.location.id)?;
        let h = d.objs.lock().insert(Obj::Pool(Arc::new(Pool {
            managed,
            dev,
            attrs: parking_lot::Mutex::new(HashMap::new()),
            handle_types: pr.handleTypes,
            imported_from: 0,
        })));
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(pool, h as CUmemoryPool, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let d = cu()?;
        let h = pool as usize;
        let p = pool_of(d, h)?;
        if d.default_pools[p.dev].get() == Some(&h)
            || d.default_managed_pools[p.dev].get() == Some(&h)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Allocations still out are freed with the pool.
        let keys: Vec<u64> = d
            .allocs
            .lock()
            .iter()
            .filter(|(_, a)| a.pool == h)
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            let _ = free_dev(d, k, &[AllocKind::Async, AllocKind::Managed]);
        }
        for cur in [&d.current_pools[p.dev], &d.current_managed_pools[p.dev]] {
            let mut cur = cur.lock();
            if *cur == h {
                *cur = 0;
            }
        }
        d.objs.lock().remove(h);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        // SAFETY: out pointer from the caller.
        unsafe {
            put(
                pool,
                default_pool(d, i) as CUmemoryPool,
                CUDA_ERROR_INVALID_VALUE,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        // SAFETY: out pointer from the caller.
        unsafe {
            put(
                pool,
                current_pool(d, i) as CUmemoryPool,
                CUDA_ERROR_INVALID_VALUE,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        let p = pool_of(d, pool as usize)?;
        if p.dev != i {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        *d.current_pools[i].lock() = pool as usize;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, _keep: usize) -> CUresult {
    guard(|| pool_of(cu()?, pool as usize).map(|_| ()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: i32,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let p = pool_of(cu()?, pool as usize)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = match attr {
            // SAFETY: int-valued attributes: value points to an int.
            1..=3 => (unsafe { (value as *const i32).read_unaligned() }) as u64,
            // SAFETY: u64-valued attributes: value points to a cuuint64_t.
            4 | 6 | 8 => unsafe { (value as *const u64).read_unaligned() },
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        p.attrs.lock().insert(attr, v);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: i32,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let h = pool as usize;
        let p = pool_of(d, h)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let used: u64 = d
            .allocs
            .lock()
            .values()
            .filter(|a| a.pool == h)
            .map(|a| a.charged)
            .sum();
        let stored = p.attrs.lock().get(&attr).copied();
        match attr {
            1..=3 => {
                // SAFETY: int-valued attribute: value points to an int.
                unsafe { (value as *mut i32).write_unaligned(stored.unwrap_or(1) as i32) };
            }
            4..=8 => {
                let v = match attr {
                    4 => stored.unwrap_or(0),
                    5 | 7 => used,
                    _ => stored.unwrap_or(used).max(used),
                };
                // SAFETY: u64-valued attribute: value points to a cuuint64_t.
                unsafe { (value as *mut u64).write_unaligned(v) };
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}

// ----------------------------------------------------------------------- arrays

pub fn format_bytes(f: u32) -> Option<u64> {
    Some(match f {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

fn array_create(
    parr: *mut CUarray,
    w: usize,
    h: usize,
    depth: usize,
    format: u32,
    ch: u32,
) -> CuRes {
    let d = cu()?;
    if parr.is_null() || w == 0 || !matches!(ch, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let fb = format_bytes(format).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let bytes = (w as u64)
        .checked_mul(h.max(1) as u64)
        .and_then(|v| v.checked_mul(depth.max(1) as u64))
        .and_then(|v| v.checked_mul(fb * ch as u64))
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let (ctx, c) = d.cur_ctx()?;
    // Arrays are opaque: their backing is not in the pointer map.
    let charged = charged_size(bytes);
    if charged > d.devs[c.dev].total {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    d.charge(c.dev, charged)?;
    let base = match map_anon(charged as usize) {
        Ok(b) => b,
        Err(e) => {
            d.uncharge(c.dev, charged);
            return Err(e);
        }
    };
    let h = d.objs.lock().insert(Obj::Array(Arc::new(Array {
        dev: c.dev,
        bytes: charged,
        ctx,
        base,
        dims: [w, h, depth],
        format,
        channels: ch,
    })));
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(parr, h as CUarray, CUDA_ERROR_INVALID_VALUE) }
}

fn array_destroy(d: &Driver, h: usize) -> CuRes {
    let removed = d.objs.lock().remove(h);
    let a = match removed {
        Some(Obj::Array(a)) => a,
        Some(o) => {
            d.objs.lock().insert_at(h, o);
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        None => return Err(CUDA_ERROR_INVALID_HANDLE),
    };
    unmap(a.base, a.bytes as usize);
    d.uncharge(a.dev, a.bytes);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    parr: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null descriptor from the caller.
        let ds = unsafe { desc.read_unaligned() };
        array_create(
            parr,
            ds.Width,
            ds.Height,
            0,
            ds.Format as u32,
            ds.NumChannels,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    parr: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null descriptor from the caller.
        let ds = unsafe { desc.read_unaligned() };
        super::array::no_sparse_or_deferred(ds.Flags)?;
        array_create(
            parr,
            ds.Width,
            ds.Height,
            ds.Depth,
            ds.Format as u32,
            ds.NumChannels,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(arr: CUarray) -> CUresult {
    guard(|| array_destroy(cu()?, arr as usize))
}

// ----------------------------------------------------------------------- copies

fn memcpy_htod(dst: CUdeviceptr, src: *const c_void, n: usize) -> CuRes {
    let d = cu()?;
    if n == 0 {
        return Ok(());
    }
    if src.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_dev_range(d, dst, n as u64)?;
    copy(dst, src as u64, n);
    Ok(())
}

fn memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CuRes {
    let d = cu()?;
    if n == 0 {
        return Ok(());
    }
    if dst.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_dev_range(d, src, n as u64)?;
    copy(dst as u64, src, n);
    Ok(())
}

fn memcpy_dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CuRes {
    let d = cu()?;
    if n == 0 {
        return Ok(());
    }
    check_dev_range(d, dst, n as u64)?;
    check_dev_range(d, src, n as u64)?;
    copy(dst, src, n);
    Ok(())
}

fn memcpy_any(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CuRes {
    let d = cu()?;
    if n == 0 {
        return Ok(());
    }
    check_any_range(d, dst, n as u64)?;
    check_any_range(d, src, n as u64)?;
    copy(dst, src, n);
    Ok(())
}

/// An async copy or memset on `stream` (recorded instead when it captures).
fn with_stream(stream: CUstream, f: impl FnOnce() -> CuRes) -> CuRes {
    super::stream::capture_mem_ops(stream as usize, f)
}

/// The copy and memset families: one implementation `$imp`, its variants
/// (`_v2`, `_ptds`, `Async`, `_ptsz`) declared through `exports!`; an
/// `async` variant takes a trailing stream.
macro_rules! variants {
    (async $imp:ident ($($a:ident : $t:ty),*) => $($name:ident),+) => {
        exports! { $($name)|+ ($($a: $t,)* stream: CUstream) => with_stream(stream, || $imp($($a),*)); }
    };
    ($imp:ident ($($a:ident : $t:ty),*) => $($name:ident),+) => {
        exports! { $($name)|+ ($($a: $t),*) => $imp($($a),*); }
    };
}

variants!(memcpy_htod(dst: CUdeviceptr, src: *const c_void, n: usize) => cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds);
variants!(memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) => cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds);
variants!(memcpy_dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds);
variants!(memcpy_any(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => cuMemcpy, cuMemcpy_ptds);
variants!(async memcpy_htod(dst: CUdeviceptr, src: *const c_void, n: usize) => cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz);
variants!(async memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) => cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz);
variants!(async memcpy_dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz);
variants!(async memcpy_any(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => cuMemcpyAsync, cuMemcpyAsync_ptsz);

fn memcpy_peer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
) -> CuRes {
    let d = cu()?;
    d.ctx(dst_ctx as usize)?;
    d.ctx(src_ctx as usize)?;
    memcpy_dtod(dst, src, n)
}
variants!(memcpy_peer(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) => cuMemcpyPeer, cuMemcpyPeer_ptds);
variants!(async memcpy_peer(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) => cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz);

/// `CUDA_MEMCPY2D_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaMemcpy2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: CUarray,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: CUarray,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

fn memcpy_2d(p: *const CudaMemcpy2D) -> CuRes {
    let d = cu()?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null descriptor from the caller.
    let m = unsafe { p.read_unaligned() };
    let (w, h) = (m.width_in_bytes as u64, m.height as u64);
    if w == 0 || h == 0 {
        return Ok(());
    }
    // An array side: its backing's start and end (copies are checked
    // against it) and its row size (the pitch of its rows).
    let arr = |a: CUarray| -> Result<(u64, u64, u64), CUresult> {
        match d.objs.lock().get(a as usize) {
            Some(Obj::Array(x)) => Ok((
                x.base,
                x.base + x.row_bytes() * x.rows() * x.layers(),
                x.row_bytes(),
            )),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    };
    let arr_base = |a: CUarray| arr(a).map(|x| x.0);
    // memory types: 1 host, 2 device, 3 array, 4 unified
    let base = |ty: u32, host: u64, dev: u64, arr: CUarray| -> Result<(u64, bool), CUresult> {
        match ty {
            1 => Ok((host, false)),
            2 => Ok((dev, true)),
            3 => Ok((arr_base(arr)?, false)),
            4 => Ok((dev, find_dev(d, dev, 1).is_some())),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    };
    let (sb, sdev) = base(
        m.src_memory_type,
        m.src_host as u64,
        m.src_device,
        m.src_array,
    )?;
    let (db, ddev) = base(
        m.dst_memory_type,
        m.dst_host as u64,
        m.dst_device,
        m.dst_array,
    )?;
    let pitch_of = |ty: u32, arr_h: CUarray, given: usize| -> Result<u64, CUresult> {
        if ty == 3 {
            arr(arr_h).map(|x| x.2)
        } else {
            Ok(given.max(m.width_in_bytes) as u64)
        }
    };
    let (sp, dp) = (
        pitch_of(m.src_memory_type, m.src_array, m.src_pitch)?,
        pitch_of(m.dst_memory_type, m.dst_array, m.dst_pitch)?,
    );
    if sb == 0 || db == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s0 = sb + m.src_y as u64 * sp + m.src_x_in_bytes as u64;
    let d0 = db + m.dst_y as u64 * dp + m.dst_x_in_bytes as u64;
    let span = |p: u64| (h - 1) * p + w;
    if sdev {
        check_dev_range(d, s0, span(sp))?;
    }
    if ddev {
        check_dev_range(d, d0, span(dp))?;
    }
    // Array sides stay inside the array.
    let inside = |ty: u32, a: CUarray, start: u64, p: u64| -> CuRes {
        if ty != 3 {
            return Ok(());
        }
        let (lo, hi, _) = arr(a)?;
        if start >= lo && start.checked_add(span(p)).is_some_and(|e| e <= hi) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    };
    inside(m.src_memory_type, m.src_array, s0, sp)?;
    inside(m.dst_memory_type, m.dst_array, d0, dp)?;
    for row in 0..h {
        copy(d0 + row * dp, s0 + row * sp, w as usize);
    }
    Ok(())
}
variants!(memcpy_2d(p: *const CudaMemcpy2D) => cuMemcpy2D_v2, cuMemcpy2D_v2_ptds, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds);
variants!(async memcpy_2d(p: *const CudaMemcpy2D) => cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz);

// ---------------------------------------------------------------------- memsets

pub fn memset_n<T: Copy>(dst: CUdeviceptr, v: T, n: usize) -> CuRes {
    let d = cu()?;
    if n == 0 {
        return Ok(());
    }
    let sz = std::mem::size_of::<T>() as u64;
    if dst % sz != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_dev_range(d, dst, n as u64 * sz)?;
    let value = || {
        // SAFETY: T is a plain integer (u8/u16/u32); viewing its bytes.
        let b = unsafe { std::slice::from_raw_parts(&v as *const T as *const u8, sz as usize) };
        MemOp::Set {
            dst,
            value: b.to_vec(),
            count: n,
        }
    };
    if super::stream::record_mem_op(value) {
        return Ok(()); // captured into a graph: runs at replay
    }
    let p = dst as *mut T;
    for i in 0..n {
        // SAFETY: within a validated device range we mapped, aligned for T.
        unsafe { p.add(i).write(v) };
    }
    Ok(())
}

fn memset2d_n<T: Copy>(dst: CUdeviceptr, pitch: usize, v: T, w: usize, h: usize) -> CuRes {
    for row in 0..h {
        memset_n(dst + (row * pitch) as u64, v, w)?;
    }
    Ok(())
}

fn memset8(dst: CUdeviceptr, v: u8, n: usize) -> CuRes {
    memset_n(dst, v, n)
}
fn memset16(dst: CUdeviceptr, v: u16, n: usize) -> CuRes {
    memset_n(dst, v, n)
}
fn memset32(dst: CUdeviceptr, v: u32, n: usize) -> CuRes {
    memset_n(dst, v, n)
}
fn memset2d8(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize) -> CuRes {
    memset2d_n(dst, pitch, v, w, h)
}
fn memset2d16(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize) -> CuRes {
    memset2d_n(dst, pitch, v, w, h)
}
fn memset2d32(dst: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize) -> CuRes {
    memset2d_n(dst, pitch, v, w, h)
}
variants!(memset8(dst: CUdeviceptr, v: u8, n: usize) => cuMemsetD8_v2, cuMemsetD8_v2_ptds);
variants!(memset16(dst: CUdeviceptr, v: u16, n: usize) => cuMemsetD16_v2, cuMemsetD16_v2_ptds);
variants!(memset32(dst: CUdeviceptr, v: u32, n: usize) => cuMemsetD32_v2, cuMemsetD32_v2_ptds);
variants!(async memset8(dst: CUdeviceptr, v: u8, n: usize) => cuMemsetD8Async, cuMemsetD8Async_ptsz);
variants!(async memset16(dst: CUdeviceptr, v: u16, n: usize) => cuMemsetD16Async, cuMemsetD16Async_ptsz);
variants!(async memset32(dst: CUdeviceptr, v: u32, n: usize) => cuMemsetD32Async, cuMemsetD32Async_ptsz);
variants!(memset2d8(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize) => cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds);
variants!(memset2d16(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize) => cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds);
variants!(memset2d32(dst: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize) => cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds);
variants!(async memset2d8(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize) => cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz);
variants!(async memset2d16(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize) => cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz);
variants!(async memset2d32(dst: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize) => cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz);

// ----------------------------------------------------------- pointer attributes

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: u32,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let a = {
            let allocs = d.allocs.lock();
            match allocs.range(..=ptr).next_back() {
                Some((s, a)) if ptr < s + a.size => Some((*s, a.clone())),
                _ => None,
            }
        };
        let (start, a) = match a {
            Some(x) => x,
            None if vmm_mapping_at(d, ptr).is_some() => {
                return vmm_pointer_attr(d, data, attr, ptr)
            }
            // Graph memory: device (or managed) memory of the graph's device.
            None => {
                let (start, size, dev, managed) =
                    super::graph::graph_alloc_at(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                (
                    start,
                    Alloc {
                        size,
                        charged: 0,
                        dev,
                        ctx: d.cur_ctx().map(|c| c.0).unwrap_or(0),
                        kind: if managed {
                            AllocKind::Managed
                        } else {
                            AllocKind::Device
                        },
                        map_len: 0,
                        pool: 0,
                    },
                )
            }
        };
        let host = a.kind == AllocKind::Host;
        // SAFETY (all writes below): data points to storage of the attribute's
        // documented type, by the caller's contract.
        unsafe {
            match attr {
                1 => (data as *mut usize).write_unaligned(a.ctx),
                2 => (data as *mut u32).write_unaligned(if host { 1 } else { 2 }),
                3 => (data as *mut u64).write_unaligned(ptr),
                // Host pointer: host and managed memory only.
                4 if host || a.kind == AllocKind::Managed => {
                    (data as *mut u64).write_unaligned(ptr)
                }
                4 => return Err(CUDA_ERROR_INVALID_VALUE),
                6 => (data as *mut u32).write_unaligned(super::managed::sync_memops(start) as u32),
                // Buffer id: unique per allocation while it lives.
                7 => (data as *mut u64).write_unaligned(start),
                8 => (data as *mut u32).write_unaligned((a.kind == AllocKind::Managed) as u32),
                9 => (data as *mut i32).write_unaligned(a.dev as i32),
                10 | 15 => (data as *mut u32).write_unaligned(0),
                11 => (data as *mut u64).write_unaligned(start),
                12 => (data as *mut usize).write_unaligned(a.size as usize),
                13 => (data as *mut u32).write_unaligned(1),
                14 => (data as *mut u64).write_unaligned(0),
                // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                16 => (data as *mut u32).write_unaligned(3),
                17 if a.pool != 0 => (data as *mut usize).write_unaligned(a.pool),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut u32, p: *mut c_void) -> CUresult {
    guard(|| {
        let d = cu()?;
        let a = d.allocs.lock();
        match a.range(..=(p as u64)).next_back() {
            Some((s, al)) if al.kind == AllocKind::Host && (p as u64) < s + al.size => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        // SAFETY: out pointer from the caller.
        unsafe { put(flags, 0, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// `cuPointerGetAttribute` on memory mapped with `cuMemMap`: device memory
/// of the physical allocation's device, with no context (as the driver
/// answers for memory that belongs to no context), its range the mapping.
fn vmm_pointer_attr(d: &Driver, data: *mut c_void, attr: u32, ptr: u64) -> CuRes {
    let (start, len, phys) = vmm_mapping_at(d, ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY (all writes below): data points to storage of the attribute's
    // documented type, by the caller's contract (checked non-null).
    unsafe {
        match attr {
            1 => (data as *mut usize).write_unaligned(0),
            2 => (data as *mut u32).write_unaligned(2), // CU_MEMORYTYPE_DEVICE
            3 => (data as *mut u64).write_unaligned(ptr),
            6 => (data as *mut u32).write_unaligned(0),
            7 => (data as *mut u64).write_unaligned(start),
            8 | 10 | 15 => (data as *mut u32).write_unaligned(0),
            9 => (data as *mut i32).write_unaligned(phys.dev as i32),
            11 => (data as *mut u64).write_unaligned(start),
            12 => (data as *mut usize).write_unaligned(len as usize),
            13 => (data as *mut u32).write_unaligned(1),
            14 => (data as *mut u64).write_unaligned(phys.handle_types as u64),
            16 => (data as *mut u32).write_unaligned(3),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(())
}

/// Size of each `CUpointer_attribute` value (for NULL defaults).
fn pointer_attr_size(attr: u32) -> usize {
    match attr {
        1 | 3 | 4 | 7 | 11 | 12 | 14 | 16 => 8,
        5 => 16,
        _ => 4,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: u32,
    attrs: *const u32,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        cu()?;
        if n > 0 && (attrs.is_null() || data.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n as usize {
            // SAFETY: attrs and data hold n entries by the caller's contract.
            let (a, out) = unsafe { (*attrs.add(i), *data.add(i)) };
            if out.is_null() {
                continue;
            }
            // SAFETY: same contract as cuPointerGetAttribute for each entry.
            if unsafe { cuPointerGetAttribute(out, a, ptr) } != CUDA_SUCCESS {
                // Not a CUDA pointer: NULL defaults and success, as documented.
                // SAFETY: out has room for the attribute's value.
                unsafe { std::ptr::write_bytes(out as *mut u8, 0, pointer_attr_size(a)) };
            }
        }
        Ok(())
    })
}

/// Creates an array (mipmap levels use it).
pub fn array_create_pub(
    parr: *mut CUarray,
    w: usize,
    h: usize,
    depth: usize,
    format: u32,
    ch: u32,
) -> CuRes {
    array_create(parr, w, h, depth, format, ch)
}

/// Destroys an array by handle (mipmap levels use it).
pub fn array_destroy_pub(d: &Driver, h: usize) -> CuRes {
    array_destroy(d, h)
}

/// `cuMemcpyWithAttributesAsync` (CUDA 12.8): one copy in stream order; the
/// attributes (source access order, location hints) change nothing in the
/// sim, whose copies are plain memory copies.
fn memcpy_with_attributes(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    attr: *const c_void,
    s: CUstream,
) -> CuRes {
    cu()?;
    if attr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: our own function, with the caller's arguments.
    match unsafe { cuMemcpyAsync(dst, src, n, s) } {
        CUDA_SUCCESS => Ok(()),
        e => Err(e),
    }
}

exports! {
    cuMemcpyWithAttributesAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, attr: *const c_void, s: CUstream)
        => memcpy_with_attributes(dst, src, n, attr, s);
}
