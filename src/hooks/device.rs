//! Device hooks: `ALIYUN_COM_GPU_VISIBLE_DEVICES` hides the other GPUs from
//! `cuDeviceGetCount`/`cuDeviceGet`/`cuDeviceGetByPCIBusId` (container
//! ordinal i → the i-th listed GPU; the table is `process::gpus`').
//!
//! `cuDeviceGet` returns the driver's own `CUdevice` for the listed GPU, so
//! every later call that takes a `CUdevice` reaches the right GPU unchanged.

use std::ffi::c_char;

use super::sig;
use super::types::*;
use crate::config;
use crate::driver::RealFn;

pub use crate::memory::{cuda_gpu, cuda_view_quota, current_gpu};
pub use crate::process::gpus::{
    cuda_visible, cuda_visible_index, current_device, host_device_for_location, visible_list,
};

fn filtering() -> bool {
    config::get().visible.is_some()
}

/// Is `dev` (the driver's `CUdevice`) a GPU that
/// `ALIYUN_COM_GPU_VISIBLE_DEVICES` hides? A hidden GPU is unusable by its
/// number too: every hook that takes a device refuses it
/// (`CUDA_ERROR_INVALID_DEVICE`), so no context is made on it, hence no
/// allocation or launch reaches it. A list cgpu cannot read hides all.
pub fn hidden(dev: CUdevice) -> bool {
    filtering() && cuda_visible_index(dev).is_none()
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
