//! Interprocess memory handles (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`,
//! `cuIpcCloseMemHandle`), as PyTorch's multiprocessing shares CUDA tensors.
//!
//! Device memory is an anonymous mapping of the process that allocated it.
//! The first `cuIpcGetMemHandle` of an allocation moves it into a `memfd`
//! (its bytes copied, all-zero 64 KiB runs skipped so untouched memory stays
//! unbacked) mapped over the same addresses, so nothing changes for the
//! owner (but a write another thread makes to the allocation while that
//! first export copies it may be lost). The 64-byte handle names the
//! owner's pid and descriptor; another
//! process opens `/proc/<pid>/fd/<fd>` (same user, same PID namespace, as
//! the driver's handles work between processes of one machine) and maps the
//! same bytes. The memory stays charged to the owner only; a mapping lives
//! until its last `cuIpcCloseMemHandle` (or its context's end). Opening a
//! handle in the process that made it is `CUDA_ERROR_INVALID_CONTEXT`.
//!
//! Memory pools created exportable as POSIX file descriptors work the same
//! way: `cuMemPoolExportToShareableHandle` hands out a descriptor naming the
//! pool's owner, `cuMemPoolImportFromShareableHandle` makes a pool from it
//! in another process (one that only imports), `cuMemPoolExportPointer`
//! exports an allocation of the pool (64 bytes, as an IPC handle) and
//! `cuMemPoolImportPointer` maps it; the importer frees it with `cuMemFree`
//! or `cuMemFreeAsync`.
//!
//! Interprocess events (`CU_EVENT_INTERPROCESS`): the event's state is two
//! counters in a one-page `memfd` (records made, last record completed), so
//! every process that has the event sees each record: `cuIpcGetEventHandle`
//! names the creator's pid and descriptor (as a memory handle does),
//! `cuIpcOpenEventHandle` maps the same page. A record in any process
//! completes in that process's stream order; `cuEventQuery`,
//! `cuEventSynchronize` and `cuStreamWaitEvent` anywhere wait for it.

use crate::driver::{cu, Alloc, AllocKind, Driver, Obj, Pool};
use crate::{exports, put, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"cgIPCmem";
const MEMFD_PREFIX: &str = "cgpu-sim-ipc-d";
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
const LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// Allocations of this process exported so far: base address → memfd.
static EXPORTED: Mutex<Option<HashMap<u64, i32>>> = Mutex::new(None);
/// Handles opened here: (owner pid, owner's base) → (our address, opens).
type Opened = HashMap<(u32, u64), (u64, u32)>;
static OPENED: Mutex<Option<Opened>> = Mutex::new(None);

/// `CUipcMemHandle` (64 bytes): magic, owner pid, owner's descriptor, the
/// owner's base address, size, mapped length, device.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcMemHandle {
    magic: [u8; 8],
    pid: u32,
    fd: i32,
    base: u64,
    size: u64,
    map_len: u64,
    dev: u32,
    pad: [u8; 20],
}

const _: () = assert!(std::mem::size_of::<IpcMemHandle>() == 64);

/// The allocation at `p` is gone: its export (if any) goes with it.
pub fn forget_export(p: u64) {
    if let Some(fd) = EXPORTED.lock().as_mut().and_then(|m| m.remove(&p)) {
        // SAFETY: closing the memfd we created for this allocation.
        unsafe { libc::close(fd) };
    }
}

/// Copies `len` bytes at `src` into `fd`, skipping all-zero runs (the file
/// stays sparse where the memory was never written).
fn copy_into(fd: i32, src: u64, len: usize) -> bool {
    const RUN: usize = 64 << 10;
    let mut off = 0;
    while off < len {
        let n = RUN.min(len - off);
        // SAFETY: [src, src + len) is our live mapping.
        let chunk = unsafe { std::slice::from_raw_parts((src as usize + off) as *const u8, n) };
        if chunk.iter().any(|&b| b != 0) {
            // SAFETY: writing our own buffer into our own descriptor.
            let w = unsafe { libc::pwrite(fd, chunk.as_ptr() as *const c_void, n, off as i64) };
            if w != n as isize {
                return false;
            }
        }
        off += n;
    }
    true
}

/// The memfd of allocation `base` (made on its first export).
fn export_fd(base: u64, a: &Alloc) -> Result<i32, CUresult> {
    let mut ex = EXPORTED.lock();
    let map = ex.get_or_insert_with(HashMap::new);
    if let Some(fd) = map.get(&base) {
        return Ok(*fd);
    }
    let name = std::ffi::CString::new(format!("{MEMFD_PREFIX}{}", a.dev)).unwrap_or_default();
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let fail = |e| {
        // SAFETY: closing the memfd we just made.
        unsafe { libc::close(fd) };
        Err(e)
    };
    // SAFETY: sizing our fresh memfd.
    if unsafe { libc::ftruncate(fd, a.map_len as i64) } != 0 || !copy_into(fd, base, a.map_len) {
        return fail(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: replaces our own mapping [base, base + map_len) in place by
    // the memfd holding the same bytes.
    let p = unsafe {
        libc::mmap(
            base as *mut c_void,
            a.map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return fail(CUDA_ERROR_MAP_FAILED);
    }
    map.insert(base, fd);
    Ok(fd)
}

fn get_handle(out: *mut IpcMemHandle, dptr: CUdeviceptr) -> CuRes {
    let d = cu()?;
    d.cur_ctx()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let a = match d.allocs.lock().get(&dptr) {
        Some(a) if a.kind == AllocKind::Device && a.map_len > 0 => a.clone(),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    write_handle(out, dptr, &a)
}

/// Exports allocation `dptr` (`a`) and writes its handle to `out`.
fn write_handle(out: *mut IpcMemHandle, dptr: u64, a: &Alloc) -> CuRes {
    let fd = export_fd(dptr, a)?;
    let h = IpcMemHandle {
        magic: *MAGIC,
        pid: std::process::id(),
        fd,
        base: dptr,
        size: a.size,
        map_len: a.map_len as u64,
        dev: a.dev as u32,
        pad: [0; 20],
    };
    // SAFETY: non-null out pointer from the caller.
    unsafe { put(out, h, CUDA_ERROR_INVALID_VALUE) }
}

/// Whether `fd` is one of the sim's IPC memfds.
fn is_ipc_memfd(fd: i32) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .ok()
        .and_then(|l| {
            l.to_str()
                .map(|s| s.starts_with(&format!("/memfd:{MEMFD_PREFIX}")))
        })
        .unwrap_or(false)
}

fn open_handle(out: *mut CUdeviceptr, h: IpcMemHandle, flags: u32) -> CuRes {
    let d = cu()?;
    let (ctx, _) = d.cur_ctx()?;
    if out.is_null() || flags & !LAZY_ENABLE_PEER_ACCESS != 0 || h.magic != *MAGIC {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if h.pid == std::process::id() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    if h.dev as usize >= d.devs.len() || h.map_len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let key = (h.pid, h.base);
    let mut opened = OPENED.lock();
    let table = opened.get_or_insert_with(HashMap::new);
    if let Some((p, n)) = table.get_mut(&key) {
        if d.allocs.lock().contains_key(p) {
            *n += 1;
            // SAFETY: non-null out pointer from the caller.
            return unsafe { put(out, *p, CUDA_ERROR_INVALID_VALUE) };
        }
    }
    table.remove(&key);
    let path = std::ffi::CString::new(format!("/proc/{}/fd/{}", h.pid, h.fd))
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: opening a path we built, for reading and writing.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let r = map_opened(d, ctx, fd, &h);
    // SAFETY: the mapping (if any) keeps the memory; the descriptor goes.
    unsafe { libc::close(fd) };
    let p = r?;
    table.insert(key, (p, 1));
    // SAFETY: non-null out pointer from the caller.
    unsafe { put(out, p, CUDA_ERROR_INVALID_VALUE) }
}

fn map_opened(d: &Driver, ctx: usize, fd: i32, h: &IpcMemHandle) -> Result<u64, CUresult> {
    map_as(d, ctx, fd, h, AllocKind::Ipc, 0)
}

/// Maps exported memory `h` (its memfd `fd`) as an allocation of `kind`.
fn map_as(
    d: &Driver,
    ctx: usize,
    fd: i32,
    h: &IpcMemHandle,
    kind: AllocKind,
    pool: usize,
) -> Result<u64, CUresult> {
    if !is_ipc_memfd(fd) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let len = h.map_len as usize;
    // SAFETY: a new shared mapping of the memfd; no existing memory touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_MAP_FAILED);
    }
    d.touch_dev(h.dev as usize);
    d.allocs.lock().insert(
        p as u64,
        Alloc {
            size: h.size,
            charged: 0,
            dev: h.dev as usize,
            ctx,
            kind,
            map_len: len,
            pool,
        },
    );
    Ok(p as u64)
}

fn close_handle(dptr: CUdeviceptr) -> CuRes {
    let d = cu()?;
    d.cur_ctx()?;
    let mut opened = OPENED.lock();
    let table = opened.get_or_insert_with(HashMap::new);
    let key = table
        .iter()
        .find(|(_, (p, _))| *p == dptr)
        .map(|(k, _)| *k)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let last = match table.get_mut(&key) {
        Some((_, n)) => {
            *n -= 1;
            *n == 0
        }
        None => false,
    };
    if last {
        table.remove(&key);
        super::memory::free_dev(d, dptr, &[AllocKind::Ipc])?;
    }
    Ok(())
}

const POOL_MEMFD: &str = "cgpu-sim-pool";
const HANDLE_TYPE_POSIX_FD: i32 = 1;

/// `cuMemPoolExportToShareableHandle`: a descriptor (for the caller to
/// close) of a memfd whose name says the owner's pid and the pool's device.
fn export_pool(out: *mut c_void, pool: usize, ty: i32, flags: u64) -> CuRes {
    let d = cu()?;
    let p = super::memory::pool_of(d, pool)?;
    if out.is_null() || flags != 0 || p.imported_from != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if ty != HANDLE_TYPE_POSIX_FD {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    if p.handle_types & HANDLE_TYPE_POSIX_FD == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let name = std::ffi::CString::new(format!("{POOL_MEMFD}-{}-d{}", std::process::id(), p.dev))
        .unwrap_or_default();
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is the
    // caller's (not close-on-exec, as a descriptor to hand on).
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    if fd < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: non-null out pointer to an int (the POSIX FD handle type).
    unsafe { (out as *mut i32).write_unaligned(fd) };
    Ok(())
}

/// `cuMemPoolImportFromShareableHandle`: a pool of this process standing
/// for another process's (it only imports that pool's pointers).
fn import_pool(out: *mut usize, os: *mut c_void, ty: i32, flags: u64) -> CuRes {
    let d = cu()?;
    if out.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if ty != HANDLE_TYPE_POSIX_FD {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let fd = os as usize as i32;
    let link =
        std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let name = link
        .to_str()
        .and_then(|l| l.strip_prefix(&format!("/memfd:{POOL_MEMFD}-")));
    let (pid, dev) = name
        .and_then(|n| n.split(' ').next())
        .and_then(|n| n.split_once("-d"))
        .and_then(|(p, dv)| Some((p.parse::<u32>().ok()?, dv.parse::<usize>().ok()?)))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if dev >= d.devs.len() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = d.objs.lock().insert(Obj::Pool(Arc::new(Pool {
        managed: false,
        dev,
        attrs: Mutex::new(HashMap::new()),
        handle_types: HANDLE_TYPE_POSIX_FD,
        imported_from: pid,
    })));
    // SAFETY: non-null out pointer from the caller.
    unsafe { put(out, h, CUDA_ERROR_INVALID_VALUE) }
}

/// `cuMemPoolExportPointer`: an allocation of an exportable pool, as the
/// 64-byte `CUmemPoolPtrExportData`.
fn export_pointer(out: *mut IpcMemHandle, ptr: CUdeviceptr) -> CuRes {
    let d = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let a = match d.allocs.lock().get(&ptr) {
        Some(a) if a.kind == AllocKind::Async && a.map_len > 0 => a.clone(),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let p = super::memory::pool_of(d, a.pool)?;
    if p.handle_types & HANDLE_TYPE_POSIX_FD == 0 || p.imported_from != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write_handle(out, ptr, &a)
}

/// `cuMemPoolImportPointer`: maps an exported allocation of the pool `pool`
/// was imported from; freed with `cuMemFree(Async)`.
fn import_pointer(out: *mut CUdeviceptr, pool: usize, data: *const IpcMemHandle) -> CuRes {
    let d = cu()?;
    let (ctx, _) = d.cur_ctx()?;
    let p = super::memory::pool_of(d, pool)?;
    if out.is_null() || data.is_null() || p.imported_from == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null pointer to the caller's 64-byte export data.
    let h = unsafe { data.read_unaligned() };
    if h.magic != *MAGIC || h.pid != p.imported_from || h.dev as usize != p.dev || h.map_len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let path = std::ffi::CString::new(format!("/proc/{}/fd/{}", h.pid, h.fd))
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: opening a path we built, for reading and writing.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let r = if is_ipc_memfd(fd) {
        map_as(d, ctx, fd, &h, AllocKind::Async, pool)
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    };
    // SAFETY: the mapping (if any) keeps the memory; the descriptor goes.
    unsafe { libc::close(fd) };
    // SAFETY: non-null out pointer from the caller.
    unsafe { put(out, r?, CUDA_ERROR_INVALID_VALUE) }
}

exports! {
    cuMemPoolExportToShareableHandle(out: *mut c_void, pool: usize, ty: i32, flags: u64) => export_pool(out, pool, ty, flags);
    cuMemPoolImportFromShareableHandle(out: *mut usize, os: *mut c_void, ty: i32, flags: u64) => import_pool(out, os, ty, flags);
    cuMemPoolExportPointer(out: *mut IpcMemHandle, ptr: CUdeviceptr) => export_pointer(out, ptr);
    cuMemPoolImportPointer(out: *mut CUdeviceptr, pool: usize, data: *const IpcMemHandle) => import_pointer(out, pool, data);
}

exports! {
    cuIpcGetMemHandle(out: *mut IpcMemHandle, dptr: CUdeviceptr) => get_handle(out, dptr);
    cuIpcOpenMemHandle | cuIpcOpenMemHandle_v2(out: *mut CUdeviceptr, h: IpcMemHandle, flags: u32) => open_handle(out, h, flags);
    cuIpcCloseMemHandle(dptr: CUdeviceptr) => close_handle(dptr);
}

// ------------------------------------------------------------------ events

const EVENT_MAGIC: &[u8; 8] = b"cgIPCevt";

/// `CUipcEventHandle` (64 bytes): magic, creator pid, creator's descriptor.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcEventHandle {
    magic: [u8; 8],
    pid: u32,
    fd: i32,
    pad: [u8; 48],
}

const _: () = assert!(std::mem::size_of::<IpcEventHandle>() == 64);

/// The shared state of a new interprocess event (a zeroed page in a memfd).
pub fn new_event_state() -> Result<crate::exec::IpcEventState, CUresult> {
    let name = c"cgpu-sim-ipc-event";
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: sizing our fresh memfd.
    if unsafe { libc::ftruncate(fd, crate::exec::IPC_EVENT_BYTES as i64) } != 0 {
        // SAFETY: closing the memfd we just made.
        unsafe { libc::close(fd) };
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    crate::exec::IpcEventState::map(fd).ok_or(CUDA_ERROR_OUT_OF_MEMORY)
}

fn get_event_handle(out: *mut IpcEventHandle, ev: CUevent) -> CuRes {
    let d = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let e = d.event(ev as usize)?;
    let state = e.times.ipc.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let h = IpcEventHandle {
        magic: *EVENT_MAGIC,
        pid: std::process::id(),
        fd: state.fd,
        pad: [0; 48],
    };
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(out, h, CUDA_ERROR_INVALID_VALUE) }
}

fn open_event_handle(pev: *mut CUevent, h: IpcEventHandle) -> CuRes {
    let d = cu()?;
    if pev.is_null() || h.magic != *EVENT_MAGIC {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (_, c) = d.cur_ctx()?;
    let path = std::ffi::CString::new(format!("/proc/{}/fd/{}", h.pid, h.fd))
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: opening a path we built (NUL-terminated).
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        // The creator is gone (or not ours to reach).
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let state = crate::exec::IpcEventState::map(fd).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let e = crate::driver::Event {
        dev: std::sync::atomic::AtomicU32::new(c.dev as u32),
        flags: CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING,
        times: Arc::new(crate::exec::EventTimes {
            ipc: Some(state),
            ..Default::default()
        }),
        captured: Mutex::new(None),
    };
    let handle = d.objs.lock().insert(Obj::Event(Arc::new(e)));
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pev, handle as CUevent, CUDA_ERROR_INVALID_VALUE) }
}

exports! {
    cuIpcGetEventHandle(out: *mut IpcEventHandle, ev: CUevent) => get_event_handle(out, ev);
    cuIpcOpenEventHandle(pev: *mut CUevent, h: IpcEventHandle) => open_event_handle(pev, h);
}
