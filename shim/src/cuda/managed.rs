//! Managed-memory hints and range attributes, settable pointer attributes,
//! pool access and the CUDA 13 pool-by-location calls.
//!
//! `cuMemAdvise` and `cuMemPrefetchAsync` record what they were told per
//! allocation (read-mostly, preferred location, accessed-by devices, last
//! prefetch location), and `cuMemRangeGetAttribute(s)` reads it back, as the
//! driver does for managed memory (the data itself never moves: device and
//! host share one mapping in the sim).

use crate::driver::{cu, AllocKind, Driver, Obj, Pool};
use crate::{exports, put, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// `CU_DEVICE_CPU` / `CU_DEVICE_INVALID`.
const DEVICE_CPU: i32 = -1;
const DEVICE_INVALID: i32 = -2;

#[derive(Default, Clone)]
struct Hints {
    read_mostly: bool,
    preferred: Option<i32>,
    accessed_by: BTreeSet<i32>,
    last_prefetch: Option<i32>,
    sync_memops: bool,
}

fn hints() -> &'static Mutex<HashMap<u64, Hints>> {
    static H: OnceLock<Mutex<HashMap<u64, Hints>>> = OnceLock::new();
    H.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The start and kind of the allocation holding `[p, p+n)`.
fn alloc_at(d: &Driver, p: u64, n: u64) -> Result<(u64, AllocKind), CUresult> {
    let allocs = d.allocs.lock();
    match allocs.range(..=p).next_back() {
        Some((s, a)) if p.checked_add(n.max(1)).is_some_and(|e| e <= s + a.size) => {
            Ok((*s, a.kind))
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuPointerSetAttribute(SYNC_MEMOPS)` as last set on the allocation at
/// `start` (false until set).
pub fn sync_memops(start: u64) -> bool {
    hints().lock().get(&start).is_some_and(|h| h.sync_memops)
}

/// A location as a device number (`CU_DEVICE_CPU` for the host).
fn loc_dev(d: &Driver, ty: i32, id: i32) -> Result<i32, CUresult> {
    // CUmemLocationType: device 1, host 2, host NUMA 3, host NUMA current 4
    match ty {
        1 => d.check_dev(id).map(|x| x as i32),
        2..=4 => Ok(DEVICE_CPU),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn dev_or_cpu(d: &Driver, dev: CUdevice) -> Result<i32, CUresult> {
    if dev == DEVICE_CPU {
        Ok(DEVICE_CPU)
    } else {
        d.check_dev(dev).map(|x| x as i32)
    }
}

fn advise(p: CUdeviceptr, n: usize, advice: u32, dev: i32) -> CuRes {
    let d = cu()?;
    let (start, kind) = alloc_at(d, p, n as u64)?;
    if kind != AllocKind::Managed {
        // Hints on other memory are accepted and have no effect.
        return Ok(());
    }
    let mut h = hints().lock();
    let e = h.entry(start).or_default();
    // CUmem_advise: set/unset read mostly 1/2, preferred location 3/4,
    // accessed by 5/6.
    match advice {
        1 => e.read_mostly = true,
        2 => e.read_mostly = false,
        3 => e.preferred = Some(dev),
        4 => e.preferred = None,
        5 => {
            e.accessed_by.insert(dev);
        }
        6 => {
            e.accessed_by.remove(&dev);
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

fn prefetch(p: CUdeviceptr, n: usize, dev: i32, stream: CUstream) -> CuRes {
    let d = cu()?;
    d.stream(stream as usize)?;
    let (start, kind) = alloc_at(d, p, n as u64)?;
    if kind != AllocKind::Managed {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    hints().lock().entry(start).or_default().last_prefetch = Some(dev);
    Ok(())
}

/// One range attribute into `data` (`size` bytes).
fn range_attr(data: *mut c_void, size: usize, attr: u32, p: CUdeviceptr, n: usize) -> CuRes {
    let d = cu()?;
    if data.is_null() || n == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (start, kind) = alloc_at(d, p, n as u64)?;
    if kind != AllocKind::Managed {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = hints().lock().get(&start).cloned().unwrap_or_default();
    let int = |v: i32| -> CuRes {
        if size < 4 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: data holds `size` >= 4 bytes by the caller's contract.
        unsafe { (data as *mut i32).write_unaligned(v) };
        Ok(())
    };
    // location type for the *_TYPE attributes: invalid 0, device 1, host 2
    let ty = |v: Option<i32>| match v {
        None => 0,
        Some(DEVICE_CPU) => 2,
        Some(_) => 1,
    };
    match attr {
        1 => int(h.read_mostly as i32),
        2 => int(h.preferred.unwrap_or(DEVICE_INVALID)),
        3 => {
            // an int array of `size / 4` entries, CU_DEVICE_INVALID-padded
            if size % 4 != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let slots = size / 4;
            let v: Vec<i32> = h.accessed_by.iter().copied().collect();
            for i in 0..slots {
                // SAFETY: data holds `size` bytes = slots ints.
                unsafe {
                    (data as *mut i32)
                        .add(i)
                        .write_unaligned(v.get(i).copied().unwrap_or(DEVICE_INVALID))
                };
            }
            Ok(())
        }
        4 => int(h.last_prefetch.unwrap_or(DEVICE_INVALID)),
        5 => int(ty(h.preferred)),
        6 => int(h.preferred.unwrap_or(DEVICE_INVALID).max(DEVICE_INVALID)),
        7 => int(ty(h.last_prefetch)),
        8 => int(h.last_prefetch.unwrap_or(DEVICE_INVALID)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn range_attrs(
    data: *mut *mut c_void,
    sizes: *const usize,
    attrs: *const u32,
    num: usize,
    p: CUdeviceptr,
    n: usize,
) -> CuRes {
    if data.is_null() || sizes.is_null() || attrs.is_null() || num == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..num {
        // SAFETY: three arrays of `num` entries by the caller's contract.
        let (buf, size, attr) = unsafe { (*data.add(i), *sizes.add(i), *attrs.add(i)) };
        range_attr(buf, size, attr, p, n)?;
    }
    Ok(())
}

fn pointer_set(value: *const c_void, attr: u32, p: CUdeviceptr) -> CuRes {
    let d = cu()?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (start, _) = alloc_at(d, p, 1)?;
    // Only CU_POINTER_ATTRIBUTE_SYNC_MEMOPS (6) can be set.
    if attr != 6 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: value points to an unsigned int (the attribute's type).
    let v = unsafe { (value as *const u32).read_unaligned() };
    hints().lock().entry(start).or_default().sync_memops = v != 0;
    Ok(())
}

/// Forgets the hints of a freed allocation.
pub fn forget(start: u64) {
    hints().lock().remove(&start);
}

// ------------------------------------------------------------------- pools

fn pool_of(d: &Driver, h: usize) -> Result<Arc<Pool>, CUresult> {
    match d.objs.lock().get(h) {
        Some(Obj::Pool(p)) => Ok(Arc::clone(p)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Pool attribute keys above the driver's: access of device `d` is kept
/// under `ACCESS_KEY + d`.
const ACCESS_KEY: i32 = 1 << 20;

fn pool_set_access(pool: CUmemoryPool, map: *const CUmemAccessDesc, n: usize) -> CuRes {
    let d = cu()?;
    let p = pool_of(d, pool as usize)?;
    if n > 0 && map.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The count is bounded by the devices there are: check it first.
    if n > d.devs.len() * 4 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut set = Vec::new();
    for i in 0..n {
        // SAFETY: map holds n descriptors by the caller's contract.
        let a = unsafe { map.add(i).read_unaligned() };
        if a.location.type_ != 1 || a.flags > 3 || a.flags == 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = d.check_dev(a.location.id)?;
        // The pool's own device always has read-write access.
        if dev == p.dev && a.flags != 3 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        set.push((dev, a.flags as u64));
    }
    let mut attrs = p.attrs.lock();
    for (dev, f) in set {
        attrs.insert(ACCESS_KEY + dev as i32, f);
    }
    Ok(())
}

fn pool_get_access(flags: *mut u32, pool: CUmemoryPool, loc: *const CUmemLocation) -> CuRes {
    let d = cu()?;
    let p = pool_of(d, pool as usize)?;
    if loc.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null location from the caller.
    let l = unsafe { loc.read_unaligned() };
    if l.type_ != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = d.check_dev(l.id)?;
    let f = if dev == p.dev {
        3
    } else {
        p.attrs
            .lock()
            .get(&(ACCESS_KEY + dev as i32))
            .copied()
            .unwrap_or(0) as u32
    };
    // SAFETY: out pointer from the caller.
    unsafe { put(flags, f, CUDA_ERROR_INVALID_VALUE) }
}

/// The device a (location, allocation type) names, for the CUDA 13
/// pool-by-location calls: pinned (1) and managed (2) pools of a device are
/// simulated.
fn pool_location(d: &Driver, loc: *const CUmemLocation, ty: u32) -> Result<usize, CUresult> {
    if loc.is_null() || !(1..=2).contains(&ty) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null location from the caller.
    let l = unsafe { loc.read_unaligned() };
    match l.type_ {
        1 => d.check_dev(l.id),
        2..=4 => {
            crate::stub_hit!("cuMemGetMemPool(host location)");
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn get_mem_pool(
    out: *mut CUmemoryPool,
    loc: *const CUmemLocation,
    ty: u32,
    default: bool,
) -> CuRes {
    let d = cu()?;
    let dev = pool_location(d, loc, ty)?;
    let h = match (ty == 2, default) {
        (true, true) => super::memory::default_managed_pool(d, dev),
        (true, false) => super::memory::current_managed_pool(d, dev),
        (false, true) => super::memory::default_pool(d, dev),
        (false, false) => super::memory::current_pool_pub(d, dev),
    };
    // SAFETY: out pointer from the caller.
    unsafe { put(out, h as CUmemoryPool, CUDA_ERROR_INVALID_VALUE) }
}

fn set_mem_pool(loc: *const CUmemLocation, ty: u32, pool: CUmemoryPool) -> CuRes {
    let d = cu()?;
    let dev = pool_location(d, loc, ty)?;
    let p = pool_of(d, pool as usize)?;
    if p.dev != dev || p.managed != (ty == 2) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if p.managed {
        *d.current_managed_pools[dev].lock() = pool as usize;
    } else {
        *d.current_pools[dev].lock() = pool as usize;
    }
    Ok(())
}

exports! {
    cuMemAdvise(p: CUdeviceptr, n: usize, advice: u32, dev: CUdevice)
        => advise(p, n, advice, dev_or_cpu(cu()?, dev)?);
    cuMemAdvise_v2(p: CUdeviceptr, n: usize, advice: u32, loc: CUmemLocation)
        => advise(p, n, advice, loc_dev(cu()?, loc.type_, loc.id)?);
    cuMemPrefetchAsync | cuMemPrefetchAsync_ptsz(p: CUdeviceptr, n: usize, dev: CUdevice, stream: CUstream)
        => prefetch(p, n, dev_or_cpu(cu()?, dev)?, stream);
    cuMemPrefetchAsync_v2 | cuMemPrefetchAsync_v2_ptsz(p: CUdeviceptr, n: usize, loc: CUmemLocation, _flags: u32, stream: CUstream)
        => prefetch(p, n, loc_dev(cu()?, loc.type_, loc.id)?, stream);
    cuMemRangeGetAttribute(data: *mut c_void, size: usize, attr: u32, p: CUdeviceptr, n: usize)
        => range_attr(data, size, attr, p, n);
    cuMemRangeGetAttributes(data: *mut *mut c_void, sizes: *const usize, attrs: *const u32, num: usize, p: CUdeviceptr, n: usize)
        => range_attrs(data, sizes, attrs, num, p, n);
    cuPointerSetAttribute(value: *const c_void, attr: u32, p: CUdeviceptr) => pointer_set(value, attr, p);
    cuMemPoolSetAccess(pool: CUmemoryPool, map: *const CUmemAccessDesc, n: usize) => pool_set_access(pool, map, n);
    cuMemPoolGetAccess(flags: *mut u32, pool: CUmemoryPool, loc: *const CUmemLocation) => pool_get_access(flags, pool, loc);
    cuMemGetMemPool(out: *mut CUmemoryPool, loc: *const CUmemLocation, ty: u32) => get_mem_pool(out, loc, ty, false);
    cuMemGetDefaultMemPool(out: *mut CUmemoryPool, loc: *const CUmemLocation, ty: u32) => get_mem_pool(out, loc, ty, true);
    cuMemSetMemPool(loc: *const CUmemLocation, ty: u32, pool: CUmemoryPool) => set_mem_pool(loc, ty, pool);
}

/// The location of entry `i` of a batch: the last `locs[j]` whose first
/// index `idxs[j]` is at most `i` (indices ascending, the first 0).
fn batch_loc(
    d: &Driver,
    locs: *const CUmemLocation,
    idxs: *const usize,
    nlocs: usize,
    i: usize,
) -> Result<i32, CUresult> {
    let mut pick = None;
    for j in 0..nlocs {
        // SAFETY: idxs and locs hold nlocs entries by the caller's contract.
        let (first, loc) = unsafe { (*idxs.add(j), locs.add(j).read_unaligned()) };
        if first <= i {
            pick = Some(loc);
        }
    }
    let l = pick.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    loc_dev(d, l.type_, l.id)
}

/// `cuMemPrefetchBatchAsync`, `cuMemDiscardBatchAsync`,
/// `cuMemDiscardAndPrefetchBatchAsync` (CUDA 13): every range is checked
/// (managed memory), prefetches are recorded like `cuMemPrefetchAsync`; a
/// discard leaves the bytes as they are (their contents are undefined after
/// it, so keeping them is allowed).
#[allow(clippy::too_many_arguments)]
fn batch_hint(
    ptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    locs: *const CUmemLocation,
    idxs: *const usize,
    nlocs: usize,
    flags: u64,
    stream: CUstream,
    prefetch: bool,
) -> CuRes {
    let d = cu()?;
    d.stream(stream as usize)?;
    if ptrs.is_null() || sizes.is_null() || count == 0 || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if prefetch && (locs.is_null() || idxs.is_null() || nlocs == 0 || nlocs > count) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut todo = Vec::with_capacity(count.min(1 << 16));
    for i in 0..count {
        // SAFETY: ptrs and sizes hold count entries by the caller's contract.
        let (p, n) = unsafe { (*ptrs.add(i), *sizes.add(i)) };
        let (start, kind) = alloc_at(d, p, n as u64)?;
        if kind != AllocKind::Managed {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = if prefetch {
            Some(batch_loc(d, locs, idxs, nlocs, i)?)
        } else {
            None
        };
        todo.push((start, dev));
    }
    let mut h = hints().lock();
    for (start, dev) in todo {
        if let Some(dev) = dev {
            h.entry(start).or_default().last_prefetch = Some(dev);
        }
    }
    Ok(())
}

type Ptrs = *const CUdeviceptr;
type Sizes = *const usize;
type Locs = *const CUmemLocation;

exports! {
    cuMemPrefetchBatchAsync | cuMemPrefetchBatchAsync_ptsz(ptrs: Ptrs, sizes: Sizes, count: usize, locs: Locs, idxs: Sizes, nlocs: usize, flags: u64, stream: CUstream)
        => batch_hint(ptrs, sizes, count, locs, idxs, nlocs, flags, stream, true);
    cuMemDiscardAndPrefetchBatchAsync | cuMemDiscardAndPrefetchBatchAsync_ptsz(ptrs: Ptrs, sizes: Sizes, count: usize, locs: Locs, idxs: Sizes, nlocs: usize, flags: u64, stream: CUstream)
        => batch_hint(ptrs, sizes, count, locs, idxs, nlocs, flags, stream, true);
    cuMemDiscardBatchAsync | cuMemDiscardBatchAsync_ptsz(ptrs: Ptrs, sizes: Sizes, count: usize, flags: u64, stream: CUstream)
        => batch_hint(ptrs, sizes, count, std::ptr::null(), std::ptr::null(), 0, flags, stream, false);
}

/// Whether the page holding `addr` is backed (touched) in this process;
/// `None` when `addr` is not mapped at all.
fn page_resident(addr: u64) -> Option<bool> {
    let page = 4096u64;
    let start = addr & !(page - 1);
    let mut v = 0u8;
    // SAFETY: mincore writes one byte for the one page asked about.
    let r = unsafe { libc::mincore(start as *mut c_void, page as usize, &mut v) };
    (r == 0).then_some(v & 1 != 0)
}

/// `cuMemGetLocationInfo` (CUDA 13.4): where each `summary`-sized region of
/// `[p, p + n)` mostly lives, sampled every `sampling` bytes (0: 2 MiB).
/// Managed memory is where it was last prefetched; without a prefetch, and
/// for pageable host memory, the host where a sampled page was touched and
/// nowhere (`CU_MEM_LOCATION_TYPE_NONE`) where none was (the sim's kernels
/// touch nothing). Device and registered host memory are
/// `CUDA_ERROR_INVALID_VALUE`, as for the driver.
fn location_info(
    p: CUdeviceptr,
    n: usize,
    summary: usize,
    sampling: usize,
    out: *mut CUmemLocation,
) -> CuRes {
    let d = cu()?;
    if out.is_null() || n == 0 || summary == 0 || summary > n || sampling > summary || p == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let prefetched = match alloc_at(d, p, n as u64) {
        Ok((start, AllocKind::Managed)) => hints().lock().get(&start).and_then(|h| h.last_prefetch),
        Ok(_) => return Err(CUDA_ERROR_INVALID_VALUE),
        Err(_)
            if d.allocs
                .lock()
                .range(..=p)
                .next_back()
                .is_some_and(|(s, a)| p < s + a.map_len.max(a.size as usize) as u64) =>
        {
            return Err(CUDA_ERROR_INVALID_VALUE)
        }
        Err(_) => None,
    };
    let step = if sampling == 0 { 2 << 20 } else { sampling } as u64;
    let regions = n.div_ceil(summary);
    for r in 0..regions {
        let loc = match prefetched {
            Some(DEVICE_CPU) => CUmemLocation { type_: 2, id: 0 },
            Some(dev) => CUmemLocation { type_: 1, id: dev },
            None => {
                let lo = p + (r * summary) as u64;
                let hi = (p + n as u64).min(lo + summary as u64);
                let (mut touched, mut untouched) = (0, 0);
                let mut a = lo;
                while a < hi {
                    match page_resident(a) {
                        Some(true) => touched += 1,
                        Some(false) => untouched += 1,
                        None => return Err(CUDA_ERROR_INVALID_VALUE),
                    }
                    a += step;
                }
                if touched >= untouched && touched > 0 {
                    CUmemLocation { type_: 2, id: 0 }
                } else {
                    CUmemLocation { type_: 0, id: 0 }
                }
            }
        };
        // SAFETY: the caller's array of ceil(size / summaryGranularity) entries.
        unsafe { out.add(r).write_unaligned(loc) };
    }
    Ok(())
}

crate::exports! {
    cuMemGetLocationInfo(p: CUdeviceptr, n: usize, summary: usize, sampling: usize, out: *mut CUmemLocation)
        => location_info(p, n, summary, sampling, out);
}
