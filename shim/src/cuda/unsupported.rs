//! Features the simulated GPU does not have: green contexts and device
//! resources, multicast objects, memory shared through OS handles, tensor
//! maps, batched stream memory operations. The functions exist, because
//! clients resolve them up front and refuse to load without them (PyTorch's
//! driver table requires every name it asks for; cuBLAS looks several up),
//! and answer `CUDA_ERROR_NOT_SUPPORTED`, each call counted as a stub (see
//! `crate::stubs`).

use crate::guard;
use cgpu_ffi::*;
use std::ffi::c_void;

macro_rules! unsupported {
    ($($name:ident($($a:ident: $t:ty),*);)+) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            std::hint::black_box(stringify!($name));
            guard(|| {
                $(let _ = $a;)*
                crate::stub_hit!(stringify!($name));
                Err(CUDA_ERROR_NOT_SUPPORTED)
            })
        }
    )+};
}

unsupported! {
    // Memory shared with other processes through OS handles.
    cuMemExportToShareableHandle(handle: *mut c_void, mem: u64, kind: u32, flags: u64);
    cuMemImportFromShareableHandle(mem: *mut u64, handle: *mut c_void, kind: u32);
    // Multicast objects (NVLink SHARP).
    cuMulticastCreate(mc: *mut u64, prop: *const c_void);
    cuMulticastAddDevice(mc: u64, dev: CUdevice);
    cuMulticastBindMem(mc: u64, mc_off: usize, mem: u64, mem_off: usize, size: usize, flags: u64);
    cuMulticastUnbind(mc: u64, dev: CUdevice, mc_off: usize, size: usize);
    cuMulticastGetGranularity(g: *mut usize, prop: *const c_void, option: u32);
    // Green contexts and device resources.
    cuGreenCtxCreate(ctx: *mut *mut c_void, desc: *mut c_void, dev: CUdevice, flags: u32);
    cuGreenCtxDestroy(ctx: *mut c_void);
    cuGreenCtxStreamCreate(s: *mut CUstream, ctx: *mut c_void, flags: u32, prio: i32);
    cuCtxFromGreenCtx(ctx: *mut CUcontext, green: *mut c_void);
    cuDeviceGetDevResource(dev: CUdevice, res: *mut c_void, kind: u32);
    cuDevSmResourceSplitByCount(out: *mut c_void, n: *mut u32, input: *const c_void, rest: *mut c_void, flags: u32, min: u32);
    cuDevResourceGenerateDesc(desc: *mut *mut c_void, res: *mut c_void, n: u32);
    // Tensor memory access descriptors (TMA, compute capability 9.0+).
    cuTensorMapEncodeTiled(map: *mut c_void, dtype: u32, rank: u32, addr: *mut c_void, dims: *const u64, strides: *const u64, box_dim: *const u32, elem_strides: *const u32, interleave: u32, swizzle: u32, l2: u32, oob: u32);
    // Batched stream memory operations.
    cuStreamBatchMemOp_v2(s: CUstream, n: u32, ops: *mut c_void, flags: u32);
    cuStreamBatchMemOp_v2_ptsz(s: CUstream, n: u32, ops: *mut c_void, flags: u32);
}
