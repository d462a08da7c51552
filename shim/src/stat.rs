//! Reading a state directory from outside (the `cgpu-sim-stat` tool and
//! tests): a JSON snapshot with a stable schema, documented in
//! `shim/README.md`.

use crate::state::{Shared, MAX_DEVICES, SLOT_ALIVE, SLOT_FREE};
use std::path::Path;
use std::sync::atomic::Ordering::*;

pub use crate::stat_schema::*;

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
