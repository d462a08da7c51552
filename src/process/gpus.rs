//! GPU identity and visibility, and lazy joining.
//!
//! - Visibility: `ALIYUN_COM_GPU_VISIBLE_DEVICES` lists the GPUs the
//!   container sees, by host index or UUID; [`visible_list`] turns it into
//!   host indices in container order, once for the CUDA driver
//!   ([`cuda_visible`]) and once for NVML ([`nvml_visible`]), the same rule
//!   for both. Container index i is the i-th listed GPU.
//! - Identity: a GPU is its UUID (`GPU-…`); [`cuda_info`] and the NVML side
//!   give UUID, host index, container index and physical total.
//! - Joining: [`cuda_gpu`] joins the GPU's ledger on first use and is only
//!   for calls that use the GPU (allocate, create a context, launch);
//!   [`cuda_view_quota`] and [`nvml_peek`] answer views without joining.

use std::ffi::c_char;
use std::sync::OnceLock;

use super::real;
use super::types::*;
use crate::config::{self, DeviceSel};
use crate::memory::{self, Gpu, GpuInfo, Peek};

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
        None => crate::process::call_real!(real::cuDeviceGetUuid, &mut u, dev),
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
    let rc = crate::process::call_real!(real::cuDeviceGetCount, &mut n);
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    let cfg = config::get();
    let uuid_of = |i: u32| {
        let mut d: CUdevice = 0;
        if crate::process::call_real!(real::cuDeviceGet, &mut d, i as i32) != CUDA_SUCCESS {
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
pub fn cuda_info(dev: CUdevice) -> Option<GpuInfo> {
    let visible_index = cuda_visible_index(dev)?;
    let uuid = cuda_uuid(dev)?;
    let mut total: usize = 0;
    if crate::process::call_real!(real::cuDeviceTotalMem_v2, &mut total, dev) != CUDA_SUCCESS {
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
    (crate::process::call_real!(real::cuCtxGetDevice, &mut d) == CUDA_SUCCESS).then_some(d)
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

static NVML_VISIBLE: OnceLock<Vec<u32>> = OnceLock::new();

fn nvml_uuid(h: nvmlDevice_t) -> Option<String> {
    let mut buf = [0 as c_char; 96];
    if crate::process::call_real!(
        real::nvmlDeviceGetUUID,
        h,
        buf.as_mut_ptr(),
        buf.len() as u32
    ) != NVML_SUCCESS
    {
        return None;
    }
    let bytes = buf.map(|c| c as u8);
    Some(super::cstr::text_lossy(&bytes))
}

fn nvml_handle(index: u32) -> Option<nvmlDevice_t> {
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    (crate::process::call_real!(real::nvmlDeviceGetHandleByIndex_v2, index, &mut h) == NVML_SUCCESS)
        .then_some(h)
}

/// The container-visible host indices (NVML); `Err` = NVML's code (not cached).
pub fn nvml_visible() -> Result<&'static [u32], nvmlReturn_t> {
    if let Some(v) = NVML_VISIBLE.get() {
        return Ok(v);
    }
    let mut n = 0u32;
    let rc = crate::process::call_real!(real::nvmlDeviceGetCount_v2, &mut n);
    if rc != NVML_SUCCESS {
        return Err(rc);
    }
    let cfg = config::get();
    let uuid_of = |i: u32| nvml_handle(i).and_then(nvml_uuid);
    let (list, errors) = visible_list(cfg.visible.as_deref(), n, &uuid_of);
    for e in errors {
        tracing::error!("cgpu: ALIYUN_COM_GPU_VISIBLE_DEVICES names {e}, which is not a GPU of this host; ignored");
    }
    Ok(NVML_VISIBLE.get_or_init(|| list))
}

/// The host index of the GPU behind NVML handle `h`.
pub(crate) fn nvml_handle_host_index(h: nvmlDevice_t) -> Option<u32> {
    let mut i = 0u32;
    (crate::process::call_real!(real::nvmlDeviceGetIndex, h, &mut i) == NVML_SUCCESS).then_some(i)
}

/// What the container sees of the GPU behind an NVML handle (`None`:
/// pass-through or hidden). NVML calls only look: they never join the GPU;
/// a GPU this process joined answers from its membership, another from the
/// configuration and the ledger.
pub(crate) fn nvml_peek(h: nvmlDevice_t) -> Option<Peek> {
    if !crate::memory::tracking() {
        return None;
    }
    let uuid = nvml_uuid(h)?;
    if let Some(g) = memory::proc_state().gpu_by_uuid(&uuid) {
        return Some(g.peek());
    }
    let host = nvml_handle_host_index(h)?;
    let visible_index = nvml_visible().ok()?.iter().position(|&i| i == host)?;
    let mut m = nvmlMemory_t::default();
    if crate::process::call_real!(real::nvmlDeviceGetMemoryInfo, h, &mut m) != NVML_SUCCESS {
        return None;
    }
    memory::peek(&GpuInfo {
        uuid,
        host_index: host,
        visible_index,
        physical_total: m.total,
    })
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
