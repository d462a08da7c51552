//! Which tracked GPU (`Gpu`: this process's account on its ledger) a CUDA
//! device or an NVML handle is. [`cuda_gpu`] joins the GPU's ledger on
//! first use and is only for calls that use the GPU (allocate, create a
//! context, launch); [`cuda_view_quota`] and `nvml_peek` answer views
//! without joining (in secure mode they say `Hello` to the node agent once
//! per GPU: the container's row is known only from its answer). The GPUs'
//! identity and visibility are `crate::process::gpus`'.

use super::{peek, proc_state, tracking, Gpu, GpuInfo, Peek};
use crate::process::gpus::{cuda_info, current_device, nvml_identity};
use crate::process::real;
use crate::process::types::*;

/// The tracked GPU for CUDA device `dev`, joining it on first use
/// (`None`: pass-through, or hidden). Only for calls that use the GPU
/// (allocate, create a context, launch); views use [`cuda_view_quota`].
pub fn cuda_gpu(dev: CUdevice) -> Option<&'static Gpu> {
    if !tracking() {
        return None;
    }
    proc_state().gpu_for_cuda(dev, || cuda_info(dev))
}

/// The quota CUDA device `dev` shows (`None`: the physical view), without
/// joining it (in secure mode: see [`peek`]).
pub fn cuda_view_quota(dev: CUdevice) -> Option<u64> {
    if !tracking() {
        return None;
    }
    match proc_state().joined_cuda(dev) {
        Some(g) => g.view_quota(),
        None => peek(&cuda_info(dev)?)?.quota,
    }
}

/// The tracked GPU of the current context.
pub fn current_gpu() -> Option<&'static Gpu> {
    if !tracking() {
        return None;
    }
    cuda_gpu(current_device()?)
}

/// What the container sees of the GPU behind an NVML handle (`None`:
/// pass-through or hidden). NVML calls only look: they never join the GPU
/// (in secure mode: see [`peek`]); a GPU this process joined answers from
/// its membership, another from the configuration and the ledger.
pub(crate) fn nvml_peek(h: nvmlDevice_t) -> Option<Peek> {
    if !tracking() {
        return None;
    }
    let (host, visible_index, uuid) = nvml_identity(h)?;
    if let Some(g) = proc_state().gpu_by_uuid(&uuid) {
        return Some(g.peek());
    }
    let mut m = nvmlMemory_t::default();
    if crate::process::call_real!(real::nvmlDeviceGetMemoryInfo, h, &mut m) != NVML_SUCCESS {
        return None;
    }
    peek(&GpuInfo {
        uuid,
        host_index: host,
        visible_index,
        physical_total: m.total,
    })
}
