//! NVML (what `nvidia-smi` and pynvml read): visible devices only, memory
//! info (v1 and v2) in the quota view with the container's used bytes, and
//! process lists filtered to the container's processes.

use std::ffi::c_char;

use super::sig;
use super::types::*;
use crate::config;
use crate::driver::RealFn;

use crate::memory::nvml_peek;
use crate::process::gpus::{
    nvml_handle_host_index as host_index, nvml_visible, nvml_visible_index,
};

fn filtering() -> bool {
    config::get().visible.is_some()
}

/// `nvmlInit`, `nvmlInit_v2`.
///
/// # Safety
/// NVML's contract.
pub unsafe fn init(real: &RealFn<sig::nvmlInit_v2>) -> nvmlReturn_t {
    config::get();
    super::call_real!(real,)
}

/// `nvmlInitWithFlags`.
///
/// # Safety
/// NVML's contract.
pub unsafe fn init_with_flags(real: &RealFn<sig::nvmlInitWithFlags>, flags: u32) -> nvmlReturn_t {
    config::get();
    super::call_real!(real, flags)
}

/// `nvmlDeviceGetCount` / `_v2`.
///
/// # Safety
/// NVML's contract.
pub unsafe fn device_get_count(
    real: &RealFn<sig::nvmlDeviceGetCount_v2>,
    count: *mut u32,
) -> nvmlReturn_t {
    if !filtering() || count.is_null() {
        return super::call_real!(real, count);
    }
    match nvml_visible() {
        Ok(v) => {
            // SAFETY: non-null out-parameter.
            unsafe { *count = v.len() as u32 };
            NVML_SUCCESS
        }
        Err(rc) => rc,
    }
}

/// `nvmlDeviceGetHandleByIndex` / `_v2`: container index → the listed GPU.
///
/// # Safety
/// NVML's contract.
pub unsafe fn handle_by_index(
    real: &RealFn<sig::nvmlDeviceGetHandleByIndex_v2>,
    index: u32,
    dev: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    if !filtering() {
        return super::call_real!(real, index, dev);
    }
    match nvml_visible() {
        Ok(v) => match v.get(index as usize) {
            Some(&host) => super::call_real!(real, host, dev),
            None => NVML_ERROR_INVALID_ARGUMENT,
        },
        Err(rc) => rc,
    }
}

fn hide(rc: nvmlReturn_t, dev: *mut nvmlDevice_t) -> nvmlReturn_t {
    if rc != NVML_SUCCESS || !filtering() || dev.is_null() {
        return rc;
    }
    // SAFETY: written by NVML on success.
    let h = unsafe { *dev };
    let visible = host_index(h).is_some_and(|i| nvml_visible_index(i).is_some());
    if visible {
        rc
    } else {
        NVML_ERROR_NOT_FOUND
    }
}

/// `nvmlDeviceGetHandleByUUID`: hidden GPUs are not found.
///
/// # Safety
/// NVML's contract.
pub unsafe fn handle_by_uuid(
    real: &RealFn<sig::nvmlDeviceGetHandleByUUID>,
    uuid: *const c_char,
    dev: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    hide(super::call_real!(real, uuid, dev), dev)
}

/// `nvmlDeviceGetHandleByPciBusId` / `_v2`: hidden GPUs are not found.
///
/// # Safety
/// NVML's contract.
pub unsafe fn handle_by_pci(
    real: &RealFn<sig::nvmlDeviceGetHandleByPciBusId_v2>,
    bus: *const c_char,
    dev: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    hide(super::call_real!(real, bus, dev), dev)
}

/// `nvmlDeviceGetIndex`: the container's index.
///
/// # Safety
/// NVML's contract.
pub unsafe fn device_get_index(
    real: &RealFn<sig::nvmlDeviceGetIndex>,
    dev: nvmlDevice_t,
    index: *mut u32,
) -> nvmlReturn_t {
    let rc = super::call_real!(real, dev, index);
    if rc != NVML_SUCCESS || !filtering() || index.is_null() {
        return rc;
    }
    // SAFETY: written by NVML on success.
    let host = unsafe { *index };
    match nvml_visible_index(host) {
        Some(p) => {
            // SAFETY: non-null out-parameter.
            unsafe { *index = p as u32 };
            rc
        }
        None => NVML_ERROR_NOT_FOUND,
    }
}

/// The container's view: `(total, free, used)` or `None` for the physical view.
fn view(dev: nvmlDevice_t, phys_free: u64) -> Option<(u64, u64, u64)> {
    let p = nvml_peek(dev)?;
    let q = p.quota?;
    let (free, total) = p.view(phys_free, q);
    Some((total, free, p.used))
}

/// `nvmlDeviceGetMemoryInfo`: total = quota, used = the container's.
///
/// # Safety
/// NVML's contract.
pub unsafe fn memory_info(
    real: &RealFn<sig::nvmlDeviceGetMemoryInfo>,
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let rc = super::call_real!(real, dev, mem);
    if rc == NVML_SUCCESS && !mem.is_null() {
        // SAFETY: non-null, written by NVML.
        let m = unsafe { &mut *mem };
        if let Some((total, free, used)) = view(dev, m.free) {
            *m = nvmlMemory_t { total, free, used };
        }
    }
    rc
}

/// `nvmlDeviceGetMemoryInfo_v2` (`version` 0x02000028, checked by NVML).
///
/// # Safety
/// NVML's contract.
pub unsafe fn memory_info_v2(
    real: &RealFn<sig::nvmlDeviceGetMemoryInfo_v2>,
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let rc = super::call_real!(real, dev, mem);
    if rc == NVML_SUCCESS && !mem.is_null() {
        // SAFETY: non-null, written by NVML.
        let m = unsafe { &mut *mem };
        if let Some((total, free, used)) = view(dev, m.free) {
            m.total = total;
            m.reserved = 0;
            m.free = free;
            m.used = used;
        }
    }
    rc
}

/// Keep only the container's processes, in place; returns the new count.
fn filter<T: Copy>(dev: nvmlDevice_t, infos: *mut T, n: u32, pid: impl Fn(&T) -> u32) -> u32 {
    if infos.is_null() || n == 0 {
        return n;
    }
    let Some(p) = nvml_peek(dev) else { return n };
    let pids = p.pids;
    // SAFETY: NVML wrote n entries into the caller's buffer.
    let s = unsafe { std::slice::from_raw_parts_mut(infos, n as usize) };
    let mut k = 0;
    for i in 0..s.len() {
        if pids.contains(&pid(&s[i])) {
            s[k] = s[i];
            k += 1;
        }
    }
    k as u32
}

/// `nvmlDeviceGetComputeRunningProcesses_v2` / `_v3`.
///
/// # Safety
/// NVML's contract.
pub unsafe fn processes(
    real: &RealFn<sig::nvmlDeviceGetComputeRunningProcesses_v3>,
    dev: nvmlDevice_t,
    count: *mut u32,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    let rc = super::call_real!(real, dev, count, infos);
    if rc == NVML_SUCCESS && !count.is_null() {
        // SAFETY: non-null count, written by NVML.
        unsafe { *count = filter(dev, infos, *count, |p| p.pid) };
    }
    rc
}

/// `nvmlDeviceGetComputeRunningProcesses` (v1 entries).
///
/// # Safety
/// NVML's contract.
pub unsafe fn processes_v1(
    real: &RealFn<sig::nvmlDeviceGetComputeRunningProcesses>,
    dev: nvmlDevice_t,
    count: *mut u32,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    let rc = super::call_real!(real, dev, count, infos);
    if rc == NVML_SUCCESS && !count.is_null() {
        // SAFETY: as above.
        unsafe { *count = filter(dev, infos, *count, |p| p.pid) };
    }
    rc
}
