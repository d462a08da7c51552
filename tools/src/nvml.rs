//! What the GPU itself reports about its use, from NVML
//! (`libnvidia-ml.so.1`, loaded when first needed, never linked): the
//! utilisation of each process. Under policy 5 (native) the scheduler
//! charges nobody, so a container's GPU-Util comes from here instead of
//! the ledger.
//!
//! NVML names host processes by their pid in the host's PID namespace (the
//! tool's, when it runs on the host); the ledger names them by their pid in
//! their own namespace and that namespace's inode. `/proc/<pid>/status`
//! (`NSpid:`, innermost last) and `/proc/<pid>/ns/pid` translate one into
//! the other.

use libloading::{Library, Symbol};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

type Device = *mut c_void;

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Sample {
    pid: u32,
    time_stamp: u64,
    sm_util: u32,
    mem_util: u32,
    enc_util: u32,
    dec_util: u32,
}

const SUCCESS: u32 = 0;
const ERROR_NOT_FOUND: u32 = 6;
const ERROR_INSUFFICIENT_SIZE: u32 = 7;

type GetHandleByUuid = unsafe extern "C" fn(*const c_char, *mut Device) -> u32;
type GetProcessUtilization = unsafe extern "C" fn(Device, *mut Sample, *mut u32, u64) -> u32;

/// NVML, initialised.
pub struct Nvml {
    handle_by_uuid: GetHandleByUuid,
    process_util: GetProcessUtilization,
    /// Keeps the functions above loaded.
    _lib: Library,
}

impl Nvml {
    /// NVML of this host, once per process (`None`, said once on stderr,
    /// when it cannot be loaded or initialised).
    pub fn get() -> Option<&'static Nvml> {
        static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
        NVML.get_or_init(|| match Nvml::open() {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(
                    "cgpu: NVML unavailable ({e}): GPU-Util of GPUs under policy 5 is not shown"
                );
                None
            }
        })
        .as_ref()
    }

    fn open() -> Result<Nvml, String> {
        // SAFETY: loading the NVIDIA management library, whose initialisers
        // are those of any NVML client.
        let lib = unsafe { Library::new("libnvidia-ml.so.1") }.map_err(|e| e.to_string())?;
        // SAFETY: the documented signatures of these NVML functions.
        unsafe {
            let init: Symbol<unsafe extern "C" fn() -> u32> =
                lib.get(b"nvmlInit_v2\0").map_err(|e| e.to_string())?;
            let rc = init();
            if rc != SUCCESS {
                return Err(format!("nvmlInit_v2 returned {rc}"));
            }
            let handle_by_uuid = *lib
                .get::<GetHandleByUuid>(b"nvmlDeviceGetHandleByUUID\0")
                .map_err(|e| e.to_string())?;
            let process_util = *lib
                .get::<GetProcessUtilization>(b"nvmlDeviceGetProcessUtilization\0")
                .map_err(|e| e.to_string())?;
            Ok(Nvml {
                handle_by_uuid,
                process_util,
                _lib: lib,
            })
        }
    }

    /// Utilisation (SM, percent) of each process on the GPU `uuid` since
    /// `since_us` (unix µs; NVML keeps a few samples per process: their
    /// mean), by host pid. `None` when NVML does not answer for that GPU.
    pub fn process_util(&self, uuid: &str, since_us: u64) -> Option<HashMap<u32, f64>> {
        let c = CString::new(uuid).ok()?;
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and a valid out-pointer.
        if unsafe { (self.handle_by_uuid)(c.as_ptr(), &mut dev) } != SUCCESS {
            return None;
        }
        let mut samples: Vec<Sample> = Vec::new();
        let mut n = 0u32;
        for _ in 0..4 {
            // SAFETY: `samples` holds `n` entries (none on the first call,
            // which asks for the count).
            let rc = unsafe { (self.process_util)(dev, samples.as_mut_ptr(), &mut n, since_us) };
            match rc {
                SUCCESS => {
                    samples.truncate(n as usize);
                    break;
                }
                ERROR_NOT_FOUND => return Some(HashMap::new()),
                ERROR_INSUFFICIENT_SIZE => {
                    n = n.clamp(1, 4096);
                    samples = vec![Sample::default(); n as usize];
                }
                _ => return None,
            }
        }
        let mut sum: HashMap<u32, (f64, u32)> = HashMap::new();
        for s in samples.iter().filter(|s| s.time_stamp > since_us) {
            let e = sum.entry(s.pid).or_default();
            e.0 += f64::from(s.sm_util.min(100));
            e.1 += 1;
        }
        Some(
            sum.into_iter()
                .map(|(p, (t, k))| (p, t / f64::from(k)))
                .collect(),
        )
    }
}

/// A host pid as its own PID namespace names it: (pid there, namespace
/// inode), from `/proc`. `None` when the process is gone or unreadable.
pub fn ns_identity(host_pid: u32) -> Option<(i32, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())?;
    let ns = std::fs::read_link(format!("/proc/{host_pid}/ns/pid")).ok()?;
    let inode = ns
        .to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .parse()
        .ok()?;
    Some((nspid, inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_identity_is_read_from_proc() {
        let me = std::process::id();
        let (pid, ns) = ns_identity(me).expect("/proc/self");
        assert!(pid > 0);
        assert!(ns > 0);
        let own = std::fs::read_link("/proc/self/ns/pid").unwrap();
        assert_eq!(own.to_str().unwrap(), format!("pid:[{ns}]"));
        assert!(ns_identity(u32::MAX).is_none());
    }

    #[test]
    fn sample_layout_is_nvmls() {
        assert_eq!(std::mem::size_of::<Sample>(), 32);
        assert_eq!(std::mem::offset_of!(Sample, time_stamp), 8);
        assert_eq!(std::mem::offset_of!(Sample, dec_util), 28);
    }
}
