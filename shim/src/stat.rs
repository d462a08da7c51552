//! Reading a state directory from outside (the `cgpu-sim-stat` tool and
//! tests): a JSON snapshot with a stable schema, documented in
//! `shim/README.md`.

use crate::state::{Shared, MAX_DEVICES, SLOT_ALIVE, SLOT_FREE};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::Ordering::*;

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DeviceStat {
    pub index: usize,
    pub uuid: String,
    pub name: String,
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub busy_ns: u64,
    pub kernels: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ProcessStat {
    pub pid: u32,
    pub slot: usize,
    pub comm: String,
    pub alive: bool,
    pub device: usize,
    pub mem_bytes: u64,
    pub device_time_ns: u64,
    pub kernels: u64,
}

/// Calls to a function the sim only stubs (see `stubs.rs`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StubStat {
    pub name: String,
    pub calls: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub schema: u32,
    pub state_dir: String,
    pub devices: Vec<DeviceStat>,
    pub processes: Vec<ProcessStat>,
    /// Every stub called at least once, by name (all processes together).
    #[serde(default)]
    pub stubs: Vec<StubStat>,
}

/// Reads the state in `dir` (reaping dead processes first). Fails if the
/// directory holds no state.
pub fn snapshot(dir: &Path) -> std::io::Result<Snapshot> {
    if !dir.join("state").exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no simulated GPU state in {}", dir.display()),
        ));
    }
    let sh = Shared::open(dir, None)?;
    sh.reap(None);
    let devices = (0..sh.ndev())
        .map(|d| DeviceStat {
            index: d,
            uuid: sh.dev_uuid(d),
            name: sh.dev_name(d),
            total_bytes: sh.dev(d).total_bytes,
            used_bytes: sh.used(d),
            busy_ns: sh.dev(d).busy_ns.load(Acquire),
            kernels: sh.dev(d).kernels.load(Acquire),
        })
        .collect();
    let mut processes = Vec::new();
    for s in 0..sh.nslots() {
        let r = sh.slot(s);
        let st = r.state.load(Acquire);
        if st == SLOT_FREE {
            continue;
        }
        let mask = r.dev_mask.load(Acquire);
        for d in 0..sh.ndev().min(MAX_DEVICES) {
            let (mem, t, k) = (
                r.mem[d].load(Acquire),
                r.time_ns[d].load(Acquire),
                r.kernels[d].load(Acquire),
            );
            if mask & (1 << d) == 0 && mem == 0 && t == 0 && k == 0 {
                continue;
            }
            processes.push(ProcessStat {
                pid: r.pid.load(Relaxed),
                slot: s,
                comm: sh.slot_comm(s),
                alive: st == SLOT_ALIVE,
                device: d,
                mem_bytes: mem,
                device_time_ns: t,
                kernels: k,
            });
        }
    }
    let stubs = crate::stubs::counts(&sh)
        .into_iter()
        .map(|(name, calls)| StubStat { name, calls })
        .collect();
    Ok(Snapshot {
        schema: SCHEMA_VERSION,
        state_dir: dir.display().to_string(),
        devices,
        processes,
        stubs,
    })
}

/// Creates `libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1`, `libnvidia-ml.so`
/// in `dir`, all symlinks to `lib`.
pub fn install_dir(dir: &Path, lib: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let lib = lib.canonicalize()?;
    for name in [
        "libcuda.so.1",
        "libcuda.so",
        "libnvidia-ml.so.1",
        "libnvidia-ml.so",
    ] {
        let p = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&lib, &tmp)?;
        std::fs::rename(&tmp, &p)?;
    }
    Ok(())
}
