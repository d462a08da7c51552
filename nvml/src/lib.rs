//! What the GPU itself says, from NVML (`libnvidia-ml.so.1`, loaded at run
//! time, never linked): each GPU's index, UUID and memory, the compute
//! processes on it and what each holds, and each process's use of its SMs.
//! These are the device's own books, which no process can change from user
//! space. The node agent and the tools read NVML through this one loader.
//!
//! [`Nvml::open`] needs every function the agent uses (the per-process
//! utilization is optional there); [`Nvml::open_for_utilization`] needs only
//! what the per-process utilization needs.

use libloading::Library;
use std::ffi::{c_char, c_void, CString};

type Device = *mut c_void;

/// `nvmlProcessInfo_t` (`_v2`/`_v3` functions): what a process holds.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: u32,
    used_gpu_memory: u64,
    gpu_instance_id: u32,
    compute_instance_id: u32,
}

/// `nvmlProcessUtilizationSample_t`: one process's use of the GPU over
/// one sample period, ending at `time_stamp` (µs since the epoch).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UtilSample {
    pid: u32,
    time_stamp: u64,
    sm_util: u32,
    mem_util: u32,
    enc_util: u32,
    dec_util: u32,
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

const SUCCESS: u32 = 0;
const ERROR_NOT_FOUND: u32 = 6;
const ERROR_INSUFFICIENT_SIZE: u32 = 7;
/// `NVML_VALUE_NOT_AVAILABLE` in `usedGpuMemory`.
const NOT_AVAILABLE: u64 = u64::MAX;

/// The library's file name.
const LIBRARY: &str = "libnvidia-ml.so.1";

type GetHandleByUuid = unsafe extern "C" fn(*const c_char, *mut Device) -> u32;
type RunningProcesses = unsafe extern "C" fn(Device, *mut u32, *mut ProcessInfo) -> u32;
type GetCount = unsafe extern "C" fn(*mut u32) -> u32;
type GetHandleByIndex = unsafe extern "C" fn(u32, *mut Device) -> u32;
type GetUuid = unsafe extern "C" fn(Device, *mut c_char, u32) -> u32;
type GetMemoryInfo = unsafe extern "C" fn(Device, *mut Memory) -> u32;
type ProcessUtilization = unsafe extern "C" fn(Device, *mut UtilSample, *mut u32, u64) -> u32;

/// A function of NVML, or why this library has none (the loader's words).
type Function<F> = Result<F, String>;

/// One GPU as NVML lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML's index (the host's numbering).
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Its memory, bytes.
    pub total: u64,
}

/// One process's use of one GPU's compute (SMs) over one sample period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utilization {
    /// In the host's PID namespace.
    pub pid: u32,
    /// End of the sample period, µs since the epoch.
    pub time_us: u64,
    /// Percent of the period its kernels ran.
    pub sm_percent: u32,
}

/// One process on one GPU, as the device counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceProcess {
    /// In the host's PID namespace (the reader's).
    pub pid: u32,
    /// Device memory it holds; `None` when NVML cannot say.
    pub bytes: Option<u64>,
}

/// The function `name` (NUL-terminated) of `lib`, or the loader's words.
///
/// # Safety
/// `F` is the function's documented signature; the pointer is used only
/// while `lib` stays loaded.
unsafe fn find<F: Copy>(lib: &Library, name: &[u8]) -> Function<F> {
    // SAFETY: as the caller promises.
    unsafe { lib.get::<F>(name) }
        .map(|f| *f)
        .map_err(|e| e.to_string())
}

/// Why NVML was not opened.
enum OpenError {
    /// The library cannot be loaded: the loader's words.
    Load(String),
    /// `nvmlInit_v2` failed, or a function needed is missing.
    Init(String),
}

/// NVML, initialised.
pub struct Nvml {
    handle_by_uuid: GetHandleByUuid,
    running: Function<RunningProcesses>,
    count: Function<GetCount>,
    by_index: Function<GetHandleByIndex>,
    uuid_of: Function<GetUuid>,
    memory: Function<GetMemoryInfo>,
    /// `nvmlDeviceGetProcessUtilization`.
    utilization: Function<ProcessUtilization>,
    /// Keeps the functions above loaded.
    _lib: Library,
}

impl Nvml {
    /// Loads and initialises NVML with every function the node agent
    /// uses (the per-process utilization only when the library has it), or
    /// says why it cannot.
    pub fn open() -> Result<Nvml, String> {
        let n = Nvml::load().map_err(|e| match e {
            OpenError::Load(e) => format!("cannot load {LIBRARY}: {e}"),
            OpenError::Init(e) => e,
        })?;
        n.running.as_ref().map_err(Clone::clone)?;
        n.count.as_ref().map_err(Clone::clone)?;
        n.by_index.as_ref().map_err(Clone::clone)?;
        n.uuid_of.as_ref().map_err(Clone::clone)?;
        n.memory.as_ref().map_err(Clone::clone)?;
        Ok(n)
    }

    /// Loads and initialises NVML with what [`Nvml::utilization`] needs, or
    /// says why it cannot (a library that cannot be loaded: in the loader's
    /// words alone).
    pub fn open_for_utilization() -> Result<Nvml, String> {
        let n = Nvml::load().map_err(|(OpenError::Load(e) | OpenError::Init(e))| e)?;
        n.utilization.as_ref().map_err(Clone::clone)?;
        Ok(n)
    }

    /// The library loaded and initialised, `nvmlDeviceGetHandleByUUID`
    /// found, every other function looked up.
    fn load() -> Result<Nvml, OpenError> {
        // SAFETY: loading the NVIDIA management library, whose initialisers
        // are those of any NVML client.
        let lib = unsafe { Library::new(LIBRARY) }.map_err(|e| OpenError::Load(e.to_string()))?;
        // SAFETY: the documented signatures of these NVML functions; the
        // pointers copied out stay valid while `_lib` keeps the library.
        unsafe {
            let init = find::<unsafe extern "C" fn() -> u32>(&lib, b"nvmlInit_v2\0")
                .map_err(OpenError::Init)?;
            let rc = init();
            if rc != SUCCESS {
                return Err(OpenError::Init(format!("nvmlInit_v2 returned {rc}")));
            }
            let handle_by_uuid =
                find(&lib, b"nvmlDeviceGetHandleByUUID\0").map_err(OpenError::Init)?;
            let running = find(&lib, b"nvmlDeviceGetComputeRunningProcesses_v3\0")
                .or_else(|_| find(&lib, b"nvmlDeviceGetComputeRunningProcesses_v2\0"));
            Ok(Nvml {
                handle_by_uuid,
                running,
                count: find(&lib, b"nvmlDeviceGetCount_v2\0"),
                by_index: find(&lib, b"nvmlDeviceGetHandleByIndex_v2\0"),
                uuid_of: find(&lib, b"nvmlDeviceGetUUID\0"),
                memory: find(&lib, b"nvmlDeviceGetMemoryInfo\0"),
                utilization: find(&lib, b"nvmlDeviceGetProcessUtilization\0"),
                _lib: lib,
            })
        }
    }

    /// Every GPU NVML lists: index, UUID and memory; or why not.
    pub fn gpus(&self) -> Result<Vec<GpuInfo>, String> {
        let count = self.count.clone()?;
        let by_index = self.by_index.clone()?;
        let uuid_of = self.uuid_of.clone()?;
        let memory = self.memory.clone()?;
        let mut n = 0u32;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { count(&mut n) };
        if rc != SUCCESS {
            return Err(format!("nvmlDeviceGetCount_v2 returned {rc}"));
        }
        let mut out = Vec::new();
        for index in 0..n {
            let mut dev: Device = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            let rc = unsafe { by_index(index, &mut dev) };
            if rc != SUCCESS {
                return Err(format!(
                    "nvmlDeviceGetHandleByIndex_v2({index}) returned {rc}"
                ));
            }
            let mut buf = [0 as c_char; 96];
            // SAFETY: `buf` holds `buf.len()` writable bytes.
            let rc = unsafe { uuid_of(dev, buf.as_mut_ptr(), buf.len() as u32) };
            if rc != SUCCESS {
                return Err(format!("nvmlDeviceGetUUID({index}) returned {rc}"));
            }
            let bytes: Vec<u8> = buf
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            let uuid = String::from_utf8_lossy(&bytes).into_owned();
            let mut mem = Memory::default();
            // SAFETY: a valid out-pointer to an `nvmlMemory_t`.
            let rc = unsafe { memory(dev, &mut mem) };
            if rc != SUCCESS {
                return Err(format!("nvmlDeviceGetMemoryInfo({index}) returned {rc}"));
            }
            out.push(GpuInfo {
                index,
                uuid,
                total: mem.total,
            });
        }
        Ok(out)
    }

    /// The device's per-process utilization samples on the GPU `uuid`
    /// newer than `since_us` (µs since the epoch; 0: all it keeps).
    /// `Ok(None)`: this NVML has no per-process utilization.
    pub fn utilization(
        &self,
        uuid: &str,
        since_us: u64,
    ) -> Result<Option<Vec<Utilization>>, String> {
        let Ok(get) = self.utilization else {
            return Ok(None);
        };
        let dev = self.device(uuid)?;
        let mut n = 0u32;
        // SAFETY: a null buffer with a valid count pointer asks for the
        // number of samples.
        let rc = unsafe { get(dev, std::ptr::null_mut(), &mut n, since_us) };
        match rc {
            SUCCESS | ERROR_NOT_FOUND => return Ok(Some(Vec::new())),
            ERROR_INSUFFICIENT_SIZE => {}
            rc => {
                return Err(format!(
                    "nvmlDeviceGetProcessUtilization({uuid}) returned {rc}"
                ))
            }
        }
        for _ in 0..4 {
            // Room for processes that come between the two calls.
            let mut buf = vec![UtilSample::default(); (n as usize + 8).min(1 << 16)];
            let mut m = buf.len() as u32;
            // SAFETY: `buf` holds `m` writable samples.
            let rc = unsafe { get(dev, buf.as_mut_ptr(), &mut m, since_us) };
            match rc {
                SUCCESS => {
                    buf.truncate(m as usize);
                    return Ok(Some(
                        buf.iter()
                            .map(|s| Utilization {
                                pid: s.pid,
                                time_us: s.time_stamp,
                                sm_percent: s.sm_util.min(100),
                            })
                            .collect(),
                    ));
                }
                ERROR_NOT_FOUND => return Ok(Some(Vec::new())),
                ERROR_INSUFFICIENT_SIZE => n = m.max(n * 2),
                rc => {
                    return Err(format!(
                        "nvmlDeviceGetProcessUtilization({uuid}) returned {rc}"
                    ))
                }
            }
        }
        Err(format!(
            "nvmlDeviceGetProcessUtilization({uuid}): the list kept growing"
        ))
    }

    fn device(&self, uuid: &str) -> Result<Device, String> {
        let c = CString::new(uuid).map_err(|_| format!("bad GPU uuid {uuid:?}"))?;
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and a valid out-pointer.
        let rc = unsafe { (self.handle_by_uuid)(c.as_ptr(), &mut dev) };
        if rc != SUCCESS {
            return Err(format!("nvmlDeviceGetHandleByUUID({uuid}) returned {rc}"));
        }
        Ok(dev)
    }

    /// The compute processes on the GPU `uuid` and what each holds, or
    /// why NVML did not answer.
    pub fn processes(&self, uuid: &str) -> Result<Vec<DeviceProcess>, String> {
        let running = self.running.clone()?;
        let dev = self.device(uuid)?;
        let mut infos: Vec<ProcessInfo> = vec![ProcessInfo::default(); 64];
        for _ in 0..4 {
            let mut n = infos.len() as u32;
            // SAFETY: `infos` holds `n` writable entries.
            let rc = unsafe { running(dev, &mut n, infos.as_mut_ptr()) };
            match rc {
                SUCCESS => {
                    infos.truncate(n as usize);
                    return Ok(infos
                        .iter()
                        .map(|p| DeviceProcess {
                            pid: p.pid,
                            bytes: (p.used_gpu_memory != NOT_AVAILABLE)
                                .then_some(p.used_gpu_memory),
                        })
                        .collect());
                }
                // Processes came between the two calls: ask again, bigger.
                ERROR_INSUFFICIENT_SIZE => {
                    let want = (n as usize).max(infos.len() * 2).min(1 << 16);
                    infos = vec![ProcessInfo::default(); want];
                }
                rc => {
                    return Err(format!(
                        "nvmlDeviceGetComputeRunningProcesses({uuid}) returned {rc}"
                    ))
                }
            }
        }
        Err(format!(
            "nvmlDeviceGetComputeRunningProcesses({uuid}): the list kept growing"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_nvmls() {
        assert_eq!(std::mem::size_of::<ProcessInfo>(), 24);
        assert_eq!(std::mem::offset_of!(ProcessInfo, used_gpu_memory), 8);
        assert_eq!(std::mem::offset_of!(ProcessInfo, compute_instance_id), 20);
        assert_eq!(std::mem::size_of::<UtilSample>(), 32);
        assert_eq!(std::mem::offset_of!(UtilSample, time_stamp), 8);
        assert_eq!(std::mem::offset_of!(UtilSample, sm_util), 16);
        assert_eq!(std::mem::offset_of!(UtilSample, dec_util), 28);
        assert_eq!(std::mem::size_of::<Memory>(), 24);
    }
}
