//! Devices: `ALIYUN_COM_GPU_VISIBLE_DEVICES` hides the other GPUs from
//! `cuDeviceGetCount`/`cuDeviceGet` (container ordinal i → the i-th listed
//! GPU), and identifies a device's container-visible index for its quota.
//!
//! `cuDeviceGet` returns the driver's own `CUdevice` for the listed GPU, so
//! every later call that takes a `CUdevice` reaches the right GPU unchanged.

use std::ffi::c_char;
use std::sync::OnceLock;

use super::real;
use super::sig;
use super::types::*;
use crate::config::{self, DeviceSel};
use crate::driver::RealFn;
use crate::memory::{self, Gpu, GpuInfo};

/// Which host devices the container sees, in container order. Pure.
/// `count` host devices; `uuid_of(i)` the UUID of host device `i`.
/// Selectors naming no device are reported in the returned error list.
pub fn visible_list(
    sels: Option<&[DeviceSel]>,
    count: u32,
    uuid_of: &dyn Fn(u32) -> Option<String>,
) -> (Vec<u32>, Vec<String>) {
    let Some(sels) = sels else {
        return ((0..count).collect(), Vec::new());
    };
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for sel in sels {
        let found = match sel {
            DeviceSel::Index(i) => (*i < count).then_some(*i),
            DeviceSel::Uuid(u) => {
                (0..count).find(|&i| uuid_of(i).is_some_and(|x| x.eq_ignore_ascii_case(u)))
            }
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            Some(_) => {}
            None => errors.push(format!("{sel:?}")),
        }
    }
    (out, errors)
}

static CUDA_VISIBLE: OnceLock<Vec<u32>> = OnceLock::new();

fn cuda_uuid(dev: CUdevice) -> Option<String> {
    let mut u = CUuuid::default();
    let rc = match real::cuDeviceGetUuid_v2.get() {
        // SAFETY: u is a valid out-parameter.
        Some(f) => unsafe { f(&mut u, dev) },
        None => super::call_real!(real::cuDeviceGetUuid, &mut u, dev),
    };
    (rc == CUDA_SUCCESS).then(|| memory::format_uuid(&u.bytes))
}

/// The container-visible host ordinals (CUDA), or `Err` with the driver's
/// code (e.g. `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`; not cached).
pub fn cuda_visible() -> Result<&'static [u32], CUresult> {
    if let Some(v) = CUDA_VISIBLE.get() {
        return Ok(v);
    }
    let mut n: i32 = 0;
    let rc = super::call_real!(real::cuDeviceGetCount, &mut n);
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    let cfg = config::get();
    let uuid_of = |i: u32| {
        let mut d: CUdevice = 0;
        if super::call_real!(real::cuDeviceGet, &mut d, i as i32) != CUDA_SUCCESS {
            return None;
        }
        cuda_uuid(d)
    };
    let (list, errors) = visible_list(cfg.visible.as_deref(), n.max(0) as u32, &uuid_of);
    for e in errors {
        tracing::error!("cgpu: ALIYUN_COM_GPU_VISIBLE_DEVICES names {e}, which is not a GPU of this host; ignored");
    }
    Ok(CUDA_VISIBLE.get_or_init(|| list))
}

/// The container-visible index of host device `dev` (CUDA), `None` if hidden.
pub fn cuda_visible_index(dev: CUdevice) -> Option<usize> {
    let v = cuda_visible().ok()?;
    v.iter().position(|&d| d as i32 == dev)
}

/// Identity of CUDA device `dev` as the driver reports it (`None`: hidden
/// or unknown).
fn cuda_info(dev: CUdevice) -> Option<GpuInfo> {
    let visible_index = cuda_visible_index(dev)?;
    let uuid = cuda_uuid(dev)?;
    let mut total: usize = 0;
    if super::call_real!(real::cuDeviceTotalMem_v2, &mut total, dev) != CUDA_SUCCESS {
        return None;
    }
    Some(GpuInfo {
        uuid,
        host_index: dev as u32,
        visible_index,
        physical_total: total as u64,
    })
}

/// The tracked GPU for CUDA device `dev`, joining it on first use
/// (`None`: pass-through, or hidden). Only for calls that use the GPU
/// (allocate, create a context, launch); views use [`cuda_view_quota`].
pub fn cuda_gpu(dev: CUdevice) -> Option<&'static Gpu> {
    if !crate::memory::tracking() {
        return None;
    }
    memory::proc_state().gpu_for_cuda(dev, || cuda_info(dev))
}

/// The quota CUDA device `dev` shows (`None`: the physical view), without
/// joining it.
pub fn cuda_view_quota(dev: CUdevice) -> Option<u64> {
    if !crate::memory::tracking() {
        return None;
    }
    match memory::proc_state().joined_cuda(dev) {
        Some(g) => g.view_quota(),
        None => memory::peek(&cuda_info(dev)?)?.quota,
    }
}

/// A device `id` in a memory location (`CUmemLocation`), as the driver must
/// see it. Clients pass either the `CUdevice` our `cuDeviceGet` returned (a
/// host device: kept) or a device ordinal as the container counts them
/// (PyTorch passes its device index): translated to the listed host device.
/// Without `ALIYUN_COM_GPU_VISIBLE_DEVICES` both are the same.
pub fn host_device_for_location(id: i32) -> i32 {
    if !filtering() {
        return id;
    }
    let Ok(v) = cuda_visible() else { return id };
    if v.iter().any(|&d| d as i32 == id) {
        return id;
    }
    match usize::try_from(id).ok().and_then(|i| v.get(i)) {
        Some(&host) => host as i32,
        None => id,
    }
}

/// The device of the current context, if any.
pub fn current_device() -> Option<CUdevice> {
    let mut d: CUdevice = -1;
    (super::call_real!(real::cuCtxGetDevice, &mut d) == CUDA_SUCCESS).then_some(d)
}

/// The tracked GPU of the current context.
pub fn current_gpu() -> Option<&'static Gpu> {
    if !crate::memory::tracking() {
        return None;
    }
    cuda_gpu(current_device()?)
}

fn filtering() -> bool {
    config::get().visible.is_some()
}

/// `cuDeviceGetCount`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn device_get_count(real: &RealFn<sig::cuDeviceGetCount>, count: *mut i32) -> CUresult {
    if !filtering() || count.is_null() {
        return super::call_real!(real, count);
    }
    match cuda_visible() {
        Ok(v) => {
            // SAFETY: count is the caller's non-null out-parameter.
            unsafe { *count = v.len() as i32 };
            CUDA_SUCCESS
        }
        Err(rc) => rc,
    }
}

/// `cuDeviceGet`: container ordinal → the listed host device.
///
/// # Safety
/// The driver's contract.
pub unsafe fn device_get(
    real: &RealFn<sig::cuDeviceGet>,
    dev: *mut CUdevice,
    ordinal: i32,
) -> CUresult {
    if !filtering() {
        return super::call_real!(real, dev, ordinal);
    }
    match cuda_visible() {
        Ok(v) => match usize::try_from(ordinal).ok().and_then(|o| v.get(o)) {
            Some(&host) => super::call_real!(real, dev, host as i32),
            None => CUDA_ERROR_INVALID_DEVICE,
        },
        Err(rc) => rc,
    }
}

/// `cuDeviceGetByPCIBusId`: hidden devices are not found.
///
/// # Safety
/// The driver's contract.
pub unsafe fn device_get_by_pci_bus_id(
    real: &RealFn<sig::cuDeviceGetByPCIBusId>,
    dev: *mut CUdevice,
    bus: *const c_char,
) -> CUresult {
    let rc = super::call_real!(real, dev, bus);
    if rc != CUDA_SUCCESS || !filtering() || dev.is_null() {
        return rc;
    }
    // SAFETY: dev was just written by the driver.
    let d = unsafe { *dev };
    if cuda_visible_index(d).is_none() {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_lists() {
        let uuid = |i: u32| Some(format!("GPU-{i:08x}"));
        assert_eq!(visible_list(None, 3, &uuid).0, vec![0, 1, 2]);
        let sels = [DeviceSel::Index(2), DeviceSel::Uuid("gpu-00000000".into())];
        assert_eq!(visible_list(Some(&sels), 3, &uuid), (vec![2, 0], vec![]));
        let sels = [DeviceSel::Index(5), DeviceSel::Index(1)];
        let (l, e) = visible_list(Some(&sels), 3, &uuid);
        assert_eq!(l, vec![1]);
        assert_eq!(e.len(), 1);
    }
}
