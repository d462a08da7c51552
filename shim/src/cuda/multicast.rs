//! Multicast objects (NVLink SHARP through NVSwitch): the simulated GPUs are
//! PCIe parts without it (`CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` is 0),
//! so the driver's answers are those of such a machine: creating an object
//! or asking its granularity is `CUDA_ERROR_NOT_SUPPORTED`, and since no
//! object can exist, every call on a handle is `CUDA_ERROR_INVALID_VALUE`.

use crate::driver::cu;
use crate::{exports, CuRes};
use cgpu_ffi::*;
use std::ffi::c_void;

/// The answer of a call on a multicast object handle: none exists.
fn no_object(dev: Option<CUdevice>) -> CuRes {
    let d = cu()?;
    if let Some(dev) = dev {
        d.check_dev(dev)?;
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}

/// Creating one or asking its granularity: valid arguments, then "not
/// supported" (the device has no multicast).
fn unsupported(out: *mut c_void, prop: *const c_void) -> CuRes {
    cu()?;
    if out.is_null() || prop.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Err(CUDA_ERROR_NOT_SUPPORTED)
}

type Handle = u64;

exports! {
    cuMulticastCreate(mc: *mut Handle, prop: *const c_void) => unsupported(mc as *mut c_void, prop);
    cuMulticastGetGranularity(g: *mut usize, prop: *const c_void, _option: u32) => unsupported(g as *mut c_void, prop);
    cuMulticastAddDevice(_mc: Handle, dev: CUdevice) => no_object(Some(dev));
    cuMulticastBindMem(_mc: Handle, _mc_off: usize, _mem: Handle, _mem_off: usize, _size: usize, _flags: u64) => no_object(None);
    cuMulticastBindMem_v2(_mc: Handle, dev: CUdevice, _mc_off: usize, _mem: Handle, _mem_off: usize, _size: usize, _flags: u64) => no_object(Some(dev));
    cuMulticastBindAddr(_mc: Handle, _mc_off: usize, _ptr: CUdeviceptr, _size: usize, _flags: u64) => no_object(None);
    cuMulticastBindAddr_v2(_mc: Handle, dev: CUdevice, _mc_off: usize, _ptr: CUdeviceptr, _size: usize, _flags: u64) => no_object(Some(dev));
    cuMulticastUnbind(_mc: Handle, dev: CUdevice, _mc_off: usize, _size: usize) => no_object(Some(dev));
}
