//! What the GPU itself says each process holds, from NVML
//! (`libnvidia-ml.so.1`, loaded at start, never linked): the device's own
//! books, which no process can change from user space.

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

const SUCCESS: u32 = 0;
const ERROR_INSUFFICIENT_SIZE: u32 = 7;
/// `NVML_VALUE_NOT_AVAILABLE` in `usedGpuMemory`.
const NOT_AVAILABLE: u64 = u64::MAX;

type GetHandleByUuid = unsafe extern "C" fn(*const c_char, *mut Device) -> u32;
type RunningProcesses = unsafe extern "C" fn(Device, *mut u32, *mut ProcessInfo) -> u32;
type GetCount = unsafe extern "C" fn(*mut u32) -> u32;
type GetHandleByIndex = unsafe extern "C" fn(u32, *mut Device) -> u32;
type GetUuid = unsafe extern "C" fn(Device, *mut c_char, u32) -> u32;
type GetMemoryInfo = unsafe extern "C" fn(Device, *mut Memory) -> u32;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

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

/// NVML, initialised.
pub struct Nvml {
    handle_by_uuid: GetHandleByUuid,
    running: RunningProcesses,
    count: GetCount,
    by_index: GetHandleByIndex,
    uuid_of: GetUuid,
    memory: GetMemoryInfo,
    /// Keeps the functions above loaded.
    _lib: Library,
}

/// One process on one GPU, as the device counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceProcess {
    /// In the host's PID namespace (the agent's).
    pub pid: u32,
    /// Device memory it holds; `None` when NVML cannot say.
    pub bytes: Option<u64>,
}

impl Nvml {
    /// Loads and initialises NVML, or says why it cannot.
    pub fn open() -> Result<Nvml, String> {
        // SAFETY: loading the NVIDIA management library, whose initialisers
        // are those of any NVML client.
        let lib = unsafe { Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("cannot load libnvidia-ml.so.1: {e}"))?;
        // SAFETY: the documented signatures of these NVML functions; the
        // pointers copied out stay valid while `_lib` keeps the library.
        unsafe {
            let init = lib
                .get::<unsafe extern "C" fn() -> u32>(b"nvmlInit_v2\0")
                .map_err(|e| e.to_string())?;
            let rc = init();
            if rc != SUCCESS {
                return Err(format!("nvmlInit_v2 returned {rc}"));
            }
            let handle_by_uuid = *lib
                .get::<GetHandleByUuid>(b"nvmlDeviceGetHandleByUUID\0")
                .map_err(|e| e.to_string())?;
            let running =
                match lib.get::<RunningProcesses>(b"nvmlDeviceGetComputeRunningProcesses_v3\0") {
                    Ok(f) => *f,
                    Err(_) => *lib
                        .get::<RunningProcesses>(b"nvmlDeviceGetComputeRunningProcesses_v2\0")
                        .map_err(|e| e.to_string())?,
                };
            let count = *lib
                .get::<GetCount>(b"nvmlDeviceGetCount_v2\0")
                .map_err(|e| e.to_string())?;
            let by_index = *lib
                .get::<GetHandleByIndex>(b"nvmlDeviceGetHandleByIndex_v2\0")
                .map_err(|e| e.to_string())?;
            let uuid_of = *lib
                .get::<GetUuid>(b"nvmlDeviceGetUUID\0")
                .map_err(|e| e.to_string())?;
            let memory = *lib
                .get::<GetMemoryInfo>(b"nvmlDeviceGetMemoryInfo\0")
                .map_err(|e| e.to_string())?;
            Ok(Nvml {
                handle_by_uuid,
                running,
                count,
                by_index,
                uuid_of,
                memory,
                _lib: lib,
            })
        }
    }

    /// Every GPU NVML lists: index, UUID and memory; or why not.
    pub fn gpus(&self) -> Result<Vec<GpuInfo>, String> {
        let mut n = 0u32;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.count)(&mut n) };
        if rc != SUCCESS {
            return Err(format!("nvmlDeviceGetCount_v2 returned {rc}"));
        }
        let mut out = Vec::new();
        for index in 0..n {
            let mut dev: Device = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            let rc = unsafe { (self.by_index)(index, &mut dev) };
            if rc != SUCCESS {
                return Err(format!(
                    "nvmlDeviceGetHandleByIndex_v2({index}) returned {rc}"
                ));
            }
            let mut buf = [0 as c_char; 96];
            // SAFETY: `buf` holds `buf.len()` writable bytes.
            let rc = unsafe { (self.uuid_of)(dev, buf.as_mut_ptr(), buf.len() as u32) };
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
            let rc = unsafe { (self.memory)(dev, &mut mem) };
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

    /// The compute processes on the GPU `uuid` and what each holds, or
    /// why NVML did not answer.
    pub fn processes(&self, uuid: &str) -> Result<Vec<DeviceProcess>, String> {
        let c = CString::new(uuid).map_err(|_| format!("bad GPU uuid {uuid:?}"))?;
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and a valid out-pointer.
        let rc = unsafe { (self.handle_by_uuid)(c.as_ptr(), &mut dev) };
        if rc != SUCCESS {
            return Err(format!("nvmlDeviceGetHandleByUUID({uuid}) returned {rc}"));
        }
        let mut infos: Vec<ProcessInfo> = vec![ProcessInfo::default(); 64];
        for _ in 0..4 {
            let mut n = infos.len() as u32;
            // SAFETY: `infos` holds `n` writable entries.
            let rc = unsafe { (self.running)(dev, &mut n, infos.as_mut_ptr()) };
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
    fn process_info_layout_is_nvmls() {
        assert_eq!(std::mem::size_of::<ProcessInfo>(), 24);
        assert_eq!(std::mem::offset_of!(ProcessInfo, used_gpu_memory), 8);
        assert_eq!(std::mem::offset_of!(ProcessInfo, compute_instance_id), 20);
    }
}
