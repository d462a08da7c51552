//! Memory hooks: every allocation family reserves against the
//! container's quota BEFORE the real allocator runs, gives the reservation
//! back if the driver fails, and records what it took; every free path gives
//! back exactly that, once. Unknown pointers and double frees go to the
//! driver and are charged nothing. Views report the quota.

use super::device::{cuda_gpu, current_device, current_gpu};
use super::sig;
use super::types::*;
use crate::driver::RealFn;
use crate::memory::{proc_state, Gpu, Kind, Owner, PoolPlace};

/// The current context handle (0 if none): allocations die with it.
pub(super) fn current_ctx() -> usize {
    let mut c: CUcontext = std::ptr::null_mut();
    if super::call_real!(super::real::cuCtxGetCurrent, &mut c) == CUDA_SUCCESS {
        c as usize
    } else {
        0
    }
}

/// Device allocations take whole granules of this many bytes: what the
/// driver itself charges for an allocation (the simulated driver's granule;
/// real drivers round at least this far).
pub const ALLOC_GRANULE: u64 = 512;

/// `n` rounded up to whole granules.
pub fn granule(n: u64) -> u64 {
    n.div_ceil(ALLOC_GRANULE).saturating_mul(ALLOC_GRANULE)
}

/// Reserve `bytes` on `gpu`, run `alloc` (the real call, returning the
/// driver's code), then keep the reservation under the new object's key
/// (`key` reads the out-parameter, and is called only when the driver
/// succeeded, i.e. wrote it) or give it back.
fn charged(
    gpu: Option<&'static Gpu>,
    kind: Kind,
    owner: impl FnOnce() -> Owner,
    bytes: u64,
    alloc: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
) -> CUresult {
    let Some(gpu) = gpu else {
        return alloc();
    };
    let bytes = granule(bytes);
    let _g = super::context::alloc_guard();
    if !gpu.reserve(bytes) {
        tracing::debug!(
            "cgpu: {kind:?} of {bytes} bytes refused: container would pass its quota of {:?} on GPU {}",
            gpu.quota,
            gpu.visible_index
        );
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = alloc();
    if rc != CUDA_SUCCESS {
        gpu.release(bytes);
        return rc;
    }
    let st = proc_state();
    match kind {
        Kind::Handle => st.charges.vmm_created(key(), gpu, bytes),
        _ => st.charges.track(kind, key(), gpu, bytes, owner()),
    }
    rc
}

/// Forget `key`, run `free`, then give back what it held (or put the entry
/// back if the driver refused).
fn uncharged(kind: Kind, key: u64, free: impl FnOnce() -> CUresult) -> CUresult {
    if !crate::memory::tracking() {
        return free();
    }
    let st = proc_state();
    let _g = super::context::alloc_guard();
    let entry = st.charges.untrack(kind, key);
    let rc = free();
    if let Some(e) = entry {
        if rc == CUDA_SUCCESS {
            e.gpu.release(e.bytes);
        } else {
            st.charges.track(kind, key, e.gpu, e.bytes, e.owner);
        }
    }
    rc
}

/// Read an out-parameter the driver wrote (0 if null). Call it only after
/// the driver returned `CUDA_SUCCESS`: on failure it may have written nothing.
///
/// # Safety
/// `p` is null or valid for reads and initialised.
unsafe fn out<T: Copy + Into<u64>>(p: *const T) -> u64 {
    if p.is_null() {
        0
    } else {
        // SAFETY: per the contract above.
        unsafe { p.read_unaligned().into() }
    }
}

/// `cuMemAlloc_v2`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_alloc(
    real: &RealFn<sig::cuMemAlloc_v2>,
    dptr: *mut CUdeviceptr,
    size: usize,
) -> CUresult {
    charged(
        current_gpu(),
        Kind::Ptr,
        in_current_ctx,
        size as u64,
        || super::call_real!(real, dptr, size),
        // SAFETY: called only on success, when the driver wrote *dptr.
        || unsafe { out(dptr) },
    )
}

/// `cuMemAlloc` (legacy 32-bit ABI).
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_alloc_v1(real: &RealFn<sig::cuMemAlloc>, dptr: *mut u32, size: u32) -> CUresult {
    charged(
        current_gpu(),
        Kind::Ptr,
        in_current_ctx,
        size as u64,
        || super::call_real!(real, dptr, size),
        // SAFETY: called only on success, when the driver wrote *dptr.
        || unsafe { out(dptr) },
    )
}

/// Owned by the current context.
fn in_current_ctx() -> Owner {
    Owner::Context(current_ctx())
}

/// Pitch the driver will choose at most: the width rounded up to 512 bytes
/// (the largest texture pitch alignment of NVIDIA GPUs).
fn pitch_bound(width: u64) -> u64 {
    width.div_ceil(512).saturating_mul(512).max(width)
}

/// Pitched allocation: reserve the bound, then settle on the real pitch ×
/// height. `alloc` returns the driver's code; `written` reads the pointer
/// and pitch it wrote (called only on success).
fn pitched(
    width: u64,
    height: u64,
    alloc: impl FnOnce() -> CUresult,
    written: impl FnOnce() -> (u64, u64),
    free: impl FnOnce(u64),
) -> CUresult {
    let Some(gpu) = current_gpu() else {
        return alloc();
    };
    let bound = granule(pitch_bound(width).saturating_mul(height));
    let _g = super::context::alloc_guard();
    if !gpu.reserve(bound) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = alloc();
    if rc != CUDA_SUCCESS {
        gpu.release(bound);
        return rc;
    }
    let (ptr, pitch) = written();
    let actual = granule(pitch.saturating_mul(height));
    if actual <= bound {
        gpu.release(bound - actual);
    } else if !gpu.reserve(actual - bound) {
        gpu.release(bound);
        free(ptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    proc_state()
        .charges
        .track(Kind::Ptr, ptr, gpu, actual, in_current_ctx());
    rc
}

/// `cuMemAllocPitch_v2`: charges the real pitch × height.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_alloc_pitch(
    real: &RealFn<sig::cuMemAllocPitch_v2>,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: u32,
) -> CUresult {
    pitched(
        width as u64,
        height as u64,
        || super::call_real!(real, dptr, pitch, width, height, elem),
        // SAFETY: called only on success, when the driver wrote both.
        || unsafe { (out(dptr), out(pitch as *const usize as *const u64)) },
        |p| {
            super::call_real!(super::real::cuMemFree_v2, p);
        },
    )
}

/// `cuMemAllocPitch` (legacy 32-bit ABI).
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_alloc_pitch_v1(
    real: &RealFn<sig::cuMemAllocPitch>,
    dptr: *mut u32,
    pitch: *mut u32,
    width: u32,
    height: u32,
    elem: u32,
) -> CUresult {
    pitched(
        width as u64,
        height as u64,
        || super::call_real!(real, dptr, pitch, width, height, elem),
        // SAFETY: called only on success, when the driver wrote both.
        || unsafe { (out(dptr), out(pitch)) },
        |p| {
            super::call_real!(super::real::cuMemFree, p as u32);
        },
    )
}

/// `cuMemAllocManaged`: counted in full against the current device.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_alloc_managed(
    real: &RealFn<sig::cuMemAllocManaged>,
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: u32,
) -> CUresult {
    charged(
        current_gpu(),
        Kind::Ptr,
        in_current_ctx,
        size as u64,
        || super::call_real!(real, dptr, size, flags),
        // SAFETY: called only on success, when the driver wrote *dptr.
        || unsafe { out(dptr) },
    )
}

/// The device a stream's work runs on (`None`: the current context's, as
/// for the default streams, or unknown).
fn stream_device(stream: CUstream) -> Option<CUdevice> {
    if (stream as usize) <= CU_STREAM_PER_THREAD {
        return current_device();
    }
    let mut d: CUdevice = -1;
    if let Some(f) = super::real::cuStreamGetDevice.get() {
        // SAFETY: the real driver function with a valid out-pointer.
        if unsafe { f(stream, &mut d) } == CUDA_SUCCESS {
            return Some(d);
        }
    }
    // Older drivers: the device of the stream's context.
    let mut ctx: CUcontext = std::ptr::null_mut();
    if super::call_real!(super::real::cuStreamGetCtx, stream, &mut ctx) != CUDA_SUCCESS {
        return current_device();
    }
    if super::call_real!(super::real::cuCtxPushCurrent_v2, ctx) != CUDA_SUCCESS {
        return current_device();
    }
    let dev = current_device();
    let mut popped: CUcontext = std::ptr::null_mut();
    super::call_real!(super::real::cuCtxPopCurrent_v2, &mut popped);
    dev
}

/// The GPU a stream-ordered allocation from `pool` (null: the device's
/// current pool) on `stream` lands on: the pool's device when this process
/// made the pool (a host pool: none, it is not device memory), else the
/// stream's device (the driver requires the pool to be on it).
fn pool_gpu(pool: usize, stream: CUstream) -> Option<&'static Gpu> {
    if !crate::memory::tracking() {
        return None;
    }
    match (pool != 0)
        .then(|| proc_state().charges.pool_place(pool))
        .flatten()
    {
        Some(PoolPlace::Host) => None,
        Some(PoolPlace::Device(d)) => cuda_gpu(d),
        None => cuda_gpu(stream_device(stream)?),
    }
}

/// Is `stream` being captured into a graph? (`ptsz`: the caller's stream 0
/// is its per-thread default stream.) A stream the driver cannot answer for
/// is taken as not captured (then charged: never under-counted).
fn capturing(stream: CUstream, ptsz: bool) -> bool {
    let s = if ptsz && stream.is_null() {
        CU_STREAM_PER_THREAD as CUstream
    } else {
        stream
    };
    let mut status: CUstreamCaptureStatus = 0;
    super::call_real!(super::real::cuStreamIsCapturing, s, &mut status) == CUDA_SUCCESS
        && status == CU_STREAM_CAPTURE_STATUS_ACTIVE
}

/// A stream-ordered allocation from `pool` (0: the stream's device's
/// current pool) on `stream`: charged when returned, released when freed.
/// Into a stream being captured it is no allocation but a graph's alloc
/// node: the driver reserves its memory when the graph is launched, and
/// graph memory is charged then (`hooks::graph`); charging it here too
/// would count it twice for as long as the address is not freed.
fn alloc_async(
    pool: usize,
    stream: CUstream,
    ptsz: bool,
    size: usize,
    alloc: impl FnOnce() -> CUresult,
    dptr: *mut CUdeviceptr,
) -> CUresult {
    let gpu = pool_gpu(pool, stream);
    // No capture of this process begins or ends from the check to the end
    // of the real call: what the check saw is what the call did.
    let _c = gpu.is_some().then(super::stream::capture_guard);
    if gpu.is_some() && capturing(stream, ptsz) {
        return alloc();
    }
    charged(
        gpu,
        Kind::Ptr,
        || Owner::Pool {
            pool,
            ctx: current_ctx(),
        },
        size as u64,
        alloc,
        // SAFETY: called only on success, when the driver wrote *dptr (the
        // caller's out-pointer).
        || unsafe { out(dptr) },
    )
}

/// `cuMemAllocAsync`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_alloc_async(
    real: &RealFn<sig::cuMemAllocAsync>,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(
        0,
        stream,
        false,
        size,
        || super::call_real!(real, dptr, size, stream),
        dptr,
    )
}

/// `cuMemAllocAsync_ptsz`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_alloc_async_ptsz(
    real: &RealFn<sig::cuMemAllocAsync>,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(
        0,
        stream,
        true,
        size,
        || super::call_real!(real, dptr, size, stream),
        dptr,
    )
}

/// `cuMemAllocFromPoolAsync`: charged to the pool's device.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_alloc_from_pool_async(
    real: &RealFn<sig::cuMemAllocFromPoolAsync>,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_async(
        pool as usize,
        stream,
        false,
        size,
        || super::call_real!(real, dptr, size, pool, stream),
        dptr,
    )
}

/// `cuMemAllocFromPoolAsync_ptsz`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_alloc_from_pool_async_ptsz(
    real: &RealFn<sig::cuMemAllocFromPoolAsync>,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    alloc_async(
        pool as usize,
        stream,
        true,
        size,
        || super::call_real!(real, dptr, size, pool, stream),
        dptr,
    )
}

/// `cuMemCreate` (virtual memory API, PyTorch's expandable segments):
/// charged against the device the properties name, owned by the device (no
/// context frees it) until its last handle reference is released and its
/// last mapping unmapped.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_create(
    real: &RealFn<sig::cuMemCreate>,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    if prop.is_null() {
        return super::call_real!(real, handle, size, prop, flags);
    }
    // SAFETY: prop is the caller's non-null property struct (layout checked
    // against cuda.h in cgpu-ffi); read unaligned, as a copy.
    let mut p = unsafe { prop.read_unaligned() };
    if p.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return super::call_real!(real, handle, size, prop, flags);
    }
    p.location.id = super::device::host_device_for_location(p.location.id);
    if super::device::hidden(p.location.id) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let gpu = cuda_gpu(p.location.id);
    let prop2: *const CUmemAllocationProp = &p;
    charged(
        gpu,
        Kind::Handle,
        || Owner::Context(0),
        size as u64,
        || super::call_real!(real, handle, size, prop2, flags),
        // SAFETY: called only on success, when the driver wrote *handle.
        || unsafe { out(handle) },
    )
}

/// `cuMemRelease`: one handle reference less; the charge stays while the
/// memory is still mapped.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_release(
    real: &RealFn<sig::cuMemRelease>,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    if !crate::memory::tracking() {
        return super::call_real!(real, handle);
    }
    let _g = super::context::alloc_guard();
    let rc = super::call_real!(real, handle);
    if rc == CUDA_SUCCESS {
        proc_state().charges.vmm_released(handle);
    }
    rc
}

/// `cuMemMap`: a mapping keeps the allocation (and its charge) alive. A
/// mapping of an imported allocation beyond what its charge covers is
/// charged first (refused with `CUDA_ERROR_OUT_OF_MEMORY` past the quota).
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_map(
    real: &RealFn<sig::cuMemMap>,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    if !crate::memory::tracking() {
        return super::call_real!(real, ptr, size, offset, handle, flags);
    }
    let _g = super::context::alloc_guard();
    let st = proc_state();
    let growth = st
        .charges
        .vmm_import_growth(handle, offset as u64, size as u64);
    if let Some((gpu, bytes)) = growth {
        if !gpu.reserve(bytes) {
            tracing::debug!(
                "cgpu: mapping {bytes} more bytes of an imported allocation refused: container would pass its quota on GPU {}",
                gpu.visible_index
            );
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    let rc = super::call_real!(real, ptr, size, offset, handle, flags);
    if let Some((gpu, bytes)) = growth {
        let back = if rc == CUDA_SUCCESS {
            st.charges
                .vmm_import_grown(handle, (offset as u64).saturating_add(size as u64), bytes)
        } else {
            bytes
        };
        gpu.release(back);
    }
    if rc == CUDA_SUCCESS {
        st.charges.vmm_mapped(ptr, size as u64, handle);
    }
    rc
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const HANDLE_TYPE_POSIX_FD: CUmemAllocationHandleType = 1;

/// The process a POSIX descriptor was exported by, as tagged at export
/// (`F_SETOWN`, which travels with the open file description through
/// `SCM_RIGHTS` and `pidfd_getfd`, as NCCL and PyTorch pass them); `None`
/// when untagged (another open of the file, an exporter without cgpu).
fn exporter_of(fd: i32) -> Option<u32> {
    // SAFETY: F_GETOWN reads the owner of any descriptor; a bad one fails.
    let owner = unsafe { libc::fcntl(fd, libc::F_GETOWN) };
    u32::try_from(owner).ok().filter(|&p| p > 0)
}

/// `cuMemExportToShareableHandle`: the driver now keeps the allocation while
/// the exported descriptor, or any handle imported from it in any process,
/// exists; cgpu sees neither, so the exporter's charge is kept until it
/// exits, whatever it releases and unmaps here. A POSIX descriptor is
/// tagged with this process as its owner (`F_SETOWN`, unless it has one), so
/// that an importer of the same container can tell it is charged already.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_export_to_shareable_handle(
    real: &RealFn<sig::cuMemExportToShareableHandle>,
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: CUmemAllocationHandleType,
    flags: u64,
) -> CUresult {
    if !crate::memory::tracking() {
        return super::call_real!(real, shareable, handle, handle_type, flags);
    }
    let _g = super::context::alloc_guard();
    let rc = super::call_real!(real, shareable, handle, handle_type, flags);
    if rc == CUDA_SUCCESS {
        proc_state().charges.vmm_exported(handle);
        if handle_type == HANDLE_TYPE_POSIX_FD && !shareable.is_null() {
            // SAFETY: for a POSIX descriptor the out-parameter is an int,
            // written by the driver on success.
            let fd = unsafe { shareable.cast::<i32>().read_unaligned() };
            if exporter_of(fd).is_none() {
                // SAFETY: F_SETOWN on the descriptor the driver just made
                // (no O_ASYNC is set on it, so no signal is ever sent).
                unsafe { libc::fcntl(fd, libc::F_SETOWN, libc::getpid()) };
            }
        }
    }
    rc
}

/// `cuMemImportFromShareableHandle`: memory another process exported. This
/// process keeps it alive on the device while it holds a handle or a
/// mapping of it, so it is charged here too (the exporter's charge lasts
/// until the exporter exits): an importer cannot keep memory past the
/// exporter's life without its own quota holding it. Unless the descriptor
/// was exported by a live process of this container (its `F_SETOWN` tag, a
/// pid the GPU's ledger lists in this container): the container is charged
/// once, by the exporter, and the import is recorded in the ledger's table
/// of shared allocations, so that when the exporter goes its charge for
/// what this process holds passes on to this process in the same step. The
/// charge is taken (or recorded) when it is mapped, for the extent mapped
/// (the driver reports no handle's size).
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_import_from_shareable_handle(
    real: &RealFn<sig::cuMemImportFromShareableHandle>,
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: CUmemAllocationHandleType,
) -> CUresult {
    if !crate::memory::tracking() {
        return super::call_real!(real, handle, os_handle, handle_type);
    }
    let _g = super::context::alloc_guard();
    let exporter = (handle_type == HANDLE_TYPE_POSIX_FD)
        .then(|| exporter_of(os_handle as usize as i32))
        .flatten();
    let rc = super::call_real!(real, handle, os_handle, handle_type);
    if rc != CUDA_SUCCESS || handle.is_null() {
        return rc;
    }
    // SAFETY: the driver succeeded and wrote the handle.
    let h = unsafe { out(handle) };
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    let dev = (super::call_real!(
        super::real::cuMemGetAllocationPropertiesFromHandle,
        &mut prop,
        h
    ) == CUDA_SUCCESS
        && prop.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE)
        .then_some(prop.location.id);
    let charges = &proc_state().charges;
    match dev.and_then(cuda_gpu) {
        Some(_) if exporter == Some(std::process::id()) => {
            tracing::debug!("cgpu: an allocation this process exported: charged to it already");
        }
        Some(gpu) => {
            let share = exporter
                .filter(|_| !charges.vmm_holds(h))
                .and_then(|pid| gpu.share_register(pid));
            if share.is_some() {
                tracing::debug!(
                    "cgpu: an allocation exported by pid {exporter:?} of this container: charged to it while it lives, then here"
                );
            }
            charges.vmm_imported(h, gpu, share);
        }
        None => tracing::debug!(
            "cgpu: an imported allocation on no tracked GPU ({dev:?}) is not charged"
        ),
    }
    rc
}

/// `cuMemUnmap`: the mappings in the range are gone; an allocation whose
/// handles were all released is given back with its last mapping.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_unmap(real: &RealFn<sig::cuMemUnmap>, ptr: CUdeviceptr, size: usize) -> CUresult {
    if !crate::memory::tracking() {
        return super::call_real!(real, ptr, size);
    }
    let _g = super::context::alloc_guard();
    let rc = super::call_real!(real, ptr, size);
    if rc == CUDA_SUCCESS {
        proc_state().charges.vmm_unmapped(ptr, size as u64);
    }
    rc
}

/// `cuMemRetainAllocationHandle`: one more handle reference, to be released.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_retain_allocation_handle(
    real: &RealFn<sig::cuMemRetainAllocationHandle>,
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    if !crate::memory::tracking() {
        return super::call_real!(real, handle, addr);
    }
    let _g = super::context::alloc_guard();
    let rc = super::call_real!(real, handle, addr);
    if rc == CUDA_SUCCESS && !handle.is_null() {
        // SAFETY: the driver succeeded and wrote the handle.
        proc_state().charges.vmm_retained(unsafe { out(handle) });
    }
    rc
}

/// The locations in `cuMemSetAccess` descriptors that `translate` copies at
/// most; more than this many is no valid request (one per device and kind):
/// the driver answers it as it is.
const MAX_ACCESS_DESCS: usize = 4 * crate::memory::MAX_GPUS;

/// `cuMemSetAccess`: device locations given as container ordinals are
/// translated (see [`super::device::host_device_for_location`]).
///
/// # Safety
/// The driver's contract: `desc` holds `count` entries.
pub unsafe fn mem_set_access(
    real: &RealFn<sig::cuMemSetAccess>,
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    if desc.is_null()
        || count == 0
        || count > MAX_ACCESS_DESCS
        || crate::config::get().visible.is_none()
    {
        return super::call_real!(real, ptr, size, desc, count);
    }
    // SAFETY: the caller passes `count` valid entries (bounded above).
    let mut v: Vec<CUmemAccessDesc> = unsafe { std::slice::from_raw_parts(desc, count) }.to_vec();
    for d in v
        .iter_mut()
        .filter(|d| d.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE)
    {
        d.location.id = super::device::host_device_for_location(d.location.id);
    }
    super::call_real!(real, ptr, size, v.as_ptr(), count)
}

/// `cuMemGetAllocationGranularity`: the location translated as for `cuMemCreate`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_get_allocation_granularity(
    real: &RealFn<sig::cuMemGetAllocationGranularity>,
    gran: *mut usize,
    prop: *const CUmemAllocationProp,
    option: u32,
) -> CUresult {
    if prop.is_null() || crate::config::get().visible.is_none() {
        return super::call_real!(real, gran, prop, option);
    }
    // SAFETY: non-null property struct from the caller, read as a copy.
    let mut p = unsafe { prop.read_unaligned() };
    if p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
        p.location.id = super::device::host_device_for_location(p.location.id);
    }
    let prop2: *const CUmemAllocationProp = &p;
    super::call_real!(real, gran, prop2, option)
}

/// `cuMemPoolCreate`: the location translated as for `cuMemCreate`; the
/// pool's place is remembered (its allocations are charged to its device;
/// a host pool's are not device memory).
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_pool_create(
    real: &RealFn<sig::cuMemPoolCreate>,
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    if props.is_null() {
        return super::call_real!(real, pool, props);
    }
    // SAFETY: non-null pool properties from the caller, read as a copy.
    let mut p = unsafe { props.read_unaligned() };
    if p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
        p.location.id = super::device::host_device_for_location(p.location.id);
        if super::device::hidden(p.location.id) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
    }
    let props2: *const CUmemPoolProps = &p;
    let rc = super::call_real!(real, pool, props2);
    if rc == CUDA_SUCCESS && !pool.is_null() && crate::memory::tracking() {
        let place = if p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            PoolPlace::Device(p.location.id)
        } else {
            PoolPlace::Host
        };
        // SAFETY: the driver succeeded and wrote the pool handle.
        let h = unsafe { pool.read_unaligned() } as usize;
        proc_state().charges.pool_created(h, place);
    }
    rc
}

/// Remember that `pool` (just written by the driver) is device `dev`'s.
///
/// # Safety
/// `pool` is null or the caller's out-pointer the driver just wrote.
unsafe fn device_pool(rc: CUresult, pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    if rc == CUDA_SUCCESS && !pool.is_null() && crate::memory::tracking() {
        // SAFETY: the driver succeeded and wrote the pool handle.
        let h = unsafe { pool.read_unaligned() } as usize;
        proc_state().charges.pool_created(h, PoolPlace::Device(dev));
    }
    rc
}

/// `cuDeviceGetDefaultMemPool`: the pool is remembered as the device's (its
/// allocations are charged there, whichever stream they are made on).
///
/// # Safety
/// The driver's contract.
pub unsafe fn device_get_default_mem_pool(
    real: &RealFn<sig::cuDeviceGetDefaultMemPool>,
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let rc = super::call_real!(real, pool, dev);
    // SAFETY: pool is the caller's out-pointer.
    unsafe { device_pool(rc, pool, dev) }
}

/// `cuDeviceGetMemPool` (the device's current pool): as above.
///
/// # Safety
/// The driver's contract.
pub unsafe fn device_get_mem_pool(
    real: &RealFn<sig::cuDeviceGetMemPool>,
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let rc = super::call_real!(real, pool, dev);
    // SAFETY: pool is the caller's out-pointer.
    unsafe { device_pool(rc, pool, dev) }
}

/// `cuMemPoolDestroy`: the driver frees the allocations still out in it.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_pool_destroy(
    real: &RealFn<sig::cuMemPoolDestroy>,
    pool: CUmemoryPool,
) -> CUresult {
    if !crate::memory::tracking() {
        return super::call_real!(real, pool);
    }
    let _g = super::context::alloc_guard();
    let rc = super::call_real!(real, pool);
    if rc == CUDA_SUCCESS {
        proc_state().charges.pool_destroyed(pool as usize);
    }
    rc
}

/// Bytes per element of a `CUarray_format`.
pub fn format_bytes(format: i32) -> u64 {
    match format {
        0x01 | 0x08 | 0xb0 | 0xb1 => 1, // UNSIGNED_INT8, SIGNED_INT8, UNORM_INT8X1, SNORM_INT8X1
        0x02 | 0x09 | 0x10 => 2,        // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4,        // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => 16,                        // packed / block formats: a conservative bound
    }
}

/// Bytes of a `w × h × d` array of `channels` elements of `format`.
pub fn array_bytes(w: usize, h: usize, d: usize, format: i32, channels: u32) -> u64 {
    (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(channels.max(1) as u64)
        .saturating_mul(format_bytes(format))
}

/// Charge an array of `bytes` around `create` (the real call), which writes
/// the new handle to `arr` when it succeeds.
///
/// # Safety
/// `arr` is the caller's out-pointer, as the driver's contract has it.
unsafe fn array_charge(
    bytes: u64,
    kind: Kind,
    arr: *mut *mut c_void,
    create: impl FnOnce() -> CUresult,
) -> CUresult {
    charged(
        current_gpu(),
        kind,
        in_current_ctx,
        bytes,
        create,
        // SAFETY: called only on success, when the driver wrote the handle.
        || unsafe { out(arr as *const usize as *const u64) },
    )
}

/// `cuArrayCreate_v2`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn array_create(
    real: &RealFn<sig::cuArrayCreate_v2>,
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    // SAFETY: desc is null or the caller's descriptor.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return super::call_real!(real, arr, desc);
    };
    let bytes = array_bytes(d.Width, d.Height, 1, d.Format, d.NumChannels);
    let create = || super::call_real!(real, arr, desc);
    // SAFETY: arr is the caller's out-pointer.
    unsafe { array_charge(bytes, Kind::Array, arr, create) }
}

/// `cuArrayCreate` (legacy: the `_v1` descriptor, 32-bit sizes).
///
/// # Safety
/// The driver's contract.
pub unsafe fn array_create_v1(
    real: &RealFn<sig::cuArrayCreate>,
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR_v1,
) -> CUresult {
    // SAFETY: desc is null or the caller's descriptor.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return super::call_real!(real, arr, desc);
    };
    let bytes = array_bytes(
        d.Width as usize,
        d.Height as usize,
        1,
        d.Format,
        d.NumChannels,
    );
    let create = || super::call_real!(real, arr, desc);
    // SAFETY: arr is the caller's out-pointer.
    unsafe { array_charge(bytes, Kind::Array, arr, create) }
}

/// `cuArray3DCreate_v2`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn array3d_create(
    real: &RealFn<sig::cuArray3DCreate_v2>,
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    // SAFETY: desc is null or the caller's descriptor.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return super::call_real!(real, arr, desc);
    };
    let bytes = array_bytes(d.Width, d.Height, d.Depth, d.Format, d.NumChannels);
    let create = || super::call_real!(real, arr, desc);
    // SAFETY: arr is the caller's out-pointer.
    unsafe { array_charge(bytes, Kind::Array, arr, create) }
}

/// `cuArray3DCreate` (legacy: the `_v1` descriptor, 32-bit sizes).
///
/// # Safety
/// The driver's contract.
pub unsafe fn array3d_create_v1(
    real: &RealFn<sig::cuArray3DCreate>,
    arr: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1,
) -> CUresult {
    // SAFETY: desc is null or the caller's descriptor.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return super::call_real!(real, arr, desc);
    };
    let (w, h, z) = (d.Width as usize, d.Height as usize, d.Depth as usize);
    let bytes = array_bytes(w, h, z, d.Format, d.NumChannels);
    let create = || super::call_real!(real, arr, desc);
    // SAFETY: arr is the caller's out-pointer.
    unsafe { array_charge(bytes, Kind::Array, arr, create) }
}

/// Most levels a mipmapped array of extent `w × h × d` can have: one per
/// halving of its largest dimension, down to 1 (the driver refuses more).
fn max_levels(w: usize, h: usize, d: usize) -> u32 {
    let m = w.max(h).max(d).max(1) as u64;
    64 - m.leading_zeros()
}

/// `cuMipmappedArrayCreate`: all levels. A level count the driver must
/// refuse (more levels than halvings) is charged as the most it can have,
/// so a caller-supplied count never drives the loop (the driver answers).
///
/// # Safety
/// The driver's contract.
pub unsafe fn mipmapped_array_create(
    real: &RealFn<sig::cuMipmappedArrayCreate>,
    arr: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: u32,
) -> CUresult {
    // SAFETY: desc is null or the caller's descriptor.
    let Some(d) = (unsafe { desc.as_ref() }) else {
        return super::call_real!(real, arr, desc, levels);
    };
    let mut bytes = 0u64;
    let (mut w, mut h, mut z) = (d.Width.max(1), d.Height.max(1), d.Depth.max(1));
    for _ in 0..levels.clamp(1, max_levels(w, h, z)) {
        bytes = bytes.saturating_add(array_bytes(w, h, z, d.Format, d.NumChannels));
        w = (w / 2).max(1);
        h = (h / 2).max(1);
        z = (z / 2).max(1);
    }
    let create = || super::call_real!(real, arr, desc, levels);
    // SAFETY: arr is the caller's out-pointer.
    unsafe { array_charge(bytes, Kind::Mipmap, arr, create) }
}

/// `cuMemFree_v2`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_free(real: &RealFn<sig::cuMemFree_v2>, dptr: CUdeviceptr) -> CUresult {
    uncharged(Kind::Ptr, dptr, || super::call_real!(real, dptr))
}

/// `cuMemFree` (legacy).
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_free_v1(real: &RealFn<sig::cuMemFree>, dptr: u32) -> CUresult {
    uncharged(Kind::Ptr, dptr as u64, || super::call_real!(real, dptr))
}

/// `cuMemFreeAsync` and `_ptsz`: released when the free is enqueued.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_free_async(
    real: &RealFn<sig::cuMemFreeAsync>,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    uncharged(Kind::Ptr, dptr, || super::call_real!(real, dptr, stream))
}

/// `cuArrayDestroy`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn array_destroy(real: &RealFn<sig::cuArrayDestroy>, arr: CUarray) -> CUresult {
    uncharged(Kind::Array, arr as u64, || super::call_real!(real, arr))
}

/// `cuMipmappedArrayDestroy`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn mipmapped_array_destroy(
    real: &RealFn<sig::cuMipmappedArrayDestroy>,
    arr: CUmipmappedArray,
) -> CUresult {
    uncharged(Kind::Mipmap, arr as u64, || super::call_real!(real, arr))
}

/// A size out-parameter: `size_t` (the `_v2` ABI) or `unsigned int` (the
/// legacy one, clamped as the driver clamps).
trait SizeOut: Copy {
    fn to_u64(self) -> u64;
    fn clamped(v: u64) -> Self;
}

impl SizeOut for usize {
    fn to_u64(self) -> u64 {
        self as u64
    }
    fn clamped(v: u64) -> Self {
        usize::try_from(v).unwrap_or(usize::MAX)
    }
}

impl SizeOut for u32 {
    fn to_u64(self) -> u64 {
        u64::from(self)
    }
    fn clamped(v: u64) -> Self {
        u32::try_from(v).unwrap_or(u32::MAX)
    }
}

/// After the real `cuMemGetInfo` (either ABI) returned `rc`: the quota view
/// of the current context's GPU.
///
/// # Safety
/// `free` and `total` are the caller's out-parameters, written by the
/// driver when `rc` is success.
unsafe fn mem_info_view<T: SizeOut>(rc: CUresult, free: *mut T, total: *mut T) -> CUresult {
    if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    if let Some(gpu) = current_gpu() {
        // SAFETY: both out-parameters are non-null and were written by the driver.
        unsafe {
            let (f, t) = gpu.view(free.read().to_u64(), total.read().to_u64());
            free.write(T::clamped(f));
            total.write(T::clamped(t));
        }
    }
    rc
}

/// After the real `cuDeviceTotalMem` (either ABI) returned `rc`: the quota
/// (asking does not join the GPU).
///
/// # Safety
/// `bytes` is the caller's out-parameter, written by the driver on success.
unsafe fn total_mem_view<T: SizeOut>(rc: CUresult, bytes: *mut T, dev: CUdevice) -> CUresult {
    if rc == CUDA_SUCCESS && !bytes.is_null() {
        if let Some(q) = super::device::cuda_view_quota(dev) {
            // SAFETY: non-null out-parameter.
            unsafe { bytes.write(T::clamped(q)) };
        }
    }
    rc
}

/// `cuMemGetInfo_v2`: total = quota, free = min(quota − used, physical free).
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_get_info(
    real: &RealFn<sig::cuMemGetInfo_v2>,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    let rc = super::call_real!(real, free, total);
    // SAFETY: the caller's out-parameters, as the driver's contract has them.
    unsafe { mem_info_view(rc, free, total) }
}

/// `cuMemGetInfo` (legacy 32-bit ABI).
///
/// # Safety
/// The driver's contract.
pub unsafe fn mem_get_info_v1(
    real: &RealFn<sig::cuMemGetInfo>,
    free: *mut u32,
    total: *mut u32,
) -> CUresult {
    let rc = super::call_real!(real, free, total);
    // SAFETY: as above.
    unsafe { mem_info_view(rc, free, total) }
}

/// `cuDeviceTotalMem_v2`: the quota.
///
/// # Safety
/// The driver's contract.
pub unsafe fn device_total_mem(
    real: &RealFn<sig::cuDeviceTotalMem_v2>,
    bytes: *mut usize,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let rc = super::call_real!(real, bytes, dev);
    // SAFETY: the caller's out-parameter.
    unsafe { total_mem_view(rc, bytes, dev) }
}

/// `cuDeviceTotalMem` (legacy 32-bit ABI).
///
/// # Safety
/// The driver's contract.
pub unsafe fn device_total_mem_v1(
    real: &RealFn<sig::cuDeviceTotalMem>,
    bytes: *mut u32,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let rc = super::call_real!(real, bytes, dev);
    // SAFETY: the caller's out-parameter.
    unsafe { total_mem_view(rc, bytes, dev) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(granule(1), 512);
        assert_eq!(granule(0), 0);
        assert_eq!(granule(1024), 1024);
        assert_eq!(pitch_bound(1), 512);
        assert_eq!(pitch_bound(512), 512);
        assert_eq!(pitch_bound(513), 1024);
        assert_eq!(array_bytes(100, 0, 0, 0x20, 4), 1600);
        assert_eq!(array_bytes(10, 10, 10, 0x01, 1), 1000);
        assert_eq!(max_levels(1, 0, 0), 1);
        assert_eq!(max_levels(1024, 1, 1), 11);
        assert_eq!(max_levels(1023, 1, 1), 10);
        assert_eq!(max_levels(usize::MAX, 1, 1), 64);
    }
}
