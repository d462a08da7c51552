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

    /// One health check of `gpus`, taking up to about `wait_ms`: the faults
    /// seen (a healthy GPU lost, or a critical XID error on any GPU watched
    /// reported since the last check). The default: GPUs never fail.
    fn check_health(&self, gpus: &[NodeGpu], wait_ms: u32) -> Vec<(u32, Fault)> {
        let _ = gpus;
        std::thread::sleep(std::time::Duration::from_millis(wait_ms.into()));
        Vec::new()
    }

    /// Whether GPU `index` answers now (its handle and memory size can be
    /// read): a lost GPU that answers again is back. The default: it does.
    fn answers(&self, index: u32) -> bool {
        let _ = index;
        true
    }
}

/// What went wrong with a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The GPU fell off the bus: NVML answers `NVML_ERROR_GPU_IS_LOST` for
    /// it, or reported XID 79.
    Lost,
    /// A critical XID error (not one caused by an application).
    Xid(u64),
}

impl Fault {
    /// Whether the fault means the GPU fell off the bus: such a GPU is
    /// back as soon as it answers again.
    pub fn is_lost(self) -> bool {
        self == Fault::Lost
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Lost => f.write_str("the GPU fell off the bus (lost)"),
            Fault::Xid(x) => write!(f, "critical XID error {x}"),
        }
    }
}

/// XID 79: the GPU has fallen off the bus.
pub const XID_FALLEN_OFF_THE_BUS: u64 = 79;

/// `NVML_ERROR_GPU_IS_LOST`.
const NVML_ERROR_GPU_IS_LOST: c_int = 15;
/// `nvmlEventTypeXidCriticalError`.
const EVENT_XID_CRITICAL: u64 = 0x8;

/// XID errors caused by an application, not by the GPU (NVIDIA's device
/// plugin skips the same ones): a GPU stays healthy after them.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// NVML from `libnvidia-ml.so.1` (or the path in `CGPU_NVML_LIB`).
pub struct Nvml {
    lib: libloading::Library,
    /// The event set the GPUs' XID errors arrive on, with the handles
    /// registered (made at the first health check; `None` inside when NVML
    /// offers no events).
    events: parking_lot::Mutex<Option<Option<EventSet>>>,
}

struct EventSet {
    set: usize,
    handles: Vec<(usize, u32)>,
    /// GPUs whose registration failed (warned about once, not retried).
    unwatched: Vec<u32>,
}

/// `nvmlEventData_t`.
#[repr(C)]
struct EventData {
    device: Device,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
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
type SetCreateFn = unsafe extern "C" fn(*mut usize) -> c_int;
type RegisterFn = unsafe extern "C" fn(Device, c_ulonglong, usize) -> c_int;
type WaitFn = unsafe extern "C" fn(usize, *mut EventData, c_uint) -> c_int;

impl Nvml {
    pub fn load() -> Result<Nvml, String> {
        let path = std::env::var("CGPU_NVML_LIB").unwrap_or_else(|_| "libnvidia-ml.so.1".into());
        // SAFETY: loading NVML runs its initialisers, which have no
        // preconditions on our side.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
            format!("cannot load NVML ({path}): {e}; is the NVIDIA driver installed on this node?")
        })?;
        let n = Nvml {
            lib,
            events: parking_lot::Mutex::new(None),
        };
        // SAFETY: nvmlInit_v2 has the signature declared by InitFn.
        let rc = unsafe { n.sym::<InitFn>(b"nvmlInit_v2\0")?() };
        if rc != 0 {
            return Err(format!("nvmlInit_v2 failed: NVML error {rc}"));
        }
        Ok(n)
    }

    /// The event set for `gpus`' XID errors, made on first use; healthy
    /// GPUs not yet registered (lost at start, back since) are registered
    /// on it as they come.
    fn event_set(&self, gpus: &[NodeGpu]) -> Option<(usize, Vec<(usize, u32)>)> {
        let mut ev = self.events.lock();
        let made = ev.get_or_insert_with(|| {
            // SAFETY: looked up with its NVML C signature.
            let create = unsafe { self.sym::<SetCreateFn>(b"nvmlEventSetCreate\0").ok()? };
            let mut set = 0usize;
            // SAFETY: set is a valid out-parameter.
            if unsafe { create(&mut set) } != 0 {
                tracing::warn!("NVML offers no event set: XID errors are not watched");
                return None;
            }
            Some(EventSet {
                set,
                handles: Vec::new(),
                unwatched: Vec::new(),
            })
        });
        let e = made.as_mut()?;
        // SAFETY: each symbol is looked up with its NVML C signature.
        let syms = unsafe {
            (
                self.sym::<HandleFn>(b"nvmlDeviceGetHandleByIndex_v2\0"),
                self.sym::<RegisterFn>(b"nvmlDeviceRegisterEvents\0"),
            )
        };
        if let (Ok(handle), Ok(register)) = syms {
            for g in gpus.iter().filter(|g| !g.unhealthy) {
                if e.handles.iter().any(|(_, i)| *i == g.index) || e.unwatched.contains(&g.index) {
                    continue;
                }
                let mut dev: Device = std::ptr::null_mut();
                // SAFETY: dev is a valid out-parameter; e.set is NVML's.
                let ok = unsafe {
                    handle(g.index, &mut dev) == 0 && register(dev, EVENT_XID_CRITICAL, e.set) == 0
                };
                if ok {
                    e.handles.push((dev as usize, g.index));
                } else {
                    tracing::warn!("GPU{}: XID errors cannot be watched", g.index);
                    e.unwatched.push(g.index);
                }
            }
        }
        Some((e.set, e.handles.clone()))
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
            if rc == NVML_ERROR_GPU_IS_LOST {
                // A GPU lost before the plugin started offers nothing.
                tracing::warn!("GPU{i} is lost (NVML_ERROR_GPU_IS_LOST): marked unhealthy");
                out.push(NodeGpu {
                    index: i,
                    uuid: String::new(),
                    memory_mib: 0,
                    gib: 0,
                    model: String::new(),
                    unhealthy: true,
                    mib: false,
                });
                continue;
            }
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
                unhealthy: false,
                mib: false,
            });
        }
        Ok(out)
    }

    fn answers(&self, index: u32) -> bool {
        // SAFETY: each symbol is looked up with its NVML C signature.
        let syms = unsafe {
            (
                self.sym::<HandleFn>(b"nvmlDeviceGetHandleByIndex_v2\0"),
                self.sym::<MemFn>(b"nvmlDeviceGetMemoryInfo\0"),
            )
        };
        let (Ok(handle), Ok(mem)) = syms else {
            return false;
        };
        let mut dev: Device = std::ptr::null_mut();
        let mut m = MemoryInfo::default();
        // SAFETY: dev and m are valid out-parameters; dev is NVML's handle
        // when the first call succeeded.
        unsafe { handle(index, &mut dev) == 0 && mem(dev, &mut m) == 0 && m.total > 0 }
    }

    fn check_health(&self, gpus: &[NodeGpu], wait_ms: u32) -> Vec<(u32, Fault)> {
        let mut failed = Vec::new();
        // SAFETY: looked up with its NVML C signature.
        if let Ok(handle) = unsafe { self.sym::<HandleFn>(b"nvmlDeviceGetHandleByIndex_v2\0") } {
            for g in gpus.iter().filter(|g| !g.unhealthy) {
                let mut dev: Device = std::ptr::null_mut();
                // SAFETY: dev is a valid out-parameter.
                if unsafe { handle(g.index, &mut dev) } == NVML_ERROR_GPU_IS_LOST {
                    failed.push((g.index, Fault::Lost));
                }
            }
        }
        // SAFETY: looked up with its NVML C signature.
        let wait = unsafe { self.sym::<WaitFn>(b"nvmlEventSetWait_v2\0") };
        match (self.event_set(gpus), wait) {
            (Some((set, handles)), Ok(wait)) => {
                let mut e = EventData {
                    device: std::ptr::null_mut(),
                    event_type: 0,
                    event_data: 0,
                    gpu_instance_id: 0,
                    compute_instance_id: 0,
                };
                // SAFETY: e is a valid nvmlEventData_t; set is NVML's.
                let rc = unsafe { wait(set, &mut e, wait_ms) };
                // Neither an event nor NVML_ERROR_TIMEOUT: NVML cannot wait,
                // so pace the checks here.
                if rc != 0 && rc != 10 {
                    std::thread::sleep(std::time::Duration::from_millis(wait_ms.into()));
                }
                if rc == 0
                    && e.event_type & EVENT_XID_CRITICAL != 0
                    && !APPLICATION_XIDS.contains(&e.event_data)
                {
                    // An event for no GPU in particular concerns them all.
                    for (h, i) in &handles {
                        if e.device.is_null() || *h == e.device as usize {
                            failed.push((
                                *i,
                                if e.event_data == XID_FALLEN_OFF_THE_BUS {
                                    Fault::Lost
                                } else {
                                    Fault::Xid(e.event_data)
                                },
                            ));
                        }
                    }
                }
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(wait_ms.into())),
        }
        failed
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
