//! The knobs (cGPU's `/proc/cgpu_km` nodes): names, ranges,
//! reading and writing them in a ledger.
//!
//! A write is one atomic store into the header or the container slot,
//! followed by a bump of `knob_generation` (running jobs watch it). Writing
//! `policy` also sets `policy_explicit`, so that a container's weight > 1 no
//! longer switches the GPU to policy 2 (see `cgpu_ledger`).

use super::{container_live, cstr, GIB};
use cgpu_ledger::{free_weight, Ledger, LedgerFile};
use std::sync::atomic::Ordering::Acquire;

/// A knob (a cGPU `/proc/cgpu_km` node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    Policy,
    MaxInst,
    PrioRatio,
    DefaultMemsize,
    FreeWeight,
    Weight,
    Memsize,
    Highprio,
}

pub const ALL: [Knob; 8] = [
    Knob::Policy,
    Knob::MaxInst,
    Knob::PrioRatio,
    Knob::DefaultMemsize,
    Knob::FreeWeight,
    Knob::Weight,
    Knob::Memsize,
    Knob::Highprio,
];

impl Knob {
    pub fn parse(s: &str) -> Result<Knob, String> {
        ALL.iter().copied().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = ALL.iter().map(|k| k.name()).collect();
            format!("unknown knob `{s}` (knobs: {})", names.join(", "))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Knob::Policy => "policy",
            Knob::MaxInst => "max_inst",
            Knob::PrioRatio => "prio_ratio",
            Knob::DefaultMemsize => "default_memsize",
            Knob::FreeWeight => "free_weight",
            Knob::Weight => "weight",
            Knob::Memsize => "memsize",
            Knob::Highprio => "highprio",
        }
    }

    /// Per container (else per GPU).
    pub fn per_container(self) -> bool {
        matches!(self, Knob::Weight | Knob::Memsize | Knob::Highprio)
    }

    pub fn read_only(self) -> bool {
        self == Knob::FreeWeight
    }

    /// What `--help` says about the values.
    pub fn range_help(self) -> &'static str {
        match self {
            Knob::Policy => "0..5 (0 fair share, 1 preemptive, 2 weight-based, 3 fixed, 4 soft, 5 native)",
            Knob::MaxInst => "1..25, not below the sum of the live containers' weights",
            Knob::PrioRatio => "20..99 (percent)",
            Knob::DefaultMemsize => "GiB (plain number) or bytes with a suffix (B, K, M, G, KiB, MiB, GiB); 0 = pass-through",
            Knob::FreeWeight => "read-only",
            Knob::Weight => "1..max_inst, the sum over live containers at most max_inst",
            Knob::Memsize => "GiB (plain number) or bytes with a suffix (B, K, M, G, KiB, MiB, GiB); at least 1 byte",
            Knob::Highprio => "a boolean: 1, true, yes, on or 0, false, no, off",
        }
    }

    /// Parse a value as typed by an operator (for memory knobs: GiB, or
    /// bytes with a suffix). Range checks that depend on the ledger are in
    /// [`check`].
    pub fn parse_value(self, s: &str) -> Result<u64, String> {
        match self {
            Knob::DefaultMemsize | Knob::Memsize => parse_size(s),
            // The one boolean grammar of cgpu (as `ALIYUN_COM_GPU_HIGH_PRIO`).
            Knob::Highprio => cgpu_ledger::settings::parse_bool(s)
                .map(u64::from)
                .map_err(|e| format!("highprio: `{s}`: {e}")),
            _ => s
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("{}: `{s}` is not a whole number", self.name())),
        }
    }
}

/// `6` → 6 GiB; `512M`, `512MiB`, `1073741824B`, `4G`, `1.5G` → bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "g" | "gi" | "gib" | "gb" => GIB,
        "b" => 1,
        "k" | "ki" | "kib" | "kb" => 1 << 10,
        "m" | "mi" | "mib" | "mb" => 1 << 20,
        "t" | "ti" | "tib" | "tb" => 1 << 40,
        _ => {
            return Err(format!(
                "`{s}`: unknown unit `{unit}` (use B, K, M, G, T; a plain number is GiB)"
            ))
        }
    };
    if num.is_empty() {
        return Err(format!("`{s}` is not a size"));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("`{s}` is too large"));
    }
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && x * (mult as f64) < 1.8e19 => {
            Ok((x * mult as f64).round() as u64)
        }
        _ => Err(format!("`{s}` is not a size")),
    }
}

/// The id of live container slot `c`.
pub fn container_id(f: &LedgerFile, c: usize) -> Option<String> {
    let s = f.containers.get(c)?;
    if !container_live(s) {
        return None;
    }
    cstr(&s.id_bytes())
}

/// Live container slots whose id is `id` (or starts with it, if unique).
pub fn find_container(f: &LedgerFile, id: &str) -> Option<usize> {
    let live: Vec<(usize, String)> = (0..f.containers.len())
        .filter_map(|c| container_id(f, c).map(|s| (c, s)))
        .collect();
    if let Some((c, _)) = live.iter().find(|(_, s)| s == id) {
        return Some(*c);
    }
    let pre: Vec<_> = live.iter().filter(|(_, s)| s.starts_with(id)).collect();
    if pre.len() == 1 {
        Some(pre[0].0)
    } else {
        None
    }
}

/// Current value of a knob (`c`: container slot, for per-container knobs).
pub fn get(f: &LedgerFile, k: Knob, c: Option<usize>) -> u64 {
    let h = &f.header;
    match (k, c) {
        (Knob::Policy, _) => h.policy.load(Acquire).into(),
        (Knob::MaxInst, _) => h.max_inst.load(Acquire).into(),
        (Knob::PrioRatio, _) => h.prio_ratio.load(Acquire).into(),
        (Knob::DefaultMemsize, _) => h.default_memsize.load(Acquire),
        (Knob::FreeWeight, _) => free_weight(f).into(),
        (Knob::Weight, Some(c)) => f.containers[c].weight.load(Acquire).into(),
        (Knob::Memsize, Some(c)) => f.containers[c].quota.load(Acquire),
        (Knob::Highprio, Some(c)) => f.containers[c].highprio.load(Acquire).into(),
        (_, None) => 0,
    }
}

/// Sum of the weights of live containers other than `except`.
fn weights_except(f: &LedgerFile, except: Option<usize>) -> u64 {
    f.containers
        .iter()
        .enumerate()
        .filter(|(i, s)| Some(*i) != except && container_live(s))
        .map(|(_, s)| u64::from(s.weight.load(Acquire)))
        .sum()
}

/// Is `v` acceptable for knob `k` in this ledger? The error says why not.
pub fn check(f: &LedgerFile, k: Knob, c: Option<usize>, v: u64) -> Result<(), String> {
    let range = |lo: u64, hi: u64| -> Result<(), String> {
        if (lo..=hi).contains(&v) {
            Ok(())
        } else {
            Err(format!("{} {v} is out of range {lo}..{hi}", k.name()))
        }
    };
    let max_inst = u64::from(f.header.max_inst.load(Acquire));
    match k {
        Knob::FreeWeight => Err("free_weight is read-only (max_inst − Σ weights)".into()),
        Knob::Policy => range(0, 5),
        Knob::PrioRatio => range(20, 99),
        Knob::Highprio => range(0, 1),
        Knob::MaxInst => {
            range(1, 25)?;
            let used = weights_except(f, None);
            if v < used {
                return Err(format!(
                    "max_inst {v} is below the weights live containers hold ({used}): lower their weights first"
                ));
            }
            Ok(())
        }
        Knob::Weight => {
            range(1, max_inst).map_err(|e| format!("{e} (max_inst)"))?;
            let others = weights_except(f, c);
            if others + v > max_inst {
                return Err(format!(
                    "weight {v} would make the weights of live containers {} > max_inst {max_inst} (at most {} available)",
                    others + v,
                    max_inst.saturating_sub(others)
                ));
            }
            Ok(())
        }
        Knob::DefaultMemsize => {
            let phys = f.header.read_physical_total();
            if v > phys {
                return Err(format!(
                    "default_memsize {v} bytes is more than the GPU's {phys} bytes"
                ));
            }
            Ok(())
        }
        Knob::Memsize => {
            let phys = f.header.read_physical_total();
            if v == 0 {
                return Err("memsize must be at least 1 byte".into());
            }
            if v > phys {
                return Err(format!(
                    "memsize {v} bytes is more than the GPU's {phys} bytes"
                ));
            }
            Ok(())
        }
    }
}

/// Write a knob (after [`check`]) through the ledger's setters, which
/// bump `knob_generation`. Returns the previous value.
pub fn set(l: &Ledger, k: Knob, c: Option<usize>, v: u64) -> Result<u64, String> {
    let f = l.file();
    check(f, k, c, v)?;
    if k.per_container() && c.is_none() {
        return Err(format!(
            "{} is per container: give --container ID",
            k.name()
        ));
    }
    let prev = get(f, k, c);
    let v32 = u32::try_from(v).map_err(|_| format!("{} {v} is out of range", k.name()));
    match (k, c) {
        (Knob::Policy, _) => l.set_policy(v32?),
        (Knob::MaxInst, _) => l.set_max_inst(v32?),
        (Knob::PrioRatio, _) => l.set_prio_ratio(v32?),
        (Knob::DefaultMemsize, _) => l.set_default_memsize(v),
        (Knob::Weight, Some(c)) => l.set_weight(c, v32?),
        (Knob::Memsize, Some(c)) => l.set_memsize(c, v),
        (Knob::Highprio, Some(c)) => l.set_highprio(c, v != 0),
        _ => Err(format!("{} cannot be written", k.name())),
    }?;
    Ok(prev)
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::MIB;
    use super::*;

    #[test]
    fn highprio_takes_the_one_boolean_grammar() {
        for (v, b) in [
            ("1", 1),
            ("yes", 1),
            ("ON", 1),
            ("true", 1),
            ("0", 0),
            ("no", 0),
            ("off", 0),
        ] {
            assert_eq!(Knob::Highprio.parse_value(v), Ok(b), "{v}");
        }
        assert!(Knob::Highprio.parse_value("2").is_err());
    }

    #[test]
    fn set_through_ledger() {
        let d = std::env::temp_dir().join(format!("cgpu-knobs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let l = Ledger::open_or_create(&d, "GPU-k", 0, 16 * GIB).unwrap();
        let m = l
            .join(&cgpu_ledger::JoinRequest {
                container_id: "abc",
                key: 0,
                quota: GIB,
                weight: 1,
                highprio: false,
                enforce_off: false,
            })
            .unwrap();
        let f = l.file();
        let g0 = f.header.knob_generation.load(Acquire);
        let before = get(f, Knob::Policy, None);
        assert_eq!(set(&l, Knob::Policy, None, 3).unwrap(), before);
        assert_eq!(get(f, Knob::Policy, None), 3);
        assert_eq!(f.header.policy_explicit.load(Acquire), 1);
        assert_eq!(set(&l, Knob::Weight, Some(m.container), 5).unwrap(), 1);
        assert_eq!(get(f, Knob::Weight, Some(m.container)), 5);
        set(&l, Knob::Memsize, Some(m.container), 512 * MIB).unwrap();
        assert_eq!(get(f, Knob::Memsize, Some(m.container)), 512 * MIB);
        set(&l, Knob::Highprio, Some(m.container), 1).unwrap();
        set(&l, Knob::DefaultMemsize, None, 2 * GIB).unwrap();
        set(&l, Knob::PrioRatio, None, 50).unwrap();
        set(&l, Knob::MaxInst, None, 10).unwrap();
        assert_eq!(f.header.knob_generation.load(Acquire), g0 + 7);
        assert!(set(&l, Knob::Weight, Some(m.container), 11).is_err());
        assert!(set(&l, Knob::Weight, None, 1).is_err());
        assert_eq!(
            f.header.knob_generation.load(Acquire),
            g0 + 7,
            "refused: no write"
        );
        l.leave(m);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("6").unwrap(), 6 * GIB);
        assert_eq!(parse_size("512M").unwrap(), 512 * MIB);
        assert_eq!(parse_size("512MiB").unwrap(), 512 * MIB);
        assert_eq!(parse_size("1073741824B").unwrap(), GIB);
        assert_eq!(parse_size("1.5G").unwrap(), GIB + GIB / 2);
        assert!(parse_size("x").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("99999999999999999999").is_err());
    }

    #[test]
    fn ranges_and_writes() {
        let mut f = fake_file(0, "GPU-a", 16 * GIB);
        add_container(&mut f, 0, "aaa", GIB, 0, 2);
        add_container(&mut f, 1, "bbb", GIB, 0, 3);
        assert!(check(&f, Knob::Policy, None, 6).is_err());
        assert!(check(&f, Knob::PrioRatio, None, 19).is_err());
        assert!(check(&f, Knob::PrioRatio, None, 100).is_err());
        assert!(check(&f, Knob::MaxInst, None, 26).is_err());
        assert!(check(&f, Knob::MaxInst, None, 4)
            .unwrap_err()
            .contains("below"));
        assert!(check(&f, Knob::Weight, Some(0), 0).is_err());
        assert!(check(&f, Knob::Weight, Some(0), 14)
            .unwrap_err()
            .contains("max_inst"));
        assert!(check(&f, Knob::Weight, Some(0), 13).is_ok());
        assert!(check(&f, Knob::Memsize, Some(0), 0).is_err());
        assert!(check(&f, Knob::Memsize, Some(0), 17 * GIB).is_err());
        assert!(check(&f, Knob::FreeWeight, None, 1).is_err());
        assert_eq!(get(&f, Knob::Weight, Some(1)), 3);
        assert_eq!(get(&f, Knob::FreeWeight, None), 11);
        assert_eq!(find_container(&f, "bb"), Some(1));
        assert_eq!(find_container(&f, "zz"), None);
    }
}
