//! What the GPU itself reports about its use, from NVML
//! (`libnvidia-ml.so.1`, loaded when first needed, never linked): the
//! utilisation of each process. Under policy 5 (native) the scheduler
//! charges nobody, so a container's GPU-Util comes from here instead of
//! the ledger.
//!
//! NVML names host processes by their pid in the host's PID namespace (the
//! tool's, when it runs on the host); the ledger names them by their pid in
//! their own namespace and that namespace's inode
//! ([`cgpu_ledger::identity::ns_pid`] translates one into the other).

use std::collections::HashMap;
use std::sync::OnceLock;

pub use cgpu_nvml::Nvml;

/// NVML of this host, once per process (`None`, said once on stderr, when
/// it cannot be loaded or initialised, or has no per-process utilisation).
pub fn get() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| match Nvml::open_for_utilization() {
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

/// Utilisation (SM, percent) of each process on the GPU `uuid` since
/// `since_us` (unix µs; NVML keeps a few samples per process: their mean),
/// by host pid. `None` when NVML does not answer for that GPU.
pub fn process_util(nvml: &Nvml, uuid: &str, since_us: u64) -> Option<HashMap<u32, f64>> {
    let samples = nvml.utilization(uuid, since_us).ok()??;
    let mut sum: HashMap<u32, (f64, u32)> = HashMap::new();
    for s in samples.iter().filter(|s| s.time_us > since_us) {
        let e = sum.entry(s.pid).or_default();
        e.0 += f64::from(s.sm_percent);
        e.1 += 1;
    }
    Some(
        sum.into_iter()
            .map(|(p, (t, k))| (p, t / f64::from(k)))
            .collect(),
    )
}
