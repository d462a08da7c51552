//! NVML queries that monitoring agents (DCGM exporter, nvidia-smi-like
//! tools, the Kubernetes device plugin's health check) and frameworks make
//! at start: driver branch, architecture, serial, board and firmware
//! strings, clocks, power and energy, thermal thresholds, PCIe, BAR1, ECC,
//! MIG mode, throttle reasons, encoder/decoder utilisation, topology, CPU
//! affinity, process names and event sets.
//!
//! Values are those of an idle data-centre GPU of the simulated model,
//! except where the sim knows better: energy grows with the device time the
//! executors charged, BAR1 and the clocks follow the device's name, and
//! the event set delivers the XID errors of a GPU made to fail (the state
//! directory's `gpu<i>.xid` and `gpu<i>.lost`) and otherwise waits for its
//! timeout.

use crate::nvml::{dev_of, driver_version_string, handle, nv, put_str, NvRes};
use crate::{nvml_guard, put, read_cstr};
use cgpu_ffi::*;
use std::ffi::c_char;
use std::sync::atomic::Ordering::*;

/// Declares NVML functions, each returning its body's result.
macro_rules! nvml_fns {
    ($($name:ident($($a:ident : $t:ty),* $(,)?) => $body:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> nvmlReturn_t {
            std::hint::black_box(stringify!($name));
            nvml_guard(|| $body)
        }
    )*};
}

type Dev = nvmlDevice_t;

fn out<T>(p: *mut T, v: T) -> NvRes {
    // SAFETY: out pointer from the caller (NULL is refused by put).
    unsafe { put(p, v, NVML_ERROR_INVALID_ARGUMENT) }
}

/// The device index behind a handle (NVML initialised).
fn dev(h: Dev) -> Result<usize, nvmlReturn_t> {
    let d = nv()?;
    dev_of(d, h)
}

fn name_of(i: usize) -> Result<String, nvmlReturn_t> {
    Ok(nv()?.devs[i].name.to_ascii_uppercase())
}

/// `nvmlDeviceArchitecture_t` from the compute capability.
fn architecture(i: usize) -> Result<u32, nvmlReturn_t> {
    let (maj, min) = nv()?.devs[i].cc;
    Ok(match (maj, min) {
        (7, 0) => 5,   // VOLTA
        (7, _) => 6,   // TURING
        (8, 9) => 8,   // ADA
        (8, _) => 7,   // AMPERE
        (9, _) => 9,   // HOPPER
        (10, _) => 10, // BLACKWELL
        _ => 0xffff_ffff,
    })
}

/// (graphics/SM, memory) maximum clocks in MHz, by model.
fn clocks(i: usize) -> Result<(u32, u32), nvmlReturn_t> {
    let n = name_of(i)?;
    Ok(if n.contains("T4") {
        (1590, 5001)
    } else if n.contains("V100") {
        (1530, 877)
    } else if n.contains("A10") && !n.contains("A100") {
        (1695, 6251)
    } else if n.contains("H100") || n.contains("H200") {
        (1980, 2619)
    } else if n.contains("L4") {
        (2040, 6251)
    } else {
        (1410, 1215)
    })
}

/// Board power limit in milliwatts, by model.
fn power_limit_mw(i: usize) -> Result<u32, nvmlReturn_t> {
    let n = name_of(i)?;
    Ok(if n.contains("T4") || n.contains("L4") {
        70_000
    } else if n.contains("A10") && !n.contains("A100") {
        150_000
    } else if n.contains("V100") {
        300_000
    } else if n.contains("H100") || n.contains("H200") {
        700_000
    } else {
        400_000
    })
}

/// Power now: idle 30 W (as `nvmlDeviceGetPowerUsage`).
const IDLE_MW: u64 = 30_000;

fn energy_mj(i: usize) -> Result<u64, nvmlReturn_t> {
    let d = nv()?;
    // Idle power since the state was created, plus the board limit over
    // idle for the device time kernels ran.
    let created = d.shared.map().header.created_unix_ns;
    let up_ns = crate::state::now_unix_ns().saturating_sub(created);
    let busy_ns = d.shared.dev(i).busy_ns.load(Acquire);
    let extra_mw = (power_limit_mw(i)? as u64).saturating_sub(IDLE_MW);
    Ok((IDLE_MW as u128 * up_ns as u128 / 1_000_000_000
        + extra_mw as u128 * busy_ns as u128 / 1_000_000_000) as u64)
}

fn bar1_bytes(i: usize) -> Result<u64, nvmlReturn_t> {
    let n = name_of(i)?;
    Ok(
        if n.contains("A100") || n.contains("H100") || n.contains("H200") {
            nv()?.devs[i].total.next_power_of_two()
        } else {
            256 << 20
        },
    )
}

/// `nvmlBAR1Memory_t`.
#[repr(C)]
pub struct Bar1Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlViolationTime_t`.
#[repr(C)]
pub struct ViolationTime {
    pub reference_time: u64,
    pub violation_time: u64,
}

/// `nvmlSystemDriverBranchInfo_v1_t`.
#[repr(C)]
pub struct DriverBranchInfo {
    pub version: u32,
    pub branch: [c_char; 80],
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    pub device: nvmlDevice_t,
    pub event_type: u64,
    pub event_data: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

const DRIVER_BRANCH_INFO_V1: u32 = 0x0100_0054;
const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;

fn driver_branch(info: *mut DriverBranchInfo, len: u32) -> NvRes {
    let d = nv()?;
    if info.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null struct from the caller.
    if unsafe { (*info).version } != DRIVER_BRANCH_INFO_V1 {
        return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    let v = driver_version_string(d.cfg.driver_version);
    let major = v.split('.').next().unwrap_or("0");
    let branch = format!("r{major}_00");
    // SAFETY: the caller's 80-byte branch buffer (len at most 80 is used).
    let buf = unsafe { std::ptr::addr_of_mut!((*info).branch) as *mut c_char };
    put_str(buf, len.min(80), &branch)
}

fn serial(i: usize) -> String {
    format!("1324{:09}", 20_000_000 + i * 7_919)
}

fn process_name(pid: u32, buf: *mut c_char, len: u32) -> NvRes {
    nv()?;
    let comm =
        std::fs::read_to_string(format!("/proc/{pid}/comm")).map_err(|_| NVML_ERROR_NOT_FOUND)?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| comm.trim().to_string());
    let s = if (len as usize) > exe.len() {
        exe
    } else {
        comm.trim().to_string()
    };
    put_str(buf, len, &s)
}

fn cpu_affinity(h: Dev, n: u32, set: *mut u64) -> NvRes {
    dev(h)?;
    if set.is_null() || n == 0 {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
    for w in 0..n as usize {
        let lo = w * 64;
        let bits = if cpus <= lo {
            0
        } else if cpus - lo >= 64 {
            u64::MAX
        } else {
            (1u64 << (cpus - lo)) - 1
        };
        // SAFETY: set holds n words by the caller's contract.
        unsafe { *set.add(w) = bits };
    }
    Ok(())
}

fn by_serial(s: *const c_char, h: *mut Dev) -> NvRes {
    let d = nv()?;
    // SAFETY: NUL-terminated string from the caller.
    let want = unsafe { read_cstr(s) }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let i = (0..d.devs.len())
        .find(|i| serial(*i) == want)
        .ok_or(NVML_ERROR_NOT_FOUND)?;
    out(h, handle(i))
}

/// What one event set waits for: per registered GPU, the event types and
/// how many of its XID errors the set has delivered.
#[derive(Default)]
struct EventSet {
    devs: Vec<(usize, u64, usize)>,
}

static EVENT_SET_STATE: parking_lot::Mutex<Vec<(usize, EventSet)>> =
    parking_lot::Mutex::new(Vec::new());

/// `nvmlEventTypeXidCriticalError`.
const EVENT_XID: u64 = 0x8;

/// The next XID error not yet delivered to `set`, taken.
fn next_xid(d: &crate::driver::Driver, set: usize) -> Option<(usize, u64)> {
    let mut sets = EVENT_SET_STATE.lock();
    let (_, es) = sets.iter_mut().find(|(s, _)| *s == set)?;
    for (dev, types, seen) in es.devs.iter_mut() {
        if *types & EVENT_XID == 0 {
            continue;
        }
        if let Some(&xid) = crate::nvml::gpu_xids(d, *dev).get(*seen) {
            *seen += 1;
            return Some((*dev, xid));
        }
    }
    None
}

fn register_events(h: Dev, types: u64, set: usize) -> NvRes {
    let i = dev(h)?;
    if set == 0 || types & !0x0f_u64 & !0x1000 & !0x2000 != 0 {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    let d = nv()?;
    let mut sets = EVENT_SET_STATE.lock();
    let pos = match sets.iter().position(|(s, _)| *s == set) {
        Some(p) => p,
        None => {
            sets.push((set, EventSet::default()));
            sets.len() - 1
        }
    };
    let es = &mut sets[pos].1;
    // Errors reported before the registration are not delivered.
    let already = crate::nvml::gpu_xids(d, i).len();
    match es.devs.iter_mut().find(|(x, _, _)| *x == i) {
        Some(e) => e.1 |= types,
        None => es.devs.push((i, types, already)),
    }
    Ok(())
}

fn event_set_wait(set: usize, data: *mut EventData, timeout_ms: u32) -> NvRes {
    let d = nv()?;
    if set == 0 || data.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // The only events that happen in the sim are the XID errors of a GPU
    // made to fail (`gpu<i>.xid`, `gpu<i>.lost` in the state directory);
    // otherwise wait out the timeout (capped).
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.min(10_000) as u64);
    loop {
        if let Some((i, xid)) = next_xid(d, set) {
            return out(
                data,
                EventData {
                    device: handle(i),
                    event_type: EVENT_XID,
                    event_data: xid,
                    gpu_instance_id: 0xffff_ffff,
                    compute_instance_id: 0xffff_ffff,
                },
            );
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return Err(NVML_ERROR_TIMEOUT);
        }
        std::thread::sleep((deadline - now).min(std::time::Duration::from_millis(50)));
    }
}

static EVENT_SETS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

nvml_fns! {
    nvmlSystemGetDriverBranch(info: *mut DriverBranchInfo, len: u32) => driver_branch(info, len);
    nvmlSystemGetProcessName(pid: u32, buf: *mut c_char, len: u32) => process_name(pid, buf, len);
    nvmlSystemGetHicVersion(count: *mut u32, _info: *mut u8) => { nv()?; out(count, 0) };
    nvmlUnitGetCount(count: *mut u32) => { nv()?; out(count, 0) };
    nvmlDeviceGetArchitecture(h: Dev, a: *mut u32) => out(a, architecture(dev(h)?)?);
    nvmlDeviceGetSerial(h: Dev, buf: *mut c_char, len: u32) => put_str(buf, len, &serial(dev(h)?));
    nvmlDeviceGetHandleBySerial(s: *const c_char, h: *mut Dev) => by_serial(s, h);
    nvmlDeviceGetBrand(h: Dev, b: *mut u32) => { dev(h)?; out(b, 2) }; // NVML_BRAND_TESLA
    nvmlDeviceGetBoardPartNumber(h: Dev, buf: *mut c_char, len: u32) => { let i = dev(h)?; put_str(buf, len, &format!("900-2G{:03}-0000-000", 100 + i)) };
    nvmlDeviceGetBoardId(h: Dev, id: *mut u32) => { let i = dev(h)?; out(id, (0x17 + i as u32 * 0x10) << 8) };
    nvmlDeviceGetMultiGpuBoard(h: Dev, m: *mut u32) => { dev(h)?; out(m, 0) };
    nvmlDeviceGetVbiosVersion(h: Dev, buf: *mut c_char, len: u32) => { dev(h)?; put_str(buf, len, "90.00.00.00.01") };
    nvmlDeviceGetInforomImageVersion(h: Dev, buf: *mut c_char, len: u32) => { dev(h)?; put_str(buf, len, "G000.0000.00.00") };
    nvmlDeviceGetInforomVersion(h: Dev, _obj: u32, buf: *mut c_char, len: u32) => { dev(h)?; put_str(buf, len, "1.0") };
    nvmlDeviceGetGspFirmwareMode(h: Dev, on: *mut u32, dflt: *mut u32) => { dev(h)?; out(on, 0)?; out(dflt, 0) };
    nvmlDeviceGetGspFirmwareVersion(h: Dev, buf: *mut c_char) => {
        let d = nv()?;
        dev_of(d, h)?;
        // NVML_GSP_FIRMWARE_VERSION_BUF_SIZE = 0x40
        put_str(buf, 0x40, driver_version_string(d.cfg.driver_version))
    };
    nvmlDeviceGetClockInfo(h: Dev, ty: u32, mhz: *mut u32) => {
        let (g, m) = clocks(dev(h)?)?;
        // NVML_CLOCK_GRAPHICS 0, SM 1, MEM 2, VIDEO 3; idle: the base clocks.
        out(mhz, match ty { 0 | 1 => g / 2, 2 => m, 3 => g / 2, _ => return Err(NVML_ERROR_INVALID_ARGUMENT) })
    };
    nvmlDeviceGetMaxClockInfo(h: Dev, ty: u32, mhz: *mut u32) => {
        let (g, m) = clocks(dev(h)?)?;
        out(mhz, match ty { 0 | 1 | 3 => g, 2 => m, _ => return Err(NVML_ERROR_INVALID_ARGUMENT) })
    };
    nvmlDeviceGetApplicationsClock(h: Dev, ty: u32, mhz: *mut u32) => {
        let (g, m) = clocks(dev(h)?)?;
        out(mhz, match ty { 0 | 1 | 3 => g, 2 => m, _ => return Err(NVML_ERROR_INVALID_ARGUMENT) })
    };
    nvmlDeviceGetDefaultApplicationsClock(h: Dev, ty: u32, mhz: *mut u32) => {
        let (g, m) = clocks(dev(h)?)?;
        out(mhz, match ty { 0 | 1 | 3 => g, 2 => m, _ => return Err(NVML_ERROR_INVALID_ARGUMENT) })
    };
    nvmlDeviceGetClock(h: Dev, ty: u32, id: u32, mhz: *mut u32) => {
        let (g, m) = clocks(dev(h)?)?;
        // NVML_CLOCK_ID_CURRENT 0, APP_CLOCK_TARGET 1, APP_CLOCK_DEFAULT 2, CUSTOMER_BOOST_MAX 3
        let base = match ty { 0 | 1 | 3 => g, 2 => m, _ => return Err(NVML_ERROR_INVALID_ARGUMENT) };
        out(mhz, if id == 0 && ty != 2 { base / 2 } else { base })
    };
    nvmlDeviceGetCurrentClocksEventReasons(h: Dev, r: *mut u64) => { dev(h)?; out(r, 1) }; // GPU idle
    nvmlDeviceGetCurrentClocksThrottleReasons(h: Dev, r: *mut u64) => { dev(h)?; out(r, 1) };
    nvmlDeviceGetSupportedClocksEventReasons(h: Dev, r: *mut u64) => { dev(h)?; out(r, 0x1ff) };
    nvmlDeviceGetSupportedClocksThrottleReasons(h: Dev, r: *mut u64) => { dev(h)?; out(r, 0x1ff) };
    nvmlDeviceGetPerformanceState(h: Dev, p: *mut u32) => { dev(h)?; out(p, 0) };
    nvmlDeviceGetPowerState(h: Dev, p: *mut u32) => { dev(h)?; out(p, 0) };
    nvmlDeviceGetPowerManagementMode(h: Dev, m: *mut u32) => { dev(h)?; out(m, 1) };
    nvmlDeviceGetPowerManagementLimit(h: Dev, mw: *mut u32) => out(mw, power_limit_mw(dev(h)?)?);
    nvmlDeviceGetPowerManagementDefaultLimit(h: Dev, mw: *mut u32) => out(mw, power_limit_mw(dev(h)?)?);
    nvmlDeviceGetEnforcedPowerLimit(h: Dev, mw: *mut u32) => out(mw, power_limit_mw(dev(h)?)?);
    nvmlDeviceGetPowerManagementLimitConstraints(h: Dev, min: *mut u32, max: *mut u32) => {
        let l = power_limit_mw(dev(h)?)?;
        out(min, l / 2)?;
        out(max, l)
    };
    nvmlDeviceGetTotalEnergyConsumption(h: Dev, mj: *mut u64) => out(mj, energy_mj(dev(h)?)?);
    nvmlDeviceGetTemperatureThreshold(h: Dev, ty: u32, t: *mut u32) => {
        dev(h)?;
        // SHUTDOWN 0, SLOWDOWN 1, MEM_MAX 2, GPU_MAX 3, ACOUSTIC_MIN/CURR/MAX 4-6
        out(t, match ty { 0 => 90, 1 => 87, 2 => 95, 3 => 85, 4..=6 => 80, _ => return Err(NVML_ERROR_INVALID_ARGUMENT) })
    };
    nvmlDeviceGetFanSpeed_v2(h: Dev, fan: u32, s: *mut u32) => { dev(h)?; if fan != 0 { return Err(NVML_ERROR_INVALID_ARGUMENT) } out(s, 30) };
    nvmlDeviceGetNumFans(h: Dev, n: *mut u32) => { dev(h)?; out(n, 1) };
    // PCIe gen 4 x16.
    nvmlDeviceGetCurrPcieLinkGeneration(h: Dev, g: *mut u32) => { dev(h)?; out(g, 4) };
    nvmlDeviceGetMaxPcieLinkGeneration(h: Dev, g: *mut u32) => { dev(h)?; out(g, 4) };
    nvmlDeviceGetGpuMaxPcieLinkGeneration(h: Dev, g: *mut u32) => { dev(h)?; out(g, 4) };
    nvmlDeviceGetCurrPcieLinkWidth(h: Dev, w: *mut u32) => { dev(h)?; out(w, 16) };
    nvmlDeviceGetMaxPcieLinkWidth(h: Dev, w: *mut u32) => { dev(h)?; out(w, 16) };
    nvmlDeviceGetPcieSpeed(h: Dev, s: *mut u32) => { dev(h)?; out(s, 16_000) };
    nvmlDeviceGetPcieLinkMaxSpeed(h: Dev, s: *mut u32) => { dev(h)?; out(s, 16_000) };
    nvmlDeviceGetPcieThroughput(h: Dev, counter: u32, v: *mut u32) => { dev(h)?; if counter > 1 { return Err(NVML_ERROR_INVALID_ARGUMENT) } out(v, 0) };
    nvmlDeviceGetPcieReplayCounter(h: Dev, v: *mut u32) => { dev(h)?; out(v, 0) };
    nvmlDeviceGetBusType(h: Dev, t: *mut u32) => { dev(h)?; out(t, 2) }; // NVML_BUS_TYPE_PCIE
    nvmlDeviceGetBAR1MemoryInfo(h: Dev, m: *mut Bar1Memory) => {
        let total = bar1_bytes(dev(h)?)?;
        // A few MiB are always mapped by the driver.
        out(m, Bar1Memory { total, free: total - (2 << 20), used: 2 << 20 })
    };
    nvmlDeviceGetMemoryBusWidth(h: Dev, w: *mut u32) => { dev(h)?; out(w, 256) };
    nvmlDeviceGetEccMode(h: Dev, cur: *mut u32, pend: *mut u32) => { dev(h)?; out(cur, 0)?; out(pend, 0) };
    nvmlDeviceGetTotalEccErrors(h: Dev, _ty: u32, _counter: u32, n: *mut u64) => { dev(h)?; out(n, 0) };
    nvmlDeviceGetMemoryErrorCounter(h: Dev, _ty: u32, _counter: u32, _loc: u32, n: *mut u64) => { dev(h)?; out(n, 0) };
    nvmlDeviceGetRetiredPagesPendingStatus(h: Dev, p: *mut u32) => { dev(h)?; out(p, 0) };
    nvmlDeviceGetRemappedRows(h: Dev, corr: *mut u32, unc: *mut u32, pending: *mut u32, failed: *mut u32) => {
        dev(h)?;
        out(corr, 0)?;
        out(unc, 0)?;
        out(pending, 0)?;
        out(failed, 0)
    };
    nvmlDeviceGetMigMode(h: Dev, cur: *mut u32, pend: *mut u32) => { dev(h)?; out(cur, 0)?; out(pend, 0) };
    nvmlDeviceIsMigDeviceHandle(h: Dev, is: *mut u32) => { dev(h)?; out(is, 0) };
    nvmlDeviceGetMaxMigDeviceCount(h: Dev, n: *mut u32) => { dev(h)?; out(n, 0) };
    nvmlDeviceGetDisplayMode(h: Dev, m: *mut u32) => { dev(h)?; out(m, 0) };
    nvmlDeviceGetDisplayActive(h: Dev, m: *mut u32) => { dev(h)?; out(m, 0) };
    nvmlDeviceGetAccountingMode(h: Dev, m: *mut u32) => { dev(h)?; out(m, 0) };
    nvmlDeviceGetVirtualizationMode(h: Dev, m: *mut u32) => { dev(h)?; out(m, 0) };
    nvmlDeviceGetEncoderUtilization(h: Dev, u: *mut u32, period: *mut u32) => { dev(h)?; out(u, 0)?; out(period, 167_000) };
    nvmlDeviceGetDecoderUtilization(h: Dev, u: *mut u32, period: *mut u32) => { dev(h)?; out(u, 0)?; out(period, 167_000) };
    nvmlDeviceGetJpgUtilization(h: Dev, u: *mut u32, period: *mut u32) => { dev(h)?; out(u, 0)?; out(period, 167_000) };
    nvmlDeviceGetOfaUtilization(h: Dev, u: *mut u32, period: *mut u32) => { dev(h)?; out(u, 0)?; out(period, 167_000) };
    nvmlDeviceGetViolationStatus(h: Dev, _policy: u32, v: *mut ViolationTime) => {
        dev(h)?;
        out(v, ViolationTime { reference_time: crate::state::now_unix_ns() / 1000, violation_time: 0 })
    };
    nvmlDeviceGetTopologyCommonAncestor(a: Dev, b: Dev, level: *mut u32) => {
        let (x, y) = (dev(a)?, dev(b)?);
        // NVML_TOPOLOGY_INTERNAL 0 for the same GPU, HOSTBRIDGE 30 otherwise.
        out(level, if x == y { 0 } else { 30 })
    };
    nvmlDeviceGetP2PStatus(a: Dev, b: Dev, _index: u32, st: *mut u32) => { dev(a)?; dev(b)?; out(st, 0) };
    nvmlDeviceGetCpuAffinity(h: Dev, n: u32, set: *mut u64) => cpu_affinity(h, n, set);
    nvmlDeviceGetNumaNodeId(h: Dev, node: *mut u32) => { dev(h)?; out(node, 0) };
    nvmlDeviceGetComputeInstanceId(h: Dev, _id: *mut u32) => { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) };
    nvmlDeviceGetGpuInstanceId(h: Dev, _id: *mut u32) => { dev(h)?; Err(NVML_ERROR_NOT_SUPPORTED) };
    nvmlDeviceGetSupportedEventTypes(h: Dev, t: *mut u64) => { dev(h)?; out(t, 0x0f) };
    nvmlEventSetCreate(set: *mut usize) => {
        nv()?;
        out(set, 0x7e00_0000_0000 + (EVENT_SETS.fetch_add(1, Relaxed) + 1) * 0x40)
    };
    nvmlDeviceRegisterEvents(h: Dev, types: u64, set: usize) => register_events(h, types, set);
    nvmlEventSetWait_v2(set: usize, data: *mut EventData, timeout_ms: u32) => event_set_wait(set, data, timeout_ms);
    nvmlEventSetWait(set: usize, data: *mut EventData, timeout_ms: u32) => event_set_wait(set, data, timeout_ms);
    nvmlEventSetFree(set: usize) => {
        nv()?;
        if set == 0 { return Err(NVML_ERROR_INVALID_ARGUMENT) }
        EVENT_SET_STATE.lock().retain(|(s, _)| *s != set);
        Ok(())
    };
}

// ------------------------------------------------ affinity, topology, fields

/// `NVML_STRUCT_VERSION`: the struct's size and its version in the top byte.
const fn struct_version(size: usize, ver: u32) -> u32 {
    size as u32 | (ver << 24)
}

/// Reads the version word of a versioned NVML struct and checks it.
fn check_version(p: *const u32, want: u32) -> NvRes {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: a versioned struct from the caller starts with its version.
    if unsafe { p.read_unaligned() } != want {
        return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    Ok(())
}

/// `nvmlPciInfoExt_v1_t`.
#[repr(C)]
pub struct PciInfoExt {
    version: u32,
    domain: u32,
    bus: u32,
    device: u32,
    pci_device_id: u32,
    pci_sub_system_id: u32,
    base_class: u32,
    sub_class: u32,
    bus_id: [u8; 32],
}

/// `nvmlTemperature_v1_t`.
#[repr(C)]
pub struct TemperatureV {
    version: u32,
    sensor: u32,
    temperature: i32,
}

/// `nvmlDeviceCapabilities_v1_t`.
#[repr(C)]
pub struct Capabilities {
    version: u32,
    cap_mask: u32,
}

/// `nvmlUUID_v1_t`: version, type (ASCII 1, binary 2), the value.
#[repr(C)]
pub struct UuidV {
    version: u32,
    type_: u32,
    value: [u8; 44],
}

/// `nvmlFanSpeedInfo_v1_t`.
#[repr(C)]
pub struct FanSpeedInfo {
    version: u32,
    fan: u32,
    speed: u32,
}

/// `nvmlCoolerInfo_v1_t`.
#[repr(C)]
pub struct CoolerInfo {
    version: u32,
    index: u32,
    signal_type: u32,
    target: u32,
}

/// `nvmlFieldValue_t`.
#[repr(C)]
pub struct FieldValue {
    field_id: u32,
    scope_id: u32,
    timestamp: i64,
    latency_usec: i64,
    value_type: u32,
    nvml_return: u32,
    value: u64,
}

const _: () = assert!(std::mem::size_of::<PciInfoExt>() == 64);
const _: () = assert!(std::mem::size_of::<UuidV>() == 52);
const _: () = assert!(std::mem::size_of::<FieldValue>() == 40);

/// The device's (extended) PCI identity: a 3D controller (class 0x03,
/// subclass 0x02), as NVIDIA's data-centre GPUs are.
fn pci_info_ext(h: Dev, p: *mut PciInfoExt) -> NvRes {
    let i = dev(h)?;
    check_version(
        p as *const u32,
        struct_version(std::mem::size_of::<PciInfoExt>(), 1),
    )?;
    let mut legacy = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pciDeviceId: 0,
        pciSubSystemId: 0,
        busId: [0; 32],
    };
    // SAFETY: the address of our local.
    let r = unsafe { crate::nvml::nvmlDeviceGetPciInfo_v3(handle(i), &mut legacy) };
    if r != NVML_SUCCESS {
        return Err(r);
    }
    let bus_id = legacy.busId;
    // SAFETY: the caller's struct (version checked, so non-null).
    unsafe {
        p.write_unaligned(PciInfoExt {
            version: (*p).version,
            domain: legacy.domain,
            bus: legacy.bus,
            device: legacy.device,
            pci_device_id: legacy.pciDeviceId,
            pci_sub_system_id: legacy.pciSubSystemId,
            base_class: 0x03,
            sub_class: 0x02,
            bus_id,
        })
    };
    Ok(())
}

fn handle_by_uuid_v(u: *const UuidV, h: *mut Dev) -> NvRes {
    let d = nv()?;
    check_version(
        u as *const u32,
        struct_version(std::mem::size_of::<UuidV>(), 1),
    )?;
    // SAFETY: the caller's struct (version checked, so non-null).
    let u = unsafe { u.read_unaligned() };
    let i = match u.type_ {
        1 => {
            let s = u.value.split(|c| *c == 0).next().unwrap_or_default();
            let s = String::from_utf8_lossy(s);
            let want = s.trim().trim_start_matches("GPU-").to_ascii_lowercase();
            d.devs.iter().position(|x| {
                x.uuid
                    .trim_start_matches("GPU-")
                    .eq_ignore_ascii_case(&want)
            })
        }
        2 => d
            .devs
            .iter()
            .position(|x| x.uuid_bytes[..] == u.value[..16]),
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    }
    .ok_or(NVML_ERROR_NOT_FOUND)?;
    out(h, handle(i))
}

/// Every simulated GPU hangs off the host bridge of one CPU socket (as
/// `nvmlDeviceGetTopologyCommonAncestor` says): for a level of HOSTBRIDGE
/// (30) or wider, the others are near.
fn nearest_gpus(h: Dev, level: u32, count: *mut u32, devs: *mut Dev) -> NvRes {
    let me = dev(h)?;
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let near: Vec<usize> = if level >= 30 {
        (0..nv()?.devs.len()).filter(|&x| x != me).collect()
    } else {
        Vec::new()
    };
    list_devices(&near, count, devs)
}

/// Writes `v` as device handles to a caller array of capacity `*count`
/// (only the count when it is 0), as NVML's list queries do.
fn list_devices(v: &[usize], count: *mut u32, devs: *mut Dev) -> NvRes {
    // SAFETY: count is the caller's (checked non-null by the callers).
    let cap = unsafe { count.read_unaligned() } as usize;
    // SAFETY: as above.
    unsafe { count.write_unaligned(v.len() as u32) };
    if cap == 0 {
        return Ok(());
    }
    if cap < v.len() || devs.is_null() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, i) in v.iter().enumerate() {
        // SAFETY: devs holds cap >= v.len() handles by the caller's contract.
        unsafe { devs.add(k).write_unaligned(handle(*i)) };
    }
    Ok(())
}

/// Field values: none of NVML's counters (NVLink, ECC, power smoothing, ...)
/// exists on the simulated PCIe GPUs: each field answers NOT_SUPPORTED, the
/// call itself succeeds.
fn field_values(h: Dev, n: i32, values: *mut FieldValue) -> NvRes {
    dev(h)?;
    if n < 0 || (n > 0 && values.is_null()) {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.as_micros() as i64)
        .unwrap_or(0);
    for k in 0..n as usize {
        // SAFETY: values holds n entries by the caller's contract.
        unsafe {
            let v = values.add(k);
            std::ptr::addr_of_mut!((*v).timestamp).write_unaligned(now);
            std::ptr::addr_of_mut!((*v).latency_usec).write_unaligned(0);
            std::ptr::addr_of_mut!((*v).nvml_return).write_unaligned(NVML_ERROR_NOT_SUPPORTED);
        }
    }
    Ok(())
}

/// Performance states the simulated GPU has: P0 (busy) and P8 (idle); the
/// rest of the caller's array is `NVML_PSTATE_UNKNOWN`.
fn supported_pstates(h: Dev, states: *mut u32, size: u32) -> NvRes {
    dev(h)?;
    let n = size as usize / 4;
    if states.is_null() || n < 2 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for k in 0..n {
        let v = match k {
            0 => 0,
            1 => 8,
            _ => 32,
        };
        // SAFETY: states holds size bytes by the caller's contract.
        unsafe { states.add(k).write_unaligned(v) };
    }
    Ok(())
}

/// NVML's system event sets (driver bind/unbind): no such event happens in
/// the sim, so a wait returns no event once its timeout passed.
#[repr(C)]
pub struct SystemEventSetRequest {
    version: u32,
    set: usize,
}

#[repr(C)]
pub struct SystemRegisterEventRequest {
    version: u32,
    event_types: u64,
    set: usize,
}

#[repr(C)]
pub struct SystemEventSetWaitRequest {
    version: u32,
    timeout_ms: u32,
    set: usize,
    data: *mut u8,
    data_size: u32,
    num_event: u32,
}

fn system_event_set_create(r: *mut SystemEventSetRequest) -> NvRes {
    nv()?;
    check_version(
        r as *const u32,
        struct_version(std::mem::size_of::<SystemEventSetRequest>(), 1),
    )?;
    let set = 0x7f00_0000_0000 + (EVENT_SETS.fetch_add(1, Relaxed) + 1) * 0x40;
    // SAFETY: the caller's request (version checked, so non-null).
    unsafe { std::ptr::addr_of_mut!((*r).set).write_unaligned(set) };
    Ok(())
}

fn system_event_set_free(r: *mut SystemEventSetRequest) -> NvRes {
    nv()?;
    check_version(
        r as *const u32,
        struct_version(std::mem::size_of::<SystemEventSetRequest>(), 1),
    )?;
    // SAFETY: as above.
    if unsafe { std::ptr::addr_of!((*r).set).read_unaligned() } == 0 {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(())
}

fn system_register_events(r: *mut SystemRegisterEventRequest) -> NvRes {
    nv()?;
    check_version(
        r as *const u32,
        struct_version(std::mem::size_of::<SystemRegisterEventRequest>(), 1),
    )?;
    // SAFETY: the caller's request (version checked, so non-null).
    let (types, set) = unsafe {
        (
            std::ptr::addr_of!((*r).event_types).read_unaligned(),
            std::ptr::addr_of!((*r).set).read_unaligned(),
        )
    };
    // nvmlSystemEventTypeGpuDriverUnbind 1, ...Bind 2.
    if set == 0 || types & !3 != 0 {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(())
}

fn system_event_set_wait(r: *mut SystemEventSetWaitRequest) -> NvRes {
    nv()?;
    check_version(
        r as *const u32,
        struct_version(std::mem::size_of::<SystemEventSetWaitRequest>(), 1),
    )?;
    // SAFETY: the caller's request (version checked, so non-null).
    let (timeout, set) = unsafe {
        (
            std::ptr::addr_of!((*r).timeout_ms).read_unaligned(),
            std::ptr::addr_of!((*r).set).read_unaligned(),
        )
    };
    if set == 0 {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    std::thread::sleep(std::time::Duration::from_millis(timeout.min(10_000) as u64));
    // SAFETY: as above.
    unsafe { std::ptr::addr_of_mut!((*r).num_event).write_unaligned(0) };
    Err(NVML_ERROR_TIMEOUT)
}

nvml_fns! {
    nvmlDeviceGetCpuAffinityWithinScope(h: Dev, n: u32, set: *mut u64, _scope: u32) => cpu_affinity(h, n, set);
    // One NUMA node (0) holds every simulated GPU.
    nvmlDeviceGetMemoryAffinity(h: Dev, n: u32, set: *mut u64, _scope: u32) => {
        dev(h)?;
        if set.is_null() || n == 0 { return Err(NVML_ERROR_INVALID_ARGUMENT) }
        for w in 0..n as usize {
            // SAFETY: set holds n words by the caller's contract.
            unsafe { set.add(w).write_unaligned(u64::from(w == 0)) };
        }
        Ok(())
    };
    // The GPU's CPUs are every CPU: binding the caller to them, or undoing
    // it, leaves its affinity as it is.
    nvmlDeviceSetCpuAffinity(h: Dev) => { dev(h)?; Ok(()) };
    nvmlDeviceClearCpuAffinity(h: Dev) => { dev(h)?; Ok(()) };
    nvmlDeviceGetPciInfoExt(h: Dev, p: *mut PciInfoExt) => pci_info_ext(h, p);
    nvmlDeviceGetFieldValues(h: Dev, n: i32, v: *mut FieldValue) => field_values(h, n, v);
    nvmlDeviceClearFieldValues(h: Dev, n: i32, v: *mut FieldValue) => field_values(h, n, v);
    // No page was ever retired (the sim has no ECC errors).
    nvmlDeviceGetRetiredPages(h: Dev, cause: u32, count: *mut u32, _addrs: *mut u64) => {
        dev(h)?;
        if cause > 1 { return Err(NVML_ERROR_INVALID_ARGUMENT) }
        out(count, 0)
    };
    nvmlDeviceGetRetiredPages_v2(h: Dev, cause: u32, count: *mut u32, _addrs: *mut u64, _ts: *mut u64) => {
        dev(h)?;
        if cause > 1 { return Err(NVML_ERROR_INVALID_ARGUMENT) }
        out(count, 0)
    };
    nvmlDeviceGetTemperatureV(h: Dev, t: *mut TemperatureV) => {
        dev(h)?;
        check_version(t as *const u32, struct_version(std::mem::size_of::<TemperatureV>(), 1))?;
        // SAFETY: the caller's struct (version checked, so non-null).
        unsafe {
            if std::ptr::addr_of!((*t).sensor).read_unaligned() != 0 { return Err(NVML_ERROR_INVALID_ARGUMENT) }
            std::ptr::addr_of_mut!((*t).temperature).write_unaligned(40);
        }
        Ok(())
    };
    // No extended GPU memory (the only capability bit).
    nvmlDeviceGetCapabilities(h: Dev, c: *mut Capabilities) => {
        dev(h)?;
        check_version(c as *const u32, struct_version(std::mem::size_of::<Capabilities>(), 1))?;
        // SAFETY: the caller's struct (version checked, so non-null).
        unsafe { std::ptr::addr_of_mut!((*c).cap_mask).write_unaligned(0) };
        Ok(())
    };
    nvmlDeviceGetHandleByUUIDV(u: *const UuidV, h: *mut Dev) => handle_by_uuid_v(u, h);
    nvmlDeviceGetTopologyNearestGpus(h: Dev, level: u32, count: *mut u32, devs: *mut Dev) => nearest_gpus(h, level, count, devs);
    nvmlSystemGetTopologyGpuSet(_cpu: u32, count: *mut u32, devs: *mut Dev) => {
        let n = nv()?.devs.len();
        if count.is_null() { return Err(NVML_ERROR_INVALID_ARGUMENT) }
        list_devices(&(0..n).collect::<Vec<_>>(), count, devs)
    };
    nvmlDeviceGetSupportedPerformanceStates(h: Dev, states: *mut u32, size: u32) => supported_pstates(h, states, size);
    // The one fan (see nvmlDeviceGetNumFans) runs at 30 % of 5000 RPM,
    // under the driver's temperature control.
    nvmlDeviceGetFanSpeedRPM(h: Dev, f: *mut FanSpeedInfo) => {
        dev(h)?;
        check_version(f as *const u32, struct_version(std::mem::size_of::<FanSpeedInfo>(), 1))?;
        // SAFETY: the caller's struct (version checked, so non-null).
        unsafe {
            if std::ptr::addr_of!((*f).fan).read_unaligned() != 0 { return Err(NVML_ERROR_INVALID_ARGUMENT) }
            std::ptr::addr_of_mut!((*f).speed).write_unaligned(1500);
        }
        Ok(())
    };
    nvmlDeviceGetTargetFanSpeed(h: Dev, fan: u32, s: *mut u32) => { dev(h)?; if fan != 0 { return Err(NVML_ERROR_INVALID_ARGUMENT) } out(s, 30) };
    nvmlDeviceGetMinMaxFanSpeed(h: Dev, min: *mut u32, max: *mut u32) => { dev(h)?; out(min, 30)?; out(max, 100) };
    nvmlDeviceGetFanControlPolicy_v2(h: Dev, fan: u32, p: *mut u32) => { dev(h)?; if fan != 0 { return Err(NVML_ERROR_INVALID_ARGUMENT) } out(p, 0) };
    nvmlDeviceGetCoolerInfo(h: Dev, c: *mut CoolerInfo) => {
        dev(h)?;
        check_version(c as *const u32, struct_version(std::mem::size_of::<CoolerInfo>(), 1))?;
        // SAFETY: the caller's struct (version checked, so non-null).
        unsafe {
            if std::ptr::addr_of!((*c).index).read_unaligned() != 0 { return Err(NVML_ERROR_INVALID_ARGUMENT) }
            // A variable-speed cooler of the GPU, its memory and power supply.
            std::ptr::addr_of_mut!((*c).signal_type).write_unaligned(2);
            std::ptr::addr_of_mut!((*c).target).write_unaligned(0b1110);
        }
        Ok(())
    };
    // Changing the fans needs root on a real machine; the sim is not one.
    nvmlDeviceSetFanSpeed_v2(h: Dev, _fan: u32, _s: u32) => { dev(h)?; Err(NVML_ERROR_NO_PERMISSION) };
    nvmlDeviceSetDefaultFanSpeed_v2(h: Dev, _fan: u32) => { dev(h)?; Err(NVML_ERROR_NO_PERMISSION) };
    nvmlDeviceSetFanControlPolicy(h: Dev, _fan: u32, _p: u32) => { dev(h)?; Err(NVML_ERROR_NO_PERMISSION) };
    nvmlSystemEventSetCreate(r: *mut SystemEventSetRequest) => system_event_set_create(r);
    nvmlSystemEventSetFree(r: *mut SystemEventSetRequest) => system_event_set_free(r);
    nvmlSystemRegisterEvents(r: *mut SystemRegisterEventRequest) => system_register_events(r);
    nvmlSystemEventSetWait(r: *mut SystemEventSetWaitRequest) => system_event_set_wait(r);
}
