//! The virtual memory management API (`cuMemCreate`, `cuMemAddressReserve`,
//! `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`, ...).
//!
//! A physical allocation is a `memfd` of its size, charged to the device at
//! `cuMemCreate`; a reservation is a `PROT_NONE` mapping; `cuMemMap` maps the
//! memfd over the reservation (shared, so two mappings of one handle see the
//! same bytes) and `cuMemSetAccess` makes it read-write. The memory returns
//! to the device when the handle is released and no mapping is left.
//!
//! Shareable handles are real for `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`
//! (requested at `cuMemCreate`): `cuMemExportToShareableHandle` hands out a
//! duplicate of the memfd, which another process (or this one) imports with
//! `cuMemImportFromShareableHandle` and maps; both see the same bytes. The
//! memfd's name carries the device (`cgpu-sim-vmm-d<N>`). Imported memory is
//! charged to the process that created it (as the driver counts it), not to
//! the importer; the bytes live while any process holds them. Fabric and
//! Windows handles are `CUDA_ERROR_NOT_SUPPORTED` (no fabric, not Windows).

use crate::driver::{cu, Driver, PhysMem};
use crate::{guard, put, CuRes};
use cgpu_ffi::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Arc;

pub const GRANULARITY: u64 = 2 << 20;

/// The access `cuMemSetAccess` gave each mapping (by its start): the
/// protection of its pages. A mapping without an entry has no access yet
/// (its pages are `PROT_NONE`): copies and memsets into it are refused
/// instead of faulting the client.
static ACCESS: parking_lot::Mutex<Option<std::collections::HashMap<u64, i32>>> =
    parking_lot::Mutex::new(None);

/// Whether the mapping starting at `start` may be read and written.
pub fn mapping_writable(start: u64) -> bool {
    ACCESS
        .lock()
        .as_ref()
        .and_then(|m| m.get(&start))
        .is_some_and(|p| *p == libc::PROT_READ | libc::PROT_WRITE)
}

fn read_prop(d: &Driver, prop: *const CUmemAllocationProp) -> Result<usize, CUresult> {
    if prop.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null CUmemAllocationProp from the caller.
    let p = unsafe { prop.read_unaligned() };
    if p.type_ != 1 || p.location.type_ != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    d.check_dev(p.location.id)
        .map_err(|_| CUDA_ERROR_INVALID_DEVICE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    g: *mut usize,
    prop: *const CUmemAllocationProp,
    _option: u32,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        read_prop(d, prop)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(g, GRANULARITY as usize, CUDA_ERROR_INVALID_VALUE) }
    })
}

static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x7e00_0000);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    h: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if h.is_null() || flags != 0 || size == 0 || size as u64 % GRANULARITY != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = read_prop(d, prop)?;
        // SAFETY: non-null CUmemAllocationProp from the caller (read_prop).
        let handle_types = unsafe { prop.read_unaligned() }.requestedHandleTypes;
        d.charge(dev, size as u64)?;
        d.touch_dev(dev);
        let name = std::ffi::CString::new(format!("{MEMFD_PREFIX}{dev}")).unwrap_or_default();
        // SAFETY: memfd_create with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: fd is our fresh memfd.
        if fd < 0 || unsafe { libc::ftruncate(fd, size as i64) } != 0 {
            if fd >= 0 {
                // SAFETY: closing our own fd.
                unsafe { libc::close(fd) };
            }
            d.uncharge(dev, size as u64);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let id = NEXT_HANDLE.fetch_add(1, Relaxed);
        d.phys.lock().insert(
            id,
            Arc::new(PhysMem {
                dev,
                size: size as u64,
                charged: size as u64,
                handle_types,
                fd,
                released: AtomicBool::new(false),
                refs: AtomicU32::new(1),
                maps: AtomicU32::new(0),
            }),
        );
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(h, id, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// The physical allocation `h`, if it exists (out of the lock).
fn phys_mem(d: &Driver, h: CUmemGenericAllocationHandle) -> Option<Arc<PhysMem>> {
    d.phys.lock().get(&h).cloned()
}

fn maybe_free(d: &Driver, id: u64, p: &PhysMem) {
    if p.released.load(Acquire) && p.maps.load(Acquire) == 0 && d.phys.lock().remove(&id).is_some()
    {
        // SAFETY: closing the memfd we own; no mapping uses the fd itself.
        unsafe { libc::close(p.fd) };
        d.uncharge(p.dev, p.charged);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(h: CUmemGenericAllocationHandle) -> CUresult {
    guard(|| {
        let d = cu()?;
        let p = phys_mem(d, h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // One reference less; the last one marks the memory released.
        let dropped = p
            .refs
            .fetch_update(AcqRel, Acquire, |r| r.checked_sub(1))
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if dropped == 1 {
            p.released.store(true, Release);
        }
        maybe_free(d, h, &p);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    align: usize,
    _addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if ptr.is_null() || size == 0 || flags != 0 || size as u64 % GRANULARITY != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if align != 0 && !align.is_power_of_two() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = align.max(GRANULARITY as usize);
        let len = size.checked_add(align).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        // SAFETY: a fresh PROT_NONE reservation.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let base = p as usize;
        let start = base.next_multiple_of(align);
        // Trim the slack around the aligned range.
        // SAFETY: both pieces lie in the mapping just created and are ours.
        unsafe {
            if start > base {
                libc::munmap(p, start - base);
            }
            let end = start + size;
            if base + len > end {
                libc::munmap(end as *mut c_void, base + len - end);
            }
        }
        d.vmm_reserved.lock().insert(start as u64, size as u64);
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(ptr, start as u64, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let d = cu()?;
        let mut r = d.vmm_reserved.lock();
        if r.get(&ptr) != Some(&(size as u64)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if d.vmm_maps
            .lock()
            .range(ptr..ptr + size as u64)
            .next()
            .is_some()
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        r.remove(&ptr);
        // SAFETY: the reservation is ours and has no mapping left.
        unsafe { libc::munmap(ptr as *mut c_void, size) };
        Ok(())
    })
}

fn in_reservation(d: &Driver, ptr: u64, size: u64) -> bool {
    d.vmm_reserved
        .lock()
        .range(..=ptr)
        .next_back()
        .is_some_and(|(s, l)| ptr + size <= s + l)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    h: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let (ptr64, size64) = (ptr, size as u64);
        if flags != 0 || size == 0 || ptr64 % GRANULARITY != 0 || size64 % GRANULARITY != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = phys_mem(d, h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if p.released.load(Acquire) || offset as u64 + size64 > p.size {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !in_reservation(d, ptr64, size64) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut maps = d.vmm_maps.lock();
        let overlaps = maps
            .range(..ptr64 + size64)
            .next_back()
            .is_some_and(|(s, (l, _))| s + l > ptr64);
        if overlaps {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: [ptr, ptr+size) lies in our PROT_NONE reservation with no
        // mapping; MAP_FIXED replaces our own pages only.
        let r = unsafe {
            libc::mmap(
                ptr as *mut c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                p.fd,
                offset as i64,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        maps.insert(ptr64, (size64, h));
        p.maps.fetch_add(1, AcqRel);
        Ok(())
    })
}

fn unmap(d: &Driver, ptr: u64, size: u64) -> CuRes {
    let (len, h) = d
        .vmm_maps
        .lock()
        .remove(&ptr)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if len != size {
        d.vmm_maps.lock().insert(ptr, (len, h));
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(acc) = ACCESS.lock().as_mut() {
        acc.remove(&ptr);
    }
    // SAFETY: the range was our mapping; put a PROT_NONE reservation back.
    unsafe {
        libc::mmap(
            ptr as *mut c_void,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
    let p = phys_mem(d, h);
    if let Some(p) = p {
        p.maps.fetch_sub(1, AcqRel);
        maybe_free(d, h, &p);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| unmap(cu()?, ptr, size as u64))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if desc.is_null() || count == 0 || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut prot = libc::PROT_NONE;
        for i in 0..count {
            // SAFETY: desc holds count entries by the caller's contract.
            let a = unsafe { desc.add(i).read_unaligned() };
            if a.location.type_ != 1
                || d.check_dev(a.location.id).is_err()
                || !(0..=3).contains(&a.flags)
                || a.flags == 2
            {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            prot = match a.flags {
                1 => libc::PROT_READ,
                3 => libc::PROT_READ | libc::PROT_WRITE,
                _ => prot,
            };
        }
        // The whole range must be mapped.
        let maps = d.vmm_maps.lock();
        let mut cur = ptr;
        let end = ptr + size as u64;
        let mut starts = Vec::new();
        while cur < end {
            match maps.range(..=cur).next_back() {
                Some((s, (l, _))) if cur < s + l => {
                    starts.push(*s);
                    cur = s + l;
                }
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        // SAFETY: the whole range is our mapped memory.
        if unsafe { libc::mprotect(ptr as *mut c_void, size, prot) } != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut acc = ACCESS.lock();
        let acc = acc.get_or_insert_with(std::collections::HashMap::new);
        for s in starts {
            acc.insert(s, prot);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut u64,
    loc: *const CUmemAccessDesc,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if loc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mapped = d
            .vmm_maps
            .lock()
            .range(..=ptr)
            .next_back()
            .is_some_and(|(s, (l, _))| ptr < s + l);
        if !mapped {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: out pointer from the caller.
        unsafe { put(flags, 3, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    h: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let a = addr as u64;
        let found = d
            .vmm_maps
            .lock()
            .range(..=a)
            .next_back()
            .and_then(|(s, (l, id))| (a < s + l).then_some(*id));
        let id = found.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if h.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // The handle is a new reference, to be released with cuMemRelease.
        let p = phys_mem(d, id);
        if let Some(p) = p {
            p.refs.fetch_add(1, AcqRel);
        }
        // SAFETY: out pointer from the caller.
        unsafe { put(h, id, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// The properties a physical allocation was created with (pinned device
/// memory on its device).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    h: CUmemGenericAllocationHandle,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let (dev, handle_types) = phys_mem(d, h)
            .map(|p| (p.dev, p.handle_types))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let p = CUmemAllocationProp {
            type_: 1,
            requestedHandleTypes: handle_types,
            location: CUmemLocation {
                type_: 1,
                id: dev as i32,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: [0; 8],
        };
        // SAFETY: out pointer from the caller.
        unsafe { put(prop, p, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// The memfd name of a physical allocation on device N: `cgpu-sim-vmm-dN`.
const MEMFD_PREFIX: &str = "cgpu-sim-vmm-d";
const HANDLE_TYPE_POSIX_FD: i32 = 1;

/// `cuMemExportToShareableHandle`: a POSIX file descriptor (a duplicate of
/// the allocation's memfd, for the caller to close) when the allocation was
/// created exportable as one.
fn export_handle(out: *mut c_void, h: CUmemGenericAllocationHandle, ty: i32, flags: u64) -> CuRes {
    let d = cu()?;
    if out.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = phys_mem(d, h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ty != HANDLE_TYPE_POSIX_FD {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    if p.handle_types & HANDLE_TYPE_POSIX_FD == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: duplicating our own open memfd.
    let fd = unsafe { libc::dup(p.fd) };
    if fd < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: non-null out pointer to an int (the POSIX FD handle type).
    unsafe { (out as *mut i32).write_unaligned(fd) };
    Ok(())
}

/// The device of a memfd the sim made (from its name), and its size.
fn memfd_shape(fd: i32) -> Option<(usize, u64)> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let name = link.to_str()?.strip_prefix("/memfd:")?;
    let dev = name
        .strip_prefix(MEMFD_PREFIX)?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    // SAFETY: fstat on a descriptor the caller owns, into a local struct.
    let size = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return None;
        }
        st.st_size as u64
    };
    Some((dev, size))
}

/// `cuMemImportFromShareableHandle`: a new handle on memory another process
/// (or this one) exported; the caller keeps its descriptor.
fn import_handle(h: *mut CUmemGenericAllocationHandle, os: *mut c_void, ty: i32) -> CuRes {
    let d = cu()?;
    if h.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if ty != HANDLE_TYPE_POSIX_FD {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let fd = os as usize as i32;
    let (dev, size) = memfd_shape(fd).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if dev >= d.devs.len() || size == 0 || size % GRANULARITY != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: duplicating the caller's descriptor (checked to be a memfd).
    let own = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if own < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    d.touch_dev(dev);
    let id = NEXT_HANDLE.fetch_add(1, Relaxed);
    d.phys.lock().insert(
        id,
        Arc::new(PhysMem {
            dev,
            size,
            charged: 0,
            handle_types: HANDLE_TYPE_POSIX_FD,
            fd: own,
            released: AtomicBool::new(false),
            refs: AtomicU32::new(1),
            maps: AtomicU32::new(0),
        }),
    );
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(h, id, CUDA_ERROR_INVALID_VALUE) }
}

crate::exports! {
    cuMemExportToShareableHandle(out: *mut c_void, h: CUmemGenericAllocationHandle, ty: i32, flags: u64)
        => export_handle(out, h, ty, flags);
    cuMemImportFromShareableHandle(h: *mut CUmemGenericAllocationHandle, os: *mut c_void, ty: i32)
        => import_handle(h, os, ty);
}
