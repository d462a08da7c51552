//! NVML on the same state as the CUDA side: devices, memory (v1/v2),
//! running processes with their memory, utilisation rates and per-process
//! utilisation (from the device time the executors charge), versions and
//! error strings. Handles point into a static table and are range-checked.

use crate::driver::{core, Driver};
use crate::state::{now_mono_ns, MAX_DEVICES, SLOT_ALIVE};
use crate::{nvml_guard, put, put_cstr, read_cstr};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::atomic::{AtomicU32, Ordering::*};

pub(crate) type NvRes = Result<(), nvmlReturn_t>;

static INITS: AtomicU32 = AtomicU32::new(0);
static HANDLES: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

pub(crate) fn nv() -> Result<&'static Driver, nvmlReturn_t> {
    if INITS.load(Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    core().map_err(|_| NVML_ERROR_UNINITIALIZED)
}

pub(crate) fn handle(i: usize) -> nvmlDevice_t {
    HANDLES[i..].as_ptr() as nvmlDevice_t
}

pub(crate) fn dev_of(d: &Driver, h: nvmlDevice_t) -> Result<usize, nvmlReturn_t> {
    let base = HANDLES.as_ptr() as usize;
    let p = h as usize;
    if p < base || p >= base + d.devs.len() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if gpu_lost(d, p - base) {
        return Err(NVML_ERROR_GPU_IS_LOST);
    }
    Ok(p - base)
}

/// Whether GPU `i` fell off the bus: the file `gpu<i>.lost` exists in the
/// state directory. Its handle then answers `NVML_ERROR_GPU_IS_LOST` to
/// every query, as the real driver does after XID 79.
pub(crate) fn gpu_lost(d: &Driver, i: usize) -> bool {
    d.cfg.state_dir.join(format!("gpu{i}.lost")).exists()
}

/// The XID errors the driver reported on GPU `i`, oldest first: one
/// number a line in the state directory's `gpu<i>.xid` (lines that are not
/// a number are skipped). A lost GPU ends with XID 79 ("GPU has fallen off
/// the bus").
pub(crate) fn gpu_xids(d: &Driver, i: usize) -> Vec<u64> {
    let mut xids: Vec<u64> = std::fs::read_to_string(d.cfg.state_dir.join(format!("gpu{i}.xid")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if gpu_lost(d, i) {
        xids.push(79);
    }
    xids
}

fn init(flags: u32) -> NvRes {
    if flags & !0x3 != 0 {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let d = core().map_err(|_| NVML_ERROR_DRIVER_NOT_LOADED)?;
    if d.devs.is_empty() && flags & 1 == 0 {
        return Err(NVML_ERROR_GPU_NOT_FOUND);
    }
    INITS.fetch_add(1, AcqRel);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    nvml_guard(|| init(0))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    nvml_guard(|| init(0))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(flags: u32) -> nvmlReturn_t {
    nvml_guard(|| init(flags))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    nvml_guard(|| {
        INITS
            .fetch_update(AcqRel, Acquire, |v| v.checked_sub(1))
            .map(|_| ())
            .map_err(|_| NVML_ERROR_UNINITIALIZED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(r: nvmlReturn_t) -> *const c_char {
    static S: std::sync::OnceLock<Vec<(nvmlReturn_t, std::ffi::CString)>> =
        std::sync::OnceLock::new();
    let v = S.get_or_init(|| {
        NVML_RETURNS
            .iter()
            .map(|(c, s)| (*c, std::ffi::CString::new(*s).unwrap_or_default()))
            .collect()
    });
    v.iter()
        .find(|(c, _)| *c == r)
        .or_else(|| v.iter().find(|(c, _)| *c == NVML_ERROR_UNKNOWN))
        .map(|(_, s)| s.as_ptr())
        .unwrap_or(std::ptr::null())
}

pub(crate) fn driver_version_string(v: i32) -> &'static str {
    match v {
        v if v >= 13000 => "580.82.07",
        v if v >= 12080 => "570.124.06",
        v if v >= 12040 => "550.54.15",
        v if v >= 12020 => "535.104.05",
        _ => "525.85.12",
    }
}

pub(crate) fn put_str(buf: *mut c_char, len: u32, s: &str) -> NvRes {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: buffer of len bytes from the caller.
    unsafe { put_cstr(buf, len as usize, s) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: u32) -> nvmlReturn_t {
    nvml_guard(|| put_str(buf, len, driver_version_string(nv()?.cfg.driver_version)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(buf: *mut c_char, len: u32) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        let v = d.cfg.driver_version;
        put_str(
            buf,
            len,
            &format!("{}.{}", v / 1000, driver_version_string(v)),
        )
    })
}

fn cuda_version(v: *mut i32) -> NvRes {
    let d = nv()?;
    // SAFETY: out pointer from the caller.
    unsafe { put(v, d.cfg.driver_version, NVML_ERROR_INVALID_ARGUMENT) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut i32) -> nvmlReturn_t {
    nvml_guard(|| cuda_version(v))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut i32) -> nvmlReturn_t {
    nvml_guard(|| cuda_version(v))
}

fn count(c: *mut u32) -> NvRes {
    let d = nv()?;
    // SAFETY: out pointer from the caller.
    unsafe { put(c, d.devs.len() as u32, NVML_ERROR_INVALID_ARGUMENT) }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(c: *mut u32) -> nvmlReturn_t {
    nvml_guard(|| count(c))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(c: *mut u32) -> nvmlReturn_t {
    nvml_guard(|| count(c))
}

fn by_index(i: u32, h: *mut nvmlDevice_t) -> NvRes {
    let d = nv()?;
    if i as usize >= d.devs.len() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if gpu_lost(d, i as usize) {
        return Err(NVML_ERROR_GPU_IS_LOST);
    }
    // SAFETY: out pointer from the caller.
    unsafe { put(h, handle(i as usize), NVML_ERROR_INVALID_ARGUMENT) }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(i: u32, h: *mut nvmlDevice_t) -> nvmlReturn_t {
    nvml_guard(|| by_index(i, h))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    i: u32,
    h: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    nvml_guard(|| by_index(i, h))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    h: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        // SAFETY: NUL-terminated string from the caller.
        let u = unsafe { read_cstr(uuid) }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        // With or without the `GPU-` prefix, any case.
        let want = u.trim();
        let want = want.strip_prefix("GPU-").unwrap_or(want);
        let i = d
            .devs
            .iter()
            .position(|x| x.uuid.trim_start_matches("GPU-").eq_ignore_ascii_case(want))
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        if gpu_lost(d, i) {
            return Err(NVML_ERROR_GPU_IS_LOST);
        }
        // SAFETY: out pointer from the caller.
        unsafe { put(h, handle(i), NVML_ERROR_INVALID_ARGUMENT) }
    })
}

fn nvml_bus_id(bus: u32) -> String {
    format!("00000000:{bus:02X}:00.0")
}

fn by_pci(id: *const c_char, h: *mut nvmlDevice_t) -> NvRes {
    let d = nv()?;
    // SAFETY: NUL-terminated string from the caller.
    let s = unsafe { read_cstr(id) }
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?
        .to_ascii_uppercase();
    let i = d
        .devs
        .iter()
        .position(|x| {
            nvml_bus_id(x.pci_bus) == s || crate::cuda::device::pci_bus_id(x.pci_bus) == s
        })
        .ok_or(NVML_ERROR_NOT_FOUND)?;
    if gpu_lost(d, i) {
        return Err(NVML_ERROR_GPU_IS_LOST);
    }
    // SAFETY: out pointer from the caller.
    unsafe { put(h, handle(i), NVML_ERROR_INVALID_ARGUMENT) }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    id: *const c_char,
    h: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    nvml_guard(|| by_pci(id, h))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    id: *const c_char,
    h: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    nvml_guard(|| by_pci(id, h))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    h: nvmlDevice_t,
    buf: *mut c_char,
    len: u32,
) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        let i = dev_of(d, h)?;
        put_str(buf, len, &d.devs[i].name)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    h: nvmlDevice_t,
    buf: *mut c_char,
    len: u32,
) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        let i = dev_of(d, h)?;
        put_str(buf, len, &d.devs[i].uuid)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(h: nvmlDevice_t, idx: *mut u32) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        let i = dev_of(d, h)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(idx, i as u32, NVML_ERROR_INVALID_ARGUMENT) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(h: nvmlDevice_t, m: *mut u32) -> nvmlReturn_t {
    std::hint::black_box(concat!(file!(), line!()));
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetIndex(h, m) }
}

fn pci_info(h: nvmlDevice_t, p: *mut nvmlPciInfo_t) -> NvRes {
    let d = nv()?;
    let i = dev_of(d, h)?;
    let bus = d.devs[i].pci_bus;
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus,
        device: 0,
        pciDeviceId: 0x20b510de,
        pciSubSystemId: 0x134f10de,
        busId: [0; 32],
    };
    let legacy = crate::cuda::device::pci_bus_id(bus);
    info.busIdLegacy[..legacy.len()].copy_from_slice(legacy.as_bytes());
    let full = nvml_bus_id(bus);
    info.busId[..full.len()].copy_from_slice(full.as_bytes());
    // SAFETY: out pointer from the caller.
    unsafe { put(p, info, NVML_ERROR_INVALID_ARGUMENT) }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    h: nvmlDevice_t,
    p: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    nvml_guard(|| pci_info(h, p))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    h: nvmlDevice_t,
    p: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    nvml_guard(|| pci_info(h, p))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    h: nvmlDevice_t,
    m: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        let i = dev_of(d, h)?;
        let (free, total) = d.mem_info(i);
        // SAFETY: out pointer from the caller.
        unsafe {
            put(
                m,
                nvmlMemory_t {
                    total,
                    free,
                    used: total - free,
                },
                NVML_ERROR_INVALID_ARGUMENT,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    h: nvmlDevice_t,
    m: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        let i = dev_of(d, h)?;
        if m.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null pointer from the caller; the version field comes first.
        let ver = unsafe { (m as *const u32).read_unaligned() };
        if ver != nvmlMemory_v2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (free, total) = d.mem_info(i);
        let v = nvmlMemory_v2_t {
            version: ver,
            total,
            reserved: 0,
            free,
            used: total - free,
        };
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(m, v, NVML_ERROR_INVALID_ARGUMENT) }
    })
}

/// Live processes on device `i`: (pid, bytes held).
pub fn processes(d: &Driver, i: usize) -> Vec<(u32, u64)> {
    d.shared.reap(Some(d.slot));
    let sh = d.shared;
    (0..sh.nslots())
        .filter_map(|s| {
            let r = sh.slot(s);
            let mem = r.mem[i].load(Acquire);
            let ctx = r.ctx_mask.load(Acquire) & (1 << i) != 0;
            (r.state.load(Acquire) == SLOT_ALIVE && (mem > 0 || ctx))
                .then(|| (r.pid.load(Relaxed), mem))
        })
        .collect()
}

fn running<T>(
    h: nvmlDevice_t,
    count: *mut u32,
    infos: *mut T,
    mk: impl Fn(u32, u64) -> T,
) -> NvRes {
    let d = nv()?;
    let i = dev_of(d, h)?;
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let ps = processes(d, i);
    // SAFETY: non-null in/out count from the caller.
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = ps.len() as u32 };
    if ps.is_empty() {
        return Ok(());
    }
    if cap < ps.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if infos.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (k, (pid, mem)) in ps.into_iter().enumerate() {
        // SAFETY: infos holds cap >= len entries by the caller's contract.
        unsafe { infos.add(k).write_unaligned(mk(pid, mem)) };
    }
    Ok(())
}

fn v2(pid: u32, mem: u64) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid,
        usedGpuMemory: mem,
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    h: nvmlDevice_t,
    c: *mut u32,
    p: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    nvml_guard(|| {
        running(h, c, p, |pid, mem| nvmlProcessInfo_v1_t {
            pid,
            usedGpuMemory: mem,
        })
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    h: nvmlDevice_t,
    c: *mut u32,
    p: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    nvml_guard(|| running(h, c, p, v2))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    h: nvmlDevice_t,
    c: *mut u32,
    p: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    nvml_guard(|| running(h, c, p, v2))
}

fn none_running(h: nvmlDevice_t, c: *mut u32) -> NvRes {
    let d = nv()?;
    dev_of(d, h)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(c, 0, NVML_ERROR_INVALID_ARGUMENT) }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    h: nvmlDevice_t,
    c: *mut u32,
    _p: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    nvml_guard(|| none_running(h, c))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    h: nvmlDevice_t,
    c: *mut u32,
    _p: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    nvml_guard(|| none_running(h, c))
}

// ------------------------------------------------------------------ utilisation

struct Sample {
    wall: u64,
    busy: u64,
    per_slot: HashMap<usize, u64>,
}

static SAMPLES: Mutex<Vec<Option<Sample>>> = Mutex::new(Vec::new());

fn snapshot(d: &Driver, i: usize) -> Sample {
    let sh = d.shared;
    Sample {
        wall: now_mono_ns(),
        busy: sh.dev(i).busy_ns.load(Acquire),
        per_slot: (0..sh.nslots())
            .map(|s| (s, sh.slot(s).time_ns[i].load(Acquire)))
            .collect(),
    }
}

/// Utilisation since the previous query (at least a 50 ms window): device
/// busy fraction and per-slot fractions, in percent.
fn window(d: &Driver, i: usize) -> (u32, Vec<(usize, u32)>) {
    let prev = {
        let mut s = SAMPLES.lock();
        if s.len() < MAX_DEVICES {
            s.resize_with(MAX_DEVICES, || None);
        }
        s[i].take()
    };
    let prev = match prev {
        Some(p) if now_mono_ns().saturating_sub(p.wall) <= 10_000_000_000 => p,
        _ => snapshot(d, i),
    };
    let elapsed = now_mono_ns().saturating_sub(prev.wall);
    if elapsed < 50_000_000 {
        std::thread::sleep(std::time::Duration::from_nanos(50_000_000 - elapsed));
    }
    let cur = snapshot(d, i);
    let dt = (cur.wall - prev.wall).max(1) as f64;
    let pct = |x: u64| ((x as f64 / dt) * 100.0).round().clamp(0.0, 100.0) as u32;
    let dev = pct(cur.busy.saturating_sub(prev.busy));
    let per: Vec<(usize, u32)> = cur
        .per_slot
        .iter()
        .map(|(s, t)| {
            (
                *s,
                pct(t.saturating_sub(prev.per_slot.get(s).copied().unwrap_or(0))),
            )
        })
        .collect();
    SAMPLES.lock()[i] = Some(cur);
    (dev, per)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    h: nvmlDevice_t,
    u: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        let i = dev_of(d, h)?;
        if u.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let (gpu, _) = window(d, i);
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe {
            put(
                u,
                nvmlUtilization_t { gpu, memory: 0 },
                NVML_ERROR_INVALID_ARGUMENT,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    h: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut u32,
    _last_seen: u64,
) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        let i = dev_of(d, h)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let sh = d.shared;
        let live: Vec<usize> = (0..sh.nslots())
            .filter(|&s| {
                let r = sh.slot(s);
                r.state.load(Acquire) == SLOT_ALIVE && r.dev_mask.load(Acquire) & (1 << i) != 0
            })
            .collect();
        // SAFETY: non-null in/out count from the caller.
        let cap = unsafe { *count } as usize;
        if samples.is_null() || cap < live.len() {
            // SAFETY: as above.
            unsafe { *count = live.len() as u32 };
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        let (_, per) = window(d, i);
        let ts = crate::state::now_unix_ns() / 1000;
        for (k, s) in live.iter().enumerate() {
            let sm = per
                .iter()
                .find(|(x, _)| x == s)
                .map(|(_, p)| *p)
                .unwrap_or(0);
            let v = nvmlProcessUtilizationSample_t {
                pid: sh.slot(*s).pid.load(Relaxed),
                timeStamp: ts,
                smUtil: sm,
                memUtil: 0,
                encUtil: 0,
                decUtil: 0,
            };
            // SAFETY: samples holds cap >= live.len() entries.
            unsafe { samples.add(k).write_unaligned(v) };
        }
        // SAFETY: as above.
        unsafe { *count = live.len() as u32 };
        Ok(())
    })
}

// ------------------------------------------------------------------ misc queries

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    h: nvmlDevice_t,
    major: *mut i32,
    minor: *mut i32,
) -> nvmlReturn_t {
    nvml_guard(|| {
        let d = nv()?;
        let i = dev_of(d, h)?;
        // SAFETY: out pointers from the caller.
        unsafe {
            put(major, d.devs[i].cc.0, NVML_ERROR_INVALID_ARGUMENT)?;
            put(minor, d.devs[i].cc.1, NVML_ERROR_INVALID_ARGUMENT)
        }
    })
}

fn const_u32(h: nvmlDevice_t, out: *mut u32, v: u32) -> NvRes {
    let d = nv()?;
    dev_of(d, h)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(out, v, NVML_ERROR_INVALID_ARGUMENT) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    h: nvmlDevice_t,
    _sensor: u32,
    t: *mut u32,
) -> nvmlReturn_t {
    nvml_guard(|| const_u32(h, t, 40))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(h: nvmlDevice_t, p: *mut u32) -> nvmlReturn_t {
    nvml_guard(|| const_u32(h, p, 30_000))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(h: nvmlDevice_t, p: *mut u32) -> nvmlReturn_t {
    nvml_guard(|| const_u32(h, p, 30))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(h: nvmlDevice_t, p: *mut u32) -> nvmlReturn_t {
    nvml_guard(|| const_u32(h, p, 0))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    h: nvmlDevice_t,
    p: *mut u32,
) -> nvmlReturn_t {
    nvml_guard(|| const_u32(h, p, 1))
}

// ------------------------------------------------------- interconnect queries
// The simulated GPUs have no NVLink and no fabric: the real NVML answers such
// a GPU's NVLink and fabric queries with NOT_SUPPORTED. PyTorch asks these at
// its first out-of-memory error (to describe the GPU), TensorFlow at start-up
// (PCIe: nvml_monitoring.rs).

fn no_nvlink(h: nvmlDevice_t) -> Result<(), nvmlReturn_t> {
    let d = nv()?;
    dev_of(d, h)?;
    Err(NVML_ERROR_NOT_SUPPORTED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    h: nvmlDevice_t,
    _link: u32,
    _kind: *mut u32,
) -> nvmlReturn_t {
    nvml_guard(|| no_nvlink(h))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    h: nvmlDevice_t,
    _link: u32,
    _pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    nvml_guard(|| no_nvlink(h))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    h: nvmlDevice_t,
    _link: u32,
    _active: *mut u32,
) -> nvmlReturn_t {
    nvml_guard(|| no_nvlink(h))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    h: nvmlDevice_t,
    _info: *mut std::ffi::c_void,
) -> nvmlReturn_t {
    nvml_guard(|| no_nvlink(h))
}
