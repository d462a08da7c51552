//! The simulated machine, from the environment (read at `cuInit`/`nvmlInit*`).
//! See `shim/README.md` for the variables.

use std::path::PathBuf;

/// One simulated GPU as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSpec {
    pub total_bytes: u64,
    pub name: String,
}

/// The driver version the sim answers by default: the newest whose
/// functions it implements (CUDA 13.5).
pub const DEFAULT_DRIVER_VERSION: i32 = 13050;

#[derive(Clone, Debug)]
pub struct Config {
    pub gpus: Vec<GpuSpec>,
    pub state_dir: PathBuf,
    pub ctx_bytes: u64,
    pub driver_version: i32,
    pub kernel_ns: u64,
    pub timeslice_ns: u64,
    pub trace: bool,
}

pub const DEFAULT_GPUS: &str = "15109:Tesla T4";
pub const MIB: u64 = 1 << 20;

fn warn(var: &str, val: &str, what: &str) {
    eprintln!("cgpu-sim: ignoring {var}={val:?}: {what}");
}

/// Parses `CGPU_SIM_GPUS` (`MiB[:name],...`).
pub fn parse_gpus(s: &str) -> Result<Vec<GpuSpec>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err("empty device entry".into());
        }
        let (mib, name) = match part.split_once(':') {
            Some((m, n)) => (m.trim(), n.trim().to_string()),
            None => (part, "Tesla T4".to_string()),
        };
        let mib: u64 = mib
            .parse()
            .map_err(|_| format!("{mib:?} is not a number of MiB"))?;
        if mib == 0 || mib > (1 << 24) {
            return Err(format!("{mib} MiB is out of range"));
        }
        if name.is_empty() || name.len() > 95 {
            return Err("device name must be 1..95 bytes".into());
        }
        out.push(GpuSpec {
            total_bytes: mib * MIB,
            name,
        });
    }
    if out.len() > crate::state::MAX_DEVICES {
        return Err(format!("at most {} devices", crate::state::MAX_DEVICES));
    }
    Ok(out)
}

fn env_num(var: &str, default: u64, max: u64) -> u64 {
    match std::env::var(var) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n <= max => n,
            _ => {
                warn(var, &v, "not a number in range; using the default");
                default
            }
        },
        Err(_) => default,
    }
}

impl Config {
    pub fn from_env() -> Config {
        let gpus = match std::env::var("CGPU_SIM_GPUS") {
            Ok(v) => parse_gpus(&v).unwrap_or_else(|e| {
                warn("CGPU_SIM_GPUS", &v, &format!("{e}; using {DEFAULT_GPUS:?}"));
                parse_gpus(DEFAULT_GPUS).unwrap_or_default()
            }),
            Err(_) => parse_gpus(DEFAULT_GPUS).unwrap_or_default(),
        };
        Config {
            gpus,
            state_dir: state_dir_from_env(),
            ctx_bytes: env_num("CGPU_SIM_CTX_MIB", 300, 1 << 20) * MIB,
            driver_version: env_num(
                "CGPU_SIM_DRIVER_VERSION",
                DEFAULT_DRIVER_VERSION as u64,
                99_999,
            ) as i32,
            kernel_ns: env_num("CGPU_SIM_KERNEL_NS", 5000, u64::MAX / 4),
            timeslice_ns: env_num("CGPU_SIM_TIMESLICE_US", 2000, 1_000_000).max(50) * 1000,
            trace: std::env::var("CGPU_SIM_TRACE").is_ok_and(|v| !v.is_empty() && v != "0"),
        }
    }
}

/// `CGPU_SIM_STATE`, default `/dev/shm/cgpu-sim-<uid>`.
pub fn state_dir_from_env() -> PathBuf {
    match std::env::var_os("CGPU_SIM_STATE") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => {
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            PathBuf::from(format!("/dev/shm/cgpu-sim-{uid}"))
        }
    }
}

/// Compute capability and SM count of a known GPU name (default: an A100-like part).
pub fn arch_of(name: &str) -> (i32, i32, i32) {
    let n = name.to_ascii_uppercase();
    let table: &[(&str, i32, i32, i32)] = &[
        ("T4", 7, 5, 40),
        ("V100", 7, 0, 80),
        ("A100", 8, 0, 108),
        ("A10", 8, 6, 72),
        ("A30", 8, 0, 56),
        ("L4", 8, 9, 58),
        ("L40", 8, 9, 142),
        ("H100", 9, 0, 132),
        ("H200", 9, 0, 132),
        ("B200", 10, 0, 148),
    ];
    for &(k, maj, min, sms) in table {
        if n.split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| w == k)
        {
            return (maj, min, sms);
        }
    }
    (8, 0, 108)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn gpus() {
        let g = parse_gpus("23028:NVIDIA A10, 100").unwrap();
        assert_eq!(g[0].total_bytes, 23028 * MIB);
        assert_eq!(g[0].name, "NVIDIA A10");
        assert_eq!(g[1].name, "Tesla T4");
        assert!(parse_gpus("x:y").is_err());
        assert!(parse_gpus("").is_err());
        assert_eq!(arch_of("NVIDIA A10"), (8, 6, 72));
        assert_eq!(arch_of("Tesla T4"), (7, 5, 40));
    }
}
