//! Functions the sim exports so that clients which resolve every driver
//! function find them, but cannot simulate: each is a counted stub
//! (`stub_fns!`, see `stubs.rs`) answering `CUDA_ERROR_NOT_SUPPORTED`, plus
//! a few deprecated or hint-only calls whose real behaviour is to accept and
//! do nothing (those are not stubs). Every name here is listed in
//! `shim/README.md`.

use crate::driver::cu;
use crate::{exports, put, stub_fns, CuRes};
use cgpu_ffi::*;

stub_fns! {
    CUresult = CUDA_ERROR_NOT_SUPPORTED =>
        // Graphics interop (OpenGL, EGL, VDPAU): no display in the sim.
        cuGLCtxCreate, cuGLGetDevices, cuGLInit, cuGLMapBufferObject, cuGLMapBufferObjectAsync,
        cuGLRegisterBufferObject, cuGLSetBufferObjectMapFlags, cuGLUnmapBufferObject,
        cuGLUnmapBufferObjectAsync, cuGLUnregisterBufferObject, cuGraphicsGLRegisterBuffer,
        cuGraphicsGLRegisterImage, cuGraphicsEGLRegisterImage, cuGraphicsResourceGetMappedEglFrame,
        cuGraphicsVDPAURegisterOutputSurface, cuGraphicsVDPAURegisterVideoSurface,
        cuGraphicsMapResources, cuGraphicsUnmapResources, cuGraphicsResourceGetMappedMipmappedArray,
        cuGraphicsResourceGetMappedPointer, cuGraphicsResourceSetMapFlags,
        cuGraphicsSubResourceGetMappedArray, cuGraphicsUnregisterResource,
        cuEGLStreamConsumerAcquireFrame, cuEGLStreamConsumerConnect,
        cuEGLStreamConsumerConnectWithFlags, cuEGLStreamConsumerDisconnect,
        cuEGLStreamConsumerReleaseFrame, cuEGLStreamProducerConnect, cuEGLStreamProducerDisconnect,
        cuEGLStreamProducerPresentFrame, cuEGLStreamProducerReturnFrame, cuEventCreateFromEGLSync,
        cuVDPAUCtxCreate, cuVDPAUGetDevice;
    CUresult = CUDA_ERROR_NOT_SUPPORTED =>
        // Texture and surface references (removed in CUDA 12) and the
        // pre-4.0 launch API.
        cuTexRefCreate, cuTexRefDestroy, cuTexRefGetAddress, cuTexRefGetAddressMode,
        cuTexRefGetArray, cuTexRefGetBorderColor, cuTexRefGetFilterMode, cuTexRefGetFlags,
        cuTexRefGetFormat, cuTexRefGetMaxAnisotropy, cuTexRefGetMipmapFilterMode,
        cuTexRefGetMipmapLevelBias, cuTexRefGetMipmapLevelClamp, cuTexRefGetMipmappedArray,
        cuTexRefSetAddress, cuTexRefSetAddress2D, cuTexRefSetAddressMode, cuTexRefSetArray,
        cuTexRefSetBorderColor, cuTexRefSetFilterMode, cuTexRefSetFlags, cuTexRefSetFormat,
        cuTexRefSetMaxAnisotropy, cuTexRefSetMipmapFilterMode, cuTexRefSetMipmapLevelBias,
        cuTexRefSetMipmapLevelClamp, cuTexRefSetMipmappedArray, cuSurfRefGetArray,
        cuSurfRefSetArray, cuModuleGetTexRef, cuModuleGetSurfRef, cuParamSetTexRef, cuProfilerInitialize;
    CUresult = CUDA_ERROR_NOT_SUPPORTED =>
        // External memory and semaphores (Vulkan/DirectX/NvSci
        // objects), dma-buf handles.
        cuImportExternalMemory, cuDestroyExternalMemory, cuExternalMemoryGetMappedBuffer,
        cuExternalMemoryGetMappedMipmappedArray, cuImportExternalSemaphore,
        cuDestroyExternalSemaphore, cuSignalExternalSemaphoresAsync, cuWaitExternalSemaphoresAsync,
        cuMemGetHandleForAddressRange, cuDeviceGetNvSciSyncAttributes;
    CUresult = CUDA_ERROR_NOT_SUPPORTED =>
        // Decompression.
        cuMemBatchDecompressAsync,
        cuFabricCpyBatchAsync;
    CUresult = CUDA_ERROR_NOT_SUPPORTED =>
        // Fabric, cliques, CIG capture, logical endpoints.
        cuDeviceGetFabricClusterUuid, cuDeviceGetCliqueCount, cuDeviceGetCliqueInfo,
        cuStreamBeginCaptureToCig, cuStreamEndCaptureToCig,
        cuLogicalEndpointAddDevice, cuLogicalEndpointBindAddr, cuLogicalEndpointBindMem,
        cuLogicalEndpointCreate, cuLogicalEndpointDestroy, cuLogicalEndpointExport,
        cuLogicalEndpointGetLimits, cuLogicalEndpointIdRelease, cuLogicalEndpointIdReserve,
        cuLogicalEndpointImport, cuLogicalEndpointQuery, cuLogicalEndpointUnbind;
}

/// `CUdevprop` (deprecated `cuDeviceGetProperties`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct DevProp {
    pub max_threads_per_block: i32,
    pub max_threads_dim: [i32; 3],
    pub max_grid_size: [i32; 3],
    pub shared_mem_per_block: i32,
    pub total_constant_memory: i32,
    pub simd_width: i32,
    pub mem_pitch: i32,
    pub regs_per_block: i32,
    pub clock_rate: i32,
    pub texture_align: i32,
}

fn device_properties(p: *mut DevProp, dev: CUdevice) -> CuRes {
    let d = cu()?;
    let i = d.check_dev(dev)?;
    let a = |x| super::device::attribute(&d.devs[i], i, x).unwrap_or(0);
    let v = DevProp {
        max_threads_per_block: a(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        max_threads_dim: [
            a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X),
            a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
            a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z),
        ],
        max_grid_size: [
            a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X),
            a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
            a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z),
        ],
        shared_mem_per_block: a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
        total_constant_memory: a(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY),
        simd_width: a(CU_DEVICE_ATTRIBUTE_WARP_SIZE),
        mem_pitch: a(CU_DEVICE_ATTRIBUTE_MAX_PITCH),
        regs_per_block: a(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK),
        clock_rate: a(CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
        texture_align: a(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT),
    };
    // SAFETY: out pointer from the caller.
    unsafe { put(p, v, CUDA_ERROR_INVALID_VALUE) }
}

/// Parameters of a function: from its PTX `.entry` (offsets as the driver
/// packs them) or its cubin's `.nv.info.<kernel>` section, or the one `u64`
/// of the sim's own `cgpu_sim_spin*` kernels; a kernel of an image that
/// describes none (an unreadable part) has no parameter list in the sim (a
/// counted stub call).
fn param_list(f: usize) -> Result<Vec<(u64, u64)>, CUresult> {
    let d = cu()?;
    let func = d.func(f)?;
    let from_image = match d.objs.lock().get(func.module) {
        Some(crate::driver::Obj::Module(m)) => m
            .image
            .params
            .iter()
            .find(|(n, _)| *n == func.name)
            .map(|(_, p)| p.clone()),
        _ => None,
    };
    match from_image {
        Some(p) => Ok(p),
        None if func.timing == crate::driver::Timing::Spin => Ok(vec![(0, 8)]),
        None => {
            crate::stub_hit!("cuFuncGetParamInfo(kernel of a binary image)");
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
    }
}

fn param_info(
    f: usize,
    index: usize,
    off: *mut usize,
    size: *mut usize,
    count: *mut usize,
) -> CuRes {
    let list = param_list(f)?;
    if !count.is_null() {
        // SAFETY: non-null out pointer from the caller.
        return unsafe { put(count, list.len(), CUDA_ERROR_INVALID_VALUE) };
    }
    let (o, s) = *list.get(index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: out pointers from the caller.
    unsafe {
        put(off, o as usize, CUDA_ERROR_INVALID_VALUE)?;
        if !size.is_null() {
            put(size, s as usize, CUDA_ERROR_INVALID_VALUE)?;
        }
    }
    Ok(())
}

type PStr = *mut usize;

exports! {
    // Execution affinity is not supported (cuDeviceGetExecAffinitySupport
    // says 0): the driver's answer.
    cuCtxGetExecAffinity(p: *mut u64, _ty: u32) => {
        cu()?.cur_ctx()?;
        if p.is_null() { return Err(CUDA_ERROR_INVALID_VALUE) }
        Err(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY)
    };
    cuDeviceGetProperties(p: *mut DevProp, dev: CUdevice) => device_properties(p, dev);
    cuDeviceGetTexture1DLinearMaxWidth(w: *mut usize, _fmt: u32, ch: u32, dev: CUdevice) => {
        cu()?.check_dev(dev)?;
        if !matches!(ch, 1 | 2 | 4) { return Err(CUDA_ERROR_INVALID_VALUE) }
        // SAFETY: out pointer from the caller.
        unsafe { put(w, 1 << 27, CUDA_ERROR_INVALID_VALUE) }
    };
    // Deprecated shared memory bank configuration: accepted, no effect.
    cuCtxGetSharedMemConfig(cfg: *mut u32) => {
        cu()?.cur_ctx()?;
        // CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE
        // SAFETY: out pointer from the caller.
        unsafe { put(cfg, 1, CUDA_ERROR_INVALID_VALUE) }
    };
    cuCtxSetSharedMemConfig(cfg: u32) => {
        cu()?.cur_ctx()?;
        if cfg > 2 { return Err(CUDA_ERROR_INVALID_VALUE) }
        Ok(())
    };
    cuFuncSetSharedMemConfig(f: CUfunction, cfg: u32) => {
        cu()?.func(f as usize)?;
        if cfg > 2 { return Err(CUDA_ERROR_INVALID_VALUE) }
        Ok(())
    };
    cuKernelSetCacheConfig(k: CUkernel, cfg: u32, dev: CUdevice) => {
        let d = cu()?;
        d.func(k as usize)?;
        d.check_dev(dev)?;
        if cfg > 3 { return Err(CUDA_ERROR_INVALID_VALUE) }
        Ok(())
    };
    // Nothing is outstanding: device writes are visible at once in the sim.
    cuFlushGPUDirectRDMAWrites(target: u32, scope: u32) => {
        cu()?;
        if target != 0 || scope > 200 { return Err(CUDA_ERROR_INVALID_VALUE) }
        Ok(())
    };
    cuStreamCopyAttributes | cuStreamCopyAttributes_ptsz(dst: CUstream, src: CUstream) => {
        let d = cu()?;
        d.stream(dst as usize)?;
        d.stream(src as usize)?;
        // Stream attributes are the defaults on every stream in the sim.
        Ok(())
    };
    cuFuncGetParamInfo(f: CUfunction, index: usize, off: PStr, size: PStr)
        => param_info(f as usize, index, off, size, std::ptr::null_mut());
    cuKernelGetParamInfo(k: CUkernel, index: usize, off: PStr, size: PStr)
        => param_info(k as usize, index, off, size, std::ptr::null_mut());
    cuFuncGetParamCount(f: CUfunction, count: PStr)
        => { if count.is_null() { return Err(CUDA_ERROR_INVALID_VALUE) } param_info(f as usize, 0, std::ptr::null_mut(), std::ptr::null_mut(), count) };
    cuKernelGetParamCount(k: CUkernel, count: PStr)
        => { if count.is_null() { return Err(CUDA_ERROR_INVALID_VALUE) } param_info(k as usize, 0, std::ptr::null_mut(), std::ptr::null_mut(), count) };
}
