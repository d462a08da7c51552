//! The node's GPUs through NVML, loaded with `dlopen` at run time (so the
//! plugin builds without NVIDIA's libraries and the simulated driver serves
//! in tests). Behind a trait so the device plugin can be driven without one.

use cgpu_cluster_core::decision::{gpu_gib, NodeGpu};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};

/// Where the node's GPUs come from.
pub trait GpuSource: Send + Sync {
    /// The GPUs in NVML order; `stated_gib` overrides each one's size in GiB
    /// (the node's `cgpu.io/gpu-mem-dev` label).
    fn gpus(&self, stated_gib: Option<u64>) -> Result<Vec<NodeGpu>, String>;
}

/// NVML from `libnvidia-ml.so.1` (or the path in `CGPU_NVML_LIB`).
pub struct Nvml {
    lib: libloading::Library,
}

#[repr(C)]
#[derive(Default)]
struct MemoryInfo {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> c_int;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
type UuidFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int;
type MemFn = unsafe extern "C" fn(Device, *mut MemoryInfo) -> c_int;

impl Nvml {
    pub fn load() -> Result<Nvml, String> {
        let path = std::env::var("CGPU_NVML_LIB").unwrap_or_else(|_| "libnvidia-ml.so.1".into());
        // SAFETY: loading NVML runs its initialisers, which have no
        // preconditions on our side.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
            format!("cannot load NVML ({path}): {e}; is the NVIDIA driver installed on this node?")
        })?;
        let n = Nvml { lib };
        // SAFETY: nvmlInit_v2 has the signature declared by InitFn.
        let rc = unsafe { n.sym::<InitFn>(b"nvmlInit_v2\0")?() };
        if rc != 0 {
            return Err(format!("nvmlInit_v2 failed: NVML error {rc}"));
        }
        Ok(n)
    }

    /// # Safety
    /// `T` must be the C signature of the symbol named.
    unsafe fn sym<T: Copy>(&self, name: &[u8]) -> Result<T, String> {
        // SAFETY: per this function's contract.
        unsafe { self.lib.get::<T>(name) }.map(|s| *s).map_err(|e| {
            format!(
                "NVML lacks {}: {e}",
                String::from_utf8_lossy(&name[..name.len() - 1])
            )
        })
    }
}

impl GpuSource for Nvml {
    fn gpus(&self, stated_gib: Option<u64>) -> Result<Vec<NodeGpu>, String> {
        // SAFETY: each symbol is looked up with its NVML C signature.
        let (count, handle, uuid, name, mem) = unsafe {
            (
                self.sym::<CountFn>(b"nvmlDeviceGetCount_v2\0")?,
                self.sym::<HandleFn>(b"nvmlDeviceGetHandleByIndex_v2\0")?,
                self.sym::<UuidFn>(b"nvmlDeviceGetUUID\0")?,
                // nvmlDeviceGetName has the same signature as GetUUID.
                self.sym::<UuidFn>(b"nvmlDeviceGetName\0")?,
                self.sym::<MemFn>(b"nvmlDeviceGetMemoryInfo\0")?,
            )
        };
        let mut n: c_uint = 0;
        // SAFETY: n is a valid out-parameter.
        let rc = unsafe { count(&mut n) };
        if rc != 0 {
            return Err(format!("nvmlDeviceGetCount_v2 failed: NVML error {rc}"));
        }
        let mut out = Vec::new();
        for i in 0..n {
            let mut dev: Device = std::ptr::null_mut();
            // SAFETY: dev is a valid out-parameter; i < count.
            let rc = unsafe { handle(i, &mut dev) };
            if rc != 0 {
                return Err(format!(
                    "nvmlDeviceGetHandleByIndex_v2({i}) failed: NVML error {rc}"
                ));
            }
            let mut buf = [0 as c_char; 96];
            // SAFETY: buf holds buf.len() bytes; NVML NUL-terminates within it.
            let rc = unsafe { uuid(dev, buf.as_mut_ptr(), buf.len() as c_uint) };
            if rc != 0 {
                return Err(format!("nvmlDeviceGetUUID({i}) failed: NVML error {rc}"));
            }
            // SAFETY: NVML wrote a NUL-terminated string into buf (zeroed).
            let u = unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            let mut nbuf = [0 as c_char; 96];
            // SAFETY: nbuf holds nbuf.len() bytes; NVML NUL-terminates within it.
            let model = if unsafe { name(dev, nbuf.as_mut_ptr(), nbuf.len() as c_uint) } == 0 {
                // SAFETY: NVML wrote a NUL-terminated string into nbuf (zeroed).
                unsafe { CStr::from_ptr(nbuf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            } else {
                String::new()
            };
            let mut m = MemoryInfo::default();
            // SAFETY: m is a valid nvmlMemory_t out-parameter.
            let rc = unsafe { mem(dev, &mut m) };
            if rc != 0 {
                return Err(format!(
                    "nvmlDeviceGetMemoryInfo({i}) failed: NVML error {rc}"
                ));
            }
            let mib = m.total / (1024 * 1024);
            out.push(NodeGpu {
                index: i,
                uuid: u,
                memory_mib: mib,
                gib: gpu_gib(mib, stated_gib),
                model,
            });
        }
        Ok(out)
    }
}

/// A fixed list of GPUs (tests, and nodes described by configuration).
pub struct StaticGpus(pub Vec<NodeGpu>);

impl GpuSource for StaticGpus {
    fn gpus(&self, stated_gib: Option<u64>) -> Result<Vec<NodeGpu>, String> {
        Ok(self
            .0
            .iter()
            .map(|g| NodeGpu {
                gib: gpu_gib(g.memory_mib, stated_gib),
                ..g.clone()
            })
            .collect())
    }
}
