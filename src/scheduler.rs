//! Compute scheduling (SPEC §4): policies 0–5, weights, high priority.
//!
//! STATUS: interface fixed by the lead; the `sched` branch implements it.
//! - the launch hooks call [`admit_launch`] before every kernel launch
//!   (`cuLaunchKernel`, `cuLaunchKernelEx`, cooperative, `cuGraphLaunch`,
//!   `_ptsz` variants) and [`launched`] after the real launch returned;
//! - the tools read [`container_stats`] and [`limit_percent`].

use crate::ledger::{ContainerSlot, LedgerFile};
use cgpu_ffi::CUresult;

/// Opaque `CUstream` as the launch hooks see it.
pub type Stream = *mut std::ffi::c_void;

/// Called by every launch hook before calling the real driver. Returns
/// immediately when the container is within its share (an atomic or two);
/// otherwise blocks the calling thread until it may launch.
#[inline]
pub fn admit_launch(_stream: Stream) {}

/// Called by every launch hook after the real driver returned `_result`.
#[inline]
pub fn launched(_stream: Stream, _result: CUresult) {}

/// Per-container compute counters kept in the ledger.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ContainerSchedStats {
    /// GPU time charged to the container since it joined, ns.
    pub gpu_time_ns: u64,
    /// Time its threads spent held back in launch hooks, ns (summed over threads).
    pub throttled_ns: u64,
    /// Launches admitted.
    pub launches: u64,
}

/// Counters of one container slot.
pub fn container_stats(_slot: &ContainerSlot) -> ContainerSchedStats {
    ContainerSchedStats::default()
}

/// The compute limit, in percent of the GPU, that the GPU's policy and the
/// container's weight give container slot `container` right now.
pub fn limit_percent(_file: &LedgerFile, _container: usize) -> u32 {
    100
}
