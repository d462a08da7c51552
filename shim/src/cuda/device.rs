//! Devices and their attributes.

use crate::driver::cu;
use crate::{guard, put, put_cstr, read_cstr};
use cgpu_ffi::*;
use std::ffi::c_char;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: i32) -> CUresult {
    guard(|| {
        let d = cu()?;
        if device.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let i = d.check_dev(ordinal)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(device, i as CUdevice, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut i32) -> CUresult {
    guard(|| {
        let d = cu()?;
        // SAFETY: out pointer from the caller.
        unsafe { put(count, d.devs.len() as i32, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: i32, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        if len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: buffer of len bytes from the caller.
        if unsafe { put_cstr(name, len as usize, &d.devs[i].name) } {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

/// `CUuuid` is 16 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(uuid, d.devs[i].uuid_bytes, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    std::hint::black_box(concat!(file!(), line!()));
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(bytes, d.devs[i].total as usize, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// Legacy 32-bit variant: saturates at 4 GiB - 1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut u32, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        let v = d.devs[i].total.min(u32::MAX as u64) as u32;
        // SAFETY: out pointer from the caller.
        unsafe { put(bytes, v, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// Not in `cgpu-ffi`: the largest `CU_LIMIT_PERSISTING_L2_CACHE_SIZE`.
pub const CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: CUdevice_attribute = 108;
/// Not in `cgpu-ffi`: exports to POSIX file descriptors are supported.
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: CUdevice_attribute = 103;

pub fn attribute(
    dev: &crate::driver::DevInfo,
    index: usize,
    attr: CUdevice_attribute,
) -> Option<i32> {
    let (maj, min) = dev.cc;
    let smem_sm = if maj >= 9 {
        233472
    } else if maj == 8 {
        167936
    } else {
        65536
    };
    Some(match attr {
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X | CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => 1024,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => 64,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i32::MAX,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65535,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => 49152,
        CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => 65536,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        CU_DEVICE_ATTRIBUTE_MAX_PITCH => i32::MAX,
        CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK => 65536,
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE => 1_590_000,
        CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT => 512,
        CU_DEVICE_ATTRIBUTE_GPU_OVERLAP => 1,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => dev.sms,
        CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT => 0,
        CU_DEVICE_ATTRIBUTE_INTEGRATED => 0,
        CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY => 1,
        CU_DEVICE_ATTRIBUTE_COMPUTE_MODE => 0,
        CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS => 1,
        CU_DEVICE_ATTRIBUTE_ECC_ENABLED => 0,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => dev.pci_bus as i32,
        CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID => 0,
        CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => 0,
        CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE => 5_001_000,
        CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => 256,
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => 4 << 20,
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => match (maj, min) {
            (7, 5) => 1024, // Turing
            _ if maj >= 8 && min != 0 => 1536,
            _ => 2048,
        },
        CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 2,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING => 1,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => maj,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => min,
        CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => smem_sm,
        CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY => 1,
        CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS => 1,
        CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH => 1,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => smem_sm - 1024,
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => {
            if maj >= 8 {
                32
            } else {
                16
            }
        }
        CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => 1,
        // cuMemCreate memory exports as a POSIX file descriptor.
        CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED => 1,
        // Three quarters of the L2 may persist (Ampere and later).
        CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE => {
            if maj >= 8 {
                3 << 20
            } else {
                0
            }
        }
        // MEMPOOL_SUPPORTED_HANDLE_TYPES: pools export as POSIX file
        // descriptors (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).
        119 => 1,
        84 => 0,            // MULTI_GPU_BOARD
        85 => index as i32, // MULTI_GPU_BOARD_GROUP_ID
        a if a > 0 && a < CU_DEVICE_ATTRIBUTE_MAX => 0,
        _ => return None,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut i32,
    attrib: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        if pi.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = attribute(&d.devs[i], i, attrib).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(pi, v, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut i32,
    minor: *mut i32,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        if major.is_null() || minor.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: out pointers from the caller.
        unsafe {
            put(major, d.devs[i].cc.0, CUDA_ERROR_INVALID_VALUE)?;
            put(minor, d.devs[i].cc.1, CUDA_ERROR_INVALID_VALUE)
        }
    })
}

pub fn pci_bus_id(bus: u32) -> String {
    format!("0000:{bus:02X}:00.0")
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    pci: *mut c_char,
    len: i32,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        if len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: buffer of len bytes from the caller.
        if unsafe { put_cstr(pci, len as usize, &pci_bus_id(d.devs[i].pci_bus)) } {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, pci: *const c_char) -> CUresult {
    guard(|| {
        let d = cu()?;
        // SAFETY: NUL-terminated string from the caller.
        let s = unsafe { read_cstr(pci) }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let want = s.trim().to_ascii_uppercase();
        for (i, info) in d.devs.iter().enumerate() {
            let id = pci_bus_id(info.pci_bus);
            if id == want || format!("0000{id}") == want || id[5..] == *want {
                // SAFETY: out pointer from the caller.
                return unsafe { put(dev, i as CUdevice, CUDA_ERROR_INVALID_VALUE) };
            }
        }
        Err(CUDA_ERROR_INVALID_DEVICE)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut i32,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let a = d.check_dev(dev)?;
        let b = d.check_dev(peer)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(can, (a != b) as i32, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut i32,
    attr: u32,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let (a, b) = (d.check_dev(src)?, d.check_dev(dst)?);
        if a == b || attr > 5 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // PERFORMANCE_RANK 0, ACCESS_SUPPORTED 1, NATIVE_ATOMIC 0, CUDA_ARRAY_ACCESS 0
        let v = i32::from(attr == 2);
        // SAFETY: out pointer from the caller.
        unsafe { put(value, v, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetExecAffinitySupport(
    pi: *mut i32,
    _typ: u32,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        d.check_dev(dev)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(pi, 0, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// LUIDs exist on Windows only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetLuid(
    _luid: *mut c_char,
    _mask: *mut u32,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        cu()?.check_dev(dev)?;
        Err(CUDA_ERROR_NOT_SUPPORTED)
    })
}

/// `cuDeviceGetHostAtomicCapabilities` / `cuDeviceGetP2PAtomicCapabilities`
/// (CUDA 13.0): what each atomic operation can do natively over the link.
/// The simulated GPUs sit on PCIe without native host or peer atomics
/// (`HOST_NATIVE_ATOMIC_SUPPORTED` and the P2P `NATIVE_ATOMIC_SUPPORTED` are
/// 0): no capability for any operation.
fn atomic_capabilities(
    caps: *mut u32,
    ops: *const u32,
    count: u32,
    devs: &[CUdevice],
) -> crate::CuRes {
    let d = cu()?;
    for &x in devs {
        d.check_dev(x)?;
    }
    if devs.len() == 2 && devs[0] == devs[1] {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    if caps.is_null() || ops.is_null() || count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..count as usize {
        // SAFETY: the caller's arrays of `count` elements.
        let op = unsafe { ops.add(i).read_unaligned() };
        if op > 12 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    for i in 0..count as usize {
        // SAFETY: as above.
        unsafe { caps.add(i).write_unaligned(0) };
    }
    Ok(())
}

crate::exports! {
    cuDeviceGetHostAtomicCapabilities(caps: *mut u32, ops: *const u32, count: u32, dev: CUdevice)
        => atomic_capabilities(caps, ops, count, &[dev]);
    cuDeviceGetP2PAtomicCapabilities(caps: *mut u32, ops: *const u32, count: u32, src: CUdevice, dst: CUdevice)
        => atomic_capabilities(caps, ops, count, &[src, dst]);
}
