//! GPU identity and visibility (joining a GPU's ledger is `crate::memory`'s).
//!
//! - Visibility: `ALIYUN_COM_GPU_VISIBLE_DEVICES` lists the GPUs the
//!   container sees, by host index or UUID; [`visible_list`] turns it into
//!   host indices in container order. Container index i is the i-th listed
//!   GPU.
//! - Identity: one table of the visible GPUs, container index ↔ UUID
//!   (`GPU-…`) ↔ CUDA ordinal ↔ NVML index, whose CUDA and NVML columns are
//!   filled by the same rule when each API is first asked
//!   ([`cuda_visible`], [`nvml_visible`]); [`cuda_info`] and
//!   `nvml_identity` read UUIDs from it.

use std::ffi::c_char;
use std::sync::OnceLock;

use super::real;
use super::types::*;
use crate::config::{self, DeviceSel};

/// Which host devices the container sees, in container order. Pure.
/// `count` host devices; `uuid_of(i)` the UUID of host device `i`.
/// Selectors naming no device are reported in the returned error list.
pub fn visible_list(
    sels: Option<&[DeviceSel]>,
    count: u32,
    uuid_of: &dyn Fn(u32) -> Option<String>,
) -> (Vec<u32>, Vec<String>) {
    let Some(sels) = sels else {
        return ((0..count).collect(), Vec::new());
    };
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for sel in sels {
        let found = match sel {
            DeviceSel::Index(i) => (*i < count).then_some(*i),
            DeviceSel::Uuid(u) => {
                (0..count).find(|&i| uuid_of(i).is_some_and(|x| x.eq_ignore_ascii_case(u)))
            }
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            Some(_) => {}
            None => errors.push(match sel {
                DeviceSel::Index(i) => format!(
                    "GPU index {i}, but this host has {count} GPU{} ({})",
                    if count == 1 { "" } else { "s" },
                    if count == 0 {
                        "none".to_string()
                    } else {
                        format!("indices 0 to {}", count - 1)
                    }
                ),
                DeviceSel::Uuid(u) => format!("GPU {u}"),
            }),
        }
    }
    (out, errors)
}

/// One API's column of the identity table: the visible GPUs in container
/// order, as that API numbers them (CUDA ordinal, NVML index), with the
/// UUID it reports for each.
struct Column {
    ordinals: Vec<u32>,
    uuids: Vec<Option<String>>,
}

/// The GPU identity table: container index i ↔ UUID ↔ CUDA ordinal ↔ NVML
/// index. Each API's column is filled the first time that API is asked
/// (a process may use only one of them), by the one rule of
/// [`visible_list`]; once both are there, a container index whose two
/// UUIDs differ (CUDA and NVML number the GPUs differently and the list
/// selects by index) is reported once.
struct Table {
    cuda: OnceLock<Column>,
    nvml: OnceLock<Column>,
}

static TABLE: Table = Table {
    cuda: OnceLock::new(),
    nvml: OnceLock::new(),
};

impl Table {
    /// The column of one API, built from its device count and UUIDs.
    fn fill(
        slot: &'static OnceLock<Column>,
        count: u32,
        uuid_of: &dyn Fn(u32) -> Option<String>,
    ) -> &'static Column {
        let cfg = config::get();
        let (ordinals, errors) = visible_list(cfg.visible.as_deref(), count, uuid_of);
        for e in errors {
            tracing::error!("cgpu: ALIYUN_COM_GPU_VISIBLE_DEVICES names {e}, which is not a GPU of this host; ignored");
        }
        let uuids = ordinals.iter().map(|&o| uuid_of(o)).collect();
        let col = slot.get_or_init(|| Column { ordinals, uuids });
        TABLE.check_agreement();
        col
    }

    fn check_agreement(&self) {
        static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let (Some(c), Some(n)) = (self.cuda.get(), self.nvml.get()) else {
            return;
        };
        if !columns_agree(&c.uuids, &n.uuids)
            && !REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!(
                "cgpu: CUDA and NVML disagree on the visible GPUs (CUDA {:?}, NVML {:?}): they number the GPUs differently; list them by UUID in ALIYUN_COM_GPU_VISIBLE_DEVICES",
                c.uuids,
                n.uuids
            );
        }
    }

    /// The UUID at container index `i` as `col` reports it.
    fn uuid(col: &Column, i: usize) -> Option<String> {
        col.uuids.get(i).cloned().flatten()
    }
}

/// Do two columns name the same GPUs in the same container order? (A UUID
/// an API could not report is not held against it.)
fn columns_agree(a: &[Option<String>], b: &[Option<String>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            _ => true,
        })
}

fn cuda_uuid(dev: CUdevice) -> Option<String> {
    let mut u = CUuuid::default();
    let rc = match real::cuDeviceGetUuid_v2.get() {
        // SAFETY: u is a valid out-parameter.
        Some(f) => unsafe { f(&mut u, dev) },
        None => crate::process::call_real!(real::cuDeviceGetUuid, &mut u, dev),
    };
    (rc == CUDA_SUCCESS).then(|| format_uuid(&u.bytes))
}

/// The CUDA column of the identity table, or `Err` with the driver's code
/// (e.g. `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`; not cached).
fn cuda_column() -> Result<&'static Column, CUresult> {
    if let Some(c) = TABLE.cuda.get() {
        return Ok(c);
    }
    let mut n: i32 = 0;
    let rc = crate::process::call_real!(real::cuDeviceGetCount, &mut n);
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    let uuid_of = |i: u32| {
        let mut d: CUdevice = 0;
        if crate::process::call_real!(real::cuDeviceGet, &mut d, i as i32) != CUDA_SUCCESS {
            return None;
        }
        cuda_uuid(d)
    };
    Ok(Table::fill(&TABLE.cuda, n.max(0) as u32, &uuid_of))
}

/// The container-visible host ordinals (CUDA), or `Err` with the driver's
/// code (e.g. `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`; not cached).
pub fn cuda_visible() -> Result<&'static [u32], CUresult> {
    cuda_column().map(|c| c.ordinals.as_slice())
}

/// The container-visible index of host device `dev` (CUDA), `None` if hidden.
pub fn cuda_visible_index(dev: CUdevice) -> Option<usize> {
    let v = cuda_visible().ok()?;
    v.iter().position(|&d| d as i32 == dev)
}

/// Identity of CUDA device `dev` as the driver reports it (`None`: hidden
/// or unknown).
pub fn cuda_info(dev: CUdevice) -> Option<GpuInfo> {
    let visible_index = cuda_visible_index(dev)?;
    let uuid = Table::uuid(cuda_column().ok()?, visible_index)?;
    let mut total: usize = 0;
    if crate::process::call_real!(real::cuDeviceTotalMem_v2, &mut total, dev) != CUDA_SUCCESS {
        return None;
    }
    Some(GpuInfo {
        uuid,
        host_index: dev as u32,
        visible_index,
        physical_total: total as u64,
    })
}

/// A device `id` in a memory location (`CUmemLocation`), as the driver must
/// see it. Clients pass either the `CUdevice` our `cuDeviceGet` returned (a
/// host device: kept) or a device ordinal as the container counts them
/// (PyTorch passes its device index): translated to the listed host device.
/// Without `ALIYUN_COM_GPU_VISIBLE_DEVICES` both are the same.
pub fn host_device_for_location(id: i32) -> i32 {
    if !filtering() {
        return id;
    }
    let Ok(v) = cuda_visible() else { return id };
    if v.iter().any(|&d| d as i32 == id) {
        return id;
    }
    match usize::try_from(id).ok().and_then(|i| v.get(i)) {
        Some(&host) => host as i32,
        None => id,
    }
}

/// The device of the current context, if any.
pub fn current_device() -> Option<CUdevice> {
    let mut d: CUdevice = -1;
    (crate::process::call_real!(real::cuCtxGetDevice, &mut d) == CUDA_SUCCESS).then_some(d)
}

fn filtering() -> bool {
    config::get().visible.is_some()
}

fn nvml_uuid(h: nvmlDevice_t) -> Option<String> {
    let mut buf = [0 as c_char; 96];
    if crate::process::call_real!(
        real::nvmlDeviceGetUUID,
        h,
        buf.as_mut_ptr(),
        buf.len() as u32
    ) != NVML_SUCCESS
    {
        return None;
    }
    let bytes = buf.map(|c| c as u8);
    Some(super::cstr::text_lossy(&bytes))
}

fn nvml_handle(index: u32) -> Option<nvmlDevice_t> {
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    (crate::process::call_real!(real::nvmlDeviceGetHandleByIndex_v2, index, &mut h) == NVML_SUCCESS)
        .then_some(h)
}

/// The NVML column of the identity table; `Err` = NVML's code (not cached).
fn nvml_column() -> Result<&'static Column, nvmlReturn_t> {
    if let Some(c) = TABLE.nvml.get() {
        return Ok(c);
    }
    let mut n = 0u32;
    let rc = crate::process::call_real!(real::nvmlDeviceGetCount_v2, &mut n);
    if rc != NVML_SUCCESS {
        return Err(rc);
    }
    let uuid_of = |i: u32| nvml_handle(i).and_then(nvml_uuid);
    Ok(Table::fill(&TABLE.nvml, n, &uuid_of))
}

/// The container-visible host indices (NVML); `Err` = NVML's code (not cached).
pub fn nvml_visible() -> Result<&'static [u32], nvmlReturn_t> {
    nvml_column().map(|c| c.ordinals.as_slice())
}

/// The container index of the GPU NVML numbers `host`, `None` if hidden.
pub fn nvml_visible_index(host: u32) -> Option<usize> {
    nvml_visible().ok()?.iter().position(|&i| i == host)
}

/// The host index of the GPU behind NVML handle `h`.
pub(crate) fn nvml_handle_host_index(h: nvmlDevice_t) -> Option<u32> {
    let mut i = 0u32;
    (crate::process::call_real!(real::nvmlDeviceGetIndex, h, &mut i) == NVML_SUCCESS).then_some(i)
}

/// The GPU behind NVML handle `h` as (host index, container-visible
/// index, UUID); `None` if hidden or unknown.
pub(crate) fn nvml_identity(h: nvmlDevice_t) -> Option<(u32, usize, String)> {
    let host = nvml_handle_host_index(h)?;
    let visible_index = nvml_visible_index(host)?;
    let uuid = Table::uuid(nvml_column().ok()?, visible_index)?;
    Some((host, visible_index, uuid))
}

/// Identity of a GPU as the driver reports it.
pub struct GpuInfo {
    pub uuid: String,
    pub host_index: u32,
    pub visible_index: usize,
    pub physical_total: u64,
}

/// Format a CUDA UUID as NVML prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_lists() {
        let uuid = |i: u32| Some(format!("GPU-{i:08x}"));
        assert_eq!(visible_list(None, 3, &uuid).0, vec![0, 1, 2]);
        let sels = [DeviceSel::Index(2), DeviceSel::Uuid("gpu-00000000".into())];
        assert_eq!(visible_list(Some(&sels), 3, &uuid), (vec![2, 0], vec![]));
        let sels = [DeviceSel::Index(5), DeviceSel::Index(1)];
        let (l, e) = visible_list(Some(&sels), 3, &uuid);
        assert_eq!(l, vec![1]);
        assert_eq!(e.len(), 1);
    }

    #[test]
    fn columns_agree_on_uuids_in_order() {
        let c = |v: &[&str]| -> Vec<Option<String>> {
            v.iter()
                .map(|s| (!s.is_empty()).then(|| s.to_string()))
                .collect()
        };
        assert!(columns_agree(
            &c(&["GPU-a", "GPU-b"]),
            &c(&["gpu-A", "GPU-b"])
        ));
        assert!(columns_agree(&c(&["GPU-a", ""]), &c(&["GPU-a", "GPU-b"])));
        assert!(!columns_agree(
            &c(&["GPU-a", "GPU-b"]),
            &c(&["GPU-b", "GPU-a"])
        ));
        assert!(!columns_agree(&c(&["GPU-a"]), &c(&["GPU-a", "GPU-b"])));
    }
}
