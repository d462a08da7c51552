//! A small CUDA driver-API program: it queries the GPU, allocates until the
//! driver refuses, and launches a kernel. `cargo build` builds it as
//! `target/{debug,release}/cuda-driver-example`; run it on a real GPU, on the
//! simulated one, with or without `libcgpu.so`, and compare what it sees:
//!
//! ```sh
//! cargo build --release
//! target/release/cgpu-sim-stat --install-dir /tmp/simgpu      # the simulated driver's libcuda.so.1
//! LD_LIBRARY_PATH=/tmp/simgpu CGPU_SIM_GPUS="23028:NVIDIA A10" \
//!   LD_PRELOAD=$PWD/target/release/libcgpu.so ALIYUN_COM_GPU_MEM_CONTAINER=4 \
//!   target/release/cuda-driver-example
//! ```
//!
//! Under `libcgpu.so` with a 4 GiB quota it sees a 4096 MiB GPU and gets
//! `CUDA_ERROR_OUT_OF_MEMORY` at the quota; without, the whole GPU. It loads
//! the driver the way most programs and frameworks do (`dlopen` of
//! `libcuda.so.1`, then `dlsym`), so it needs no CUDA toolkit to build. The
//! kernel is PTX text, compiled by the driver on a real GPU; the simulated
//! GPU runs it for its device time but computes nothing.
//!
//! Options: `--block-mib N` (allocation size, default 256), `--max-blocks N`
//! (stop after N blocks even if the driver would give more, default 64).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::process::ExitCode;

type CuResult = c_int;
type Ptr = *mut c_void;

/// The kernel: `out[i] = value` for every `i < n`, one thread per word.
const PTX: &str = "\
.version 7.0
.target sm_52
.address_size 64
.visible .entry cgpu_example_fill(.param .u64 out, .param .u32 value, .param .u32 n)
{
  .reg .pred %p;
  .reg .b32 %r<6>;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [value];
  ld.param.u32 %r2, [n];
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %tid.x;
  mad.lo.s32 %r3, %r3, %r4, %r5;
  setp.ge.u32 %p, %r3, %r2;
  @%p bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r3, 4;
  add.s64 %rd4, %rd2, %rd3;
  st.global.u32 [%rd4], %r1;
DONE:
  ret;
}
\0";

/// The driver functions used, with their C signatures from `cuda.h`.
struct Cu {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult,
    device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> CuResult,
    ctx_create: unsafe extern "C" fn(*mut Ptr, c_uint, c_int) -> CuResult,
    ctx_destroy: unsafe extern "C" fn(Ptr) -> CuResult,
    ctx_synchronize: unsafe extern "C" fn() -> CuResult,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(u64) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> CuResult,
    memset_d32: unsafe extern "C" fn(u64, c_uint, usize) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut Ptr, *const c_void) -> CuResult,
    module_get_function: unsafe extern "C" fn(*mut Ptr, Ptr, *const c_char) -> CuResult,
    launch_kernel: unsafe extern "C" fn(
        Ptr,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Ptr,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    _lib: libloading::Library,
}

fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
    let n = format!("{name}\0");
    // SAFETY: each call site names the driver function whose C signature the
    // type parameter spells out (from cuda.h).
    unsafe {
        let s: libloading::Symbol<T> = lib.get(n.as_bytes()).map_err(|e| format!("{name}: {e}"))?;
        Ok(*s)
    }
}

impl Cu {
    fn load() -> Result<Cu, String> {
        // SAFETY: loading the driver runs its initialisers, as in every CUDA
        // program.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|e| {
            format!("cannot load libcuda.so.1 ({e}): no NVIDIA driver here; for the simulated one, see the top of examples/driver_api.rs")
        })?;
        Ok(Cu {
            init: sym(&lib, "cuInit")?,
            driver_get_version: sym(&lib, "cuDriverGetVersion")?,
            device_get_count: sym(&lib, "cuDeviceGetCount")?,
            device_get: sym(&lib, "cuDeviceGet")?,
            device_get_name: sym(&lib, "cuDeviceGetName")?,
            device_total_mem: sym(&lib, "cuDeviceTotalMem_v2")?,
            ctx_create: sym(&lib, "cuCtxCreate_v2")?,
            ctx_destroy: sym(&lib, "cuCtxDestroy_v2")?,
            ctx_synchronize: sym(&lib, "cuCtxSynchronize")?,
            mem_get_info: sym(&lib, "cuMemGetInfo_v2")?,
            mem_alloc: sym(&lib, "cuMemAlloc_v2")?,
            mem_free: sym(&lib, "cuMemFree_v2")?,
            memcpy_dtoh: sym(&lib, "cuMemcpyDtoH_v2")?,
            memset_d32: sym(&lib, "cuMemsetD32_v2")?,
            module_load_data: sym(&lib, "cuModuleLoadData")?,
            module_get_function: sym(&lib, "cuModuleGetFunction")?,
            launch_kernel: sym(&lib, "cuLaunchKernel")?,
            get_error_name: sym(&lib, "cuGetErrorName")?,
            _lib: lib,
        })
    }

    /// `0 (CUDA_SUCCESS)`, `2 (CUDA_ERROR_OUT_OF_MEMORY)`, …
    fn name(&self, r: CuResult) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: valid out-pointer; the driver returns a static string.
        let known = unsafe { (self.get_error_name)(r, &mut s) } == 0 && !s.is_null();
        let text = if known {
            // SAFETY: a NUL-terminated static string from the driver.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        } else {
            "unknown".into()
        };
        format!("{r} ({text})")
    }

    fn check(&self, r: CuResult, what: &str) -> Result<(), String> {
        if r == 0 {
            Ok(())
        } else {
            Err(format!("{what} returned {}", self.name(r)))
        }
    }
}

const MIB: usize = 1 << 20;

fn run(block_mib: usize, max_blocks: usize) -> Result<(), String> {
    let cu = Cu::load()?;
    let (mut version, mut count, mut dev) = (0, 0, 0);
    let mut name = [0 as c_char; 256];
    let mut total = 0usize;
    let mut ctx: Ptr = std::ptr::null_mut();
    // SAFETY: driver calls with valid out-pointers to locals, in the order
    // the driver API requires (init, then devices, then a context).
    unsafe {
        cu.check((cu.init)(0), "cuInit")?;
        cu.check((cu.driver_get_version)(&mut version), "cuDriverGetVersion")?;
        cu.check((cu.device_get_count)(&mut count), "cuDeviceGetCount")?;
        println!(
            "driver API {}.{}, {count} GPU(s) visible",
            version / 1000,
            version % 1000 / 10
        );
        if count == 0 {
            return Err("no GPU visible".into());
        }
        cu.check((cu.device_get)(&mut dev, 0), "cuDeviceGet")?;
        cu.check(
            (cu.device_get_name)(name.as_mut_ptr(), name.len() as c_int, dev),
            "cuDeviceGetName",
        )?;
        cu.check((cu.device_total_mem)(&mut total, dev), "cuDeviceTotalMem")?;
        let name = CStr::from_ptr(name.as_ptr()).to_string_lossy();
        println!("GPU 0: {name}, {} MiB (cuDeviceTotalMem)", total / MIB);
        cu.check((cu.ctx_create)(&mut ctx, 0, dev), "cuCtxCreate")?;
    }
    let meminfo = || -> Result<(usize, usize), String> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; a context is current.
        cu.check(
            unsafe { (cu.mem_get_info)(&mut free, &mut total) },
            "cuMemGetInfo",
        )?;
        Ok((free, total))
    };
    let (free, total) = meminfo()?;
    println!(
        "cuMemGetInfo: {} MiB free of {} MiB",
        free / MIB,
        total / MIB
    );

    println!("allocating {block_mib} MiB at a time (at most {max_blocks} blocks):");
    let mut blocks = Vec::new();
    let refused = loop {
        if blocks.len() == max_blocks {
            break None;
        }
        let mut p = 0u64;
        // SAFETY: valid out-pointer; a context is current.
        let r = unsafe { (cu.mem_alloc)(&mut p, block_mib * MIB) };
        if r != 0 {
            break Some(r);
        }
        blocks.push(p);
    };
    let got = blocks.len() * block_mib;
    match refused {
        Some(r) => println!(
            "  got {} blocks ({got} MiB), then cuMemAlloc returned {}",
            blocks.len(),
            cu.name(r)
        ),
        None => println!(
            "  got {} blocks ({got} MiB), the most asked for",
            blocks.len()
        ),
    }
    let (free, _) = meminfo()?;
    println!("  cuMemGetInfo now: {} MiB free", free / MIB);
    for p in blocks.drain(..) {
        // SAFETY: an allocation of this context, freed once.
        cu.check(unsafe { (cu.mem_free)(p) }, "cuMemFree")?;
    }

    const WORDS: u32 = 1 << 20;
    const VALUE: u32 = 0xC6F0;
    let mut module: Ptr = std::ptr::null_mut();
    let mut func: Ptr = std::ptr::null_mut();
    let mut out = 0u64;
    // SAFETY: driver calls with valid out-pointers; the PTX is
    // NUL-terminated; the kernel's parameters point at live locals of the
    // types its signature declares; the buffer holds WORDS u32s.
    unsafe {
        cu.check(
            (cu.module_load_data)(&mut module, PTX.as_ptr().cast()),
            "cuModuleLoadData",
        )?;
        cu.check(
            (cu.module_get_function)(&mut func, module, c"cgpu_example_fill".as_ptr()),
            "cuModuleGetFunction",
        )?;
        cu.check(
            (cu.mem_alloc)(&mut out, WORDS as usize * 4),
            "cuMemAlloc (kernel output)",
        )?;
        cu.check((cu.memset_d32)(out, 0, WORDS as usize), "cuMemsetD32")?;
        let (mut p_out, mut p_value, mut p_n) = (out, VALUE, WORDS);
        let mut params: [*mut c_void; 3] = [
            (&mut p_out as *mut u64).cast(),
            (&mut p_value as *mut u32).cast(),
            (&mut p_n as *mut u32).cast(),
        ];
        cu.check(
            (cu.launch_kernel)(
                func,
                WORDS / 256,
                1,
                1,
                256,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            "cuLaunchKernel",
        )?;
        cu.check((cu.ctx_synchronize)(), "cuCtxSynchronize")?;
    }
    let mut host = vec![0u32; WORDS as usize];
    // SAFETY: `host` holds WORDS u32s, `out` as many bytes on the device.
    cu.check(
        unsafe { (cu.memcpy_dtoh)(host.as_mut_ptr().cast(), out, WORDS as usize * 4) },
        "cuMemcpyDtoH",
    )?;
    let written = host.iter().filter(|&&w| w == VALUE).count();
    println!(
        "kernel cgpu_example_fill: launched on {WORDS} words, synchronised; {written} of them hold its value{}",
        if written == 0 {
            " (a simulated GPU computes nothing)"
        } else {
            ""
        }
    );
    // SAFETY: the buffer and the context made above, released once.
    unsafe {
        cu.check((cu.mem_free)(out), "cuMemFree")?;
        cu.check((cu.ctx_destroy)(ctx), "cuCtxDestroy")?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut block_mib = 256usize;
    let mut max_blocks = 64usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |what: &str| -> Option<usize> {
            let v = args.next().and_then(|v| v.parse().ok()).filter(|&n| n > 0);
            if v.is_none() {
                eprintln!("cuda-driver-example: {what} takes a positive number");
            }
            v
        };
        match a.as_str() {
            "--block-mib" => match number("--block-mib") {
                Some(n) => block_mib = n,
                None => return ExitCode::from(2),
            },
            "--max-blocks" => match number("--max-blocks") {
                Some(n) => max_blocks = n,
                None => return ExitCode::from(2),
            },
            "-h" | "--help" => {
                println!("usage: cuda-driver-example [--block-mib N] [--max-blocks N]  (see examples/driver_api.rs)");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("cuda-driver-example: unknown argument '{other}' (try --help)");
                return ExitCode::from(2);
            }
        }
    }
    match run(block_mib, max_blocks) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuda-driver-example: {e}");
            ExitCode::FAILURE
        }
    }
}
