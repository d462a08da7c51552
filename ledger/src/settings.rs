//! The container's settings as the variables and files give them: one
//! grammar for the library, the tools and the agent.
//!
//! Every parser here is a pure function of the variable's value, with unit
//! tests for the test vectors (T4, V100, A10 with `ALIYUN_COM_GPU_MEM_DEV`).
//! A bad value fails closed: the container asked for isolation and cgpu
//! cannot tell what it asked for, so no GPU is visible to it (no GPU memory
//! at all) until the value is fixed, and the error says which value and
//! why. It never turns isolation off.
//!
//! Booleans have one grammar everywhere (`CGPU_DISABLE`,
//! `ALIYUN_COM_GPU_HIGH_PRIO`, the allocation file): `1`, `true`, `yes`,
//! `on` and `0`, `false`, `no`, `off`, in any case; empty is the same as
//! unset.

use std::ffi::CString;

/// One GiB.
pub const GIB: u64 = 1 << 30;
/// One MiB.
pub const MIB: u64 = 1 << 20;
/// Highest compute weight a container may ask for (cGPU's `max_inst` ≤ 25).
pub const MAX_WEIGHT: u32 = 25;
/// Longest container id the ledger stores (its slot holds 64 bytes, NUL-padded).
pub const MAX_CONTAINER_ID: usize = 63;

/// What the library does with memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No isolation: every call passes through unchanged (no quota set).
    PassThrough,
    /// Quotas enforced.
    Enforce,
    /// `CGPU_DISABLE=true`: physical view, usage recorded in the ledger only.
    Record,
}

/// A GPU named in `ALIYUN_COM_GPU_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSel {
    /// Host index (as the driver numbers the GPUs).
    Index(u32),
    /// `GPU-…` UUID, compared case-insensitively.
    Uuid(String),
}

/// The parsed environment.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    /// `ALIYUN_COM_GPU_MEM_CONTAINER`: GiB per visible GPU; the last value
    /// repeats; 0 = that GPU is not limited. Empty when unset.
    pub mem_container: Vec<u64>,
    /// `ALIYUN_COM_GPU_MEM_DEV`: the GPU's total in whole GiB as the operator counts it.
    pub mem_dev: Option<u64>,
    /// `CGPU_MEM_CONTAINER_MIB` (only from the host's allocation or
    /// settings file): MiB per visible GPU, the last value repeating, 0 =
    /// not limited. When given, each GPU's quota is exactly this many MiB
    /// (never scaled by `ALIYUN_COM_GPU_MEM_DEV`), and
    /// `ALIYUN_COM_GPU_MEM_CONTAINER` must give the same quotas rounded up
    /// to whole GiB.
    pub mem_container_mib: Option<Vec<u64>>,
    /// `ALIYUN_COM_GPU_VISIBLE_DEVICES`; `None` = all GPUs visible.
    pub visible: Option<Vec<DeviceSel>>,
    /// `ALIYUN_COM_GPU_SCHD_WEIGHT`; `None` when unset (the ledger's default applies).
    pub weight: Option<u32>,
    /// `ALIYUN_COM_GPU_HIGH_PRIO`.
    pub high_prio: bool,
    /// Name of this container (`CGPU_CONTAINER_ID`, cgroup, hostname).
    pub container_id: String,
    /// `CGPU_CONTAINER_ID` as given (environment or allocation file): the
    /// name the container is shown by. It never decides which container a
    /// process is in, except outside containers (`crate::identity`).
    pub container_name: Option<String>,
    /// `CGPU_REAL_LIBCUDA`, else `libcuda.so.1`.
    pub real_libcuda: CString,
    /// `CGPU_REAL_LIBNVML`, else `libnvidia-ml.so.1`.
    pub real_libnvml: CString,
    /// One line per bad value (already logged).
    pub errors: Vec<String>,
    /// Environment values overridden by the host's allocation file (logged
    /// as warnings).
    pub ignored: Vec<String>,
}

impl Config {
    /// True when memory is tracked through the ledger (enforced or recorded).
    pub fn isolating(&self) -> bool {
        self.mode != Mode::PassThrough
    }

    /// No `ALIYUN_COM_GPU_MEM_CONTAINER` at all (and no bad value): the
    /// ledger's `default_memsize` may apply.
    pub fn unset(&self) -> bool {
        self.errors.is_empty() && self.mem_container.is_empty()
    }

    /// The container's GiB for the GPU at container-visible index `i`
    /// (the last list value repeats); 0 = not limited.
    pub fn container_gib(&self, i: usize) -> u64 {
        container_gib(&self.mem_container, i)
    }

    /// Visible total (quota) in bytes for GPU `i` whose physical total is
    /// `physical`; `None` = not limited (the physical view).
    pub fn quota_bytes(&self, i: usize, physical: u64) -> Option<u64> {
        if self.mode == Mode::PassThrough {
            return None;
        }
        if let Some(mib) = &self.mem_container_mib {
            return match container_gib(mib, i) {
                0 => None,
                m => Some(m.saturating_mul(MIB)),
            };
        }
        match self.container_gib(i) {
            0 => None,
            gib => Some(visible_total(physical, gib, self.mem_dev)),
        }
    }
}

impl Config {
    /// Values that cannot be what the operator meant for GPU `i` with
    /// `physical` bytes, each a readable line naming the value and what is
    /// done with it (the caller logs them as warnings): a quota larger than
    /// the GPU, an `ALIYUN_COM_GPU_MEM_DEV` larger than its memory.
    pub fn implausible(&self, i: usize, physical: u64) -> Vec<String> {
        let mut out = Vec::new();
        if self.mode == Mode::PassThrough || physical == 0 {
            return out;
        }
        let gpu_gib = physical as f64 / GIB as f64;
        if let Some(dev) = self.mem_dev {
            if dev as f64 > gpu_gib.ceil() {
                out.push(format!(
                    "ALIYUN_COM_GPU_MEM_DEV={dev} is more than GPU {i}'s memory ({gpu_gib:.2} GiB): quotas are scaled by it as given, so each container sees less than it asked"
                ));
            }
        }
        if let Some(q) = self.quota_bytes(i, physical) {
            if q > physical {
                out.push(format!(
                    "ALIYUN_COM_GPU_MEM_CONTAINER gives GPU {i} a quota of {:.2} GiB, more than the GPU's {gpu_gib:.2} GiB: the container is shown the GPU's own size, and the GPU itself is the limit",
                    q as f64 / GIB as f64
                ));
            }
        }
        out
    }
}

/// The value for GPU `i` from a `CONTAINER` list (the last value repeats).
pub fn container_gib(list: &[u64], i: usize) -> u64 {
    match list.get(i) {
        Some(v) => *v,
        None => list.last().copied().unwrap_or(0),
    }
}

/// `floor(physical * container / dev)` with `ALIYUN_COM_GPU_MEM_DEV`,
/// else `container` GiB exactly.
pub fn visible_total(physical_bytes: u64, container_gib: u64, dev_gib: Option<u64>) -> u64 {
    match dev_gib {
        Some(dev) if dev > 0 => {
            let v = (physical_bytes as u128) * (container_gib as u128) / (dev as u128);
            v.min(u64::MAX as u128) as u64
        }
        _ => container_gib.saturating_mul(GIB),
    }
}

/// Why `p` is not a whole number of GiB, with what to write instead when
/// that can be guessed (`4GiB`, `4G`, `2.0`, `4096MiB`).
fn not_gib(p: &str) -> String {
    let low = p.to_ascii_lowercase();
    let digits: String = low.chars().take_while(|c| c.is_ascii_digit()).collect();
    let unit = low[digits.len()..].trim();
    let hint = match (digits.parse::<u64>(), unit) {
        (Ok(n), "gib" | "gb" | "g" | "gi") => format!(": write {n} (the unit is always GiB)"),
        (Ok(n), "mib" | "mb" | "m" | "mi") if n % 1024 == 0 && n > 0 => {
            format!(": write {} (whole GiB)", n / 1024)
        }
        (Ok(_), "mib" | "mb" | "m" | "mi") => ": quotas are whole GiB".to_string(),
        (Ok(n), u) if u.starts_with('.') && u[1..].chars().all(|c| c == '0') => {
            format!(": write {n}")
        }
        _ => String::new(),
    };
    format!("'{p}' is not a whole number of GiB{hint}")
}

/// Parse `ALIYUN_COM_GPU_MEM_CONTAINER`: comma-separated whole GiB. Empty is
/// an error (not "no limit": unset the variable for that).
pub fn parse_mem_container(v: &str) -> Result<Vec<u64>, String> {
    let v = v.trim();
    if v.is_empty() {
        return Err(
            "empty: give whole GiB per GPU (e.g. 4, or 4,2), 0 for a GPU without a limit; unset the variable for no limit at all"
                .into(),
        );
    }
    v.split(',')
        .map(|p| {
            let p = p.trim();
            p.parse::<u64>()
                .ok()
                .filter(|g| *g <= 1 << 20)
                .ok_or_else(|| not_gib(p))
        })
        .collect()
}

/// Parse `ALIYUN_COM_GPU_MEM_DEV`: a whole number of GiB ≥ 1.
pub fn parse_mem_dev(v: &str) -> Result<u64, String> {
    match v.trim().parse::<u64>() {
        Ok(g) if (1..=1 << 20).contains(&g) => Ok(g),
        _ => Err(format!(
            "expected the GPU's total as a whole number of GiB (≥ 1){}",
            not_gib(v.trim())
                .split_once(": ")
                .map(|(_, h)| format!("; {h}"))
                .unwrap_or_default()
        )),
    }
}

/// Parse a boolean, the one grammar of every cgpu boolean: `1`/`true`/`yes`/
/// `on` and `0`/`false`/`no`/`off`, any case; empty = false (as unset).
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" | "" => Ok(false),
        _ => Err("expected a boolean: 1, true, yes, on or 0, false, no, off".into()),
    }
}

/// Parse `ALIYUN_COM_GPU_HIGH_PRIO` (a boolean, see [`parse_bool`]).
pub fn parse_high_prio(v: &str) -> Result<bool, String> {
    parse_bool(v)
}

/// Parse `ALIYUN_COM_GPU_SCHD_WEIGHT`: integer `1..=25`.
pub fn parse_weight(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(w) if (1..=MAX_WEIGHT).contains(&w) => Ok(w),
        _ => Err(format!("expected an integer weight 1..={MAX_WEIGHT}")),
    }
}

/// Parse `ALIYUN_COM_GPU_VISIBLE_DEVICES`: indices and/or `GPU-…` UUIDs.
pub fn parse_visible(v: &str) -> Result<Option<Vec<DeviceSel>>, String> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let mut out: Vec<DeviceSel> = Vec::new();
    for p in v.split(',') {
        let p = p.trim();
        let sel = if let Ok(i) = p.parse::<u32>() {
            DeviceSel::Index(i)
        } else if is_uuid(p) {
            DeviceSel::Uuid(p.to_ascii_lowercase())
        } else {
            return Err(format!("'{p}' is neither a GPU index nor a GPU-… UUID"));
        };
        if out.contains(&sel) {
            return Err(format!("'{p}' is listed twice"));
        }
        out.push(sel);
    }
    Ok(Some(out))
}

fn is_uuid(p: &str) -> bool {
    let rest = match p.get(..4) {
        Some(pre) if pre.eq_ignore_ascii_case("GPU-") || pre.eq_ignore_ascii_case("MIG-") => {
            &p[4..]
        }
        _ => return false,
    };
    !rest.is_empty() && rest.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// Validate `CGPU_CONTAINER_ID`.
pub fn parse_container_id(v: &str) -> Result<String, String> {
    let v = v.trim();
    if v.is_empty() || v.len() > MAX_CONTAINER_ID || v.chars().any(|c| c.is_control()) {
        return Err(format!("expected 1..={MAX_CONTAINER_ID} printable bytes"));
    }
    Ok(v.to_string())
}

/// The container id in a `/proc/self/cgroup` text: the first run of 64 hex
/// digits in a path (docker, containerd, cri-o), its first 12 digits.
pub fn container_id_from_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        let b = path.as_bytes();
        let mut run = 0usize;
        for (i, c) in b.iter().enumerate() {
            if c.is_ascii_hexdigit() {
                run += 1;
                if run == 64 {
                    let after = b.get(i + 1);
                    if after.is_none_or(|c| !c.is_ascii_hexdigit()) {
                        let start = i + 1 - 64;
                        return Some(path[start..start + 12].to_ascii_lowercase());
                    }
                }
            } else {
                run = 0;
            }
        }
    }
    None
}

fn hostname() -> String {
    crate::identity::hostname()
        .chars()
        .take(MAX_CONTAINER_ID)
        .collect()
}

/// When a variable's value counts as not given.
#[derive(Clone, Copy)]
enum Unset {
    /// Only when the variable is absent (an empty value is parsed).
    Absent,
    /// Absent or empty.
    Empty,
    /// Absent, empty or only white space.
    Blank,
}

/// The variables of one configuration and the errors their values make.
struct Vars<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
    errors: &'a mut Vec<String>,
}

impl Vars<'_> {
    /// Variable `name` through `parse`: `None` when not given (`unset`); a
    /// malformed value is one more error (`NAME='value': why`) and `None`,
    /// and any error fails the whole configuration closed.
    fn parse<T>(
        &mut self,
        name: &str,
        unset: Unset,
        parse: fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        let v = (self.get)(name)?;
        let skip = match unset {
            Unset::Absent => false,
            Unset::Empty => v.is_empty(),
            Unset::Blank => v.trim().is_empty(),
        };
        if skip {
            return None;
        }
        parse(&v)
            .map_err(|why| self.errors.push(format!("{name}='{v}': {why}")))
            .ok()
    }
}

/// Parse a whole environment given as a lookup function (testable).
pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>, cgroup: Option<&str>) -> Config {
    let mut errors = Vec::new();
    let mut var = Vars {
        get,
        errors: &mut errors,
    };
    let mem_container = var
        .parse(
            "ALIYUN_COM_GPU_MEM_CONTAINER",
            Unset::Absent,
            parse_mem_container,
        )
        .unwrap_or_default();
    let mem_dev = var.parse("ALIYUN_COM_GPU_MEM_DEV", Unset::Blank, parse_mem_dev);
    let disable = var.parse("CGPU_DISABLE", Unset::Absent, parse_bool) == Some(true);
    let mut visible = var
        .parse(
            "ALIYUN_COM_GPU_VISIBLE_DEVICES",
            Unset::Absent,
            parse_visible,
        )
        .flatten();
    let weight = var.parse("ALIYUN_COM_GPU_SCHD_WEIGHT", Unset::Blank, parse_weight);
    let high_prio =
        var.parse("ALIYUN_COM_GPU_HIGH_PRIO", Unset::Absent, parse_high_prio) == Some(true);
    let container_id = var.parse("CGPU_CONTAINER_ID", Unset::Empty, parse_container_id);
    let mut bad = |name: &str, value: &str, why: String| {
        errors.push(format!("{name}='{value}': {why}"));
    };
    let container_name = container_id.clone();
    let container_id = container_id
        .or_else(|| cgroup.and_then(container_id_from_cgroup))
        .unwrap_or_else(hostname);
    let lib = |name: &str, default: &str, errors_ok: &mut bool| -> CString {
        match get(name).filter(|v| !v.is_empty()) {
            Some(v) => CString::new(v).unwrap_or_else(|_| {
                *errors_ok = false;
                CString::new(default).unwrap_or_default()
            }),
            None => CString::new(default).unwrap_or_default(),
        }
    };
    let (mut ok_cuda, mut ok_nvml) = (true, true);
    let real_libcuda = lib("CGPU_REAL_LIBCUDA", "libcuda.so.1", &mut ok_cuda);
    let real_libnvml = lib("CGPU_REAL_LIBNVML", "libnvidia-ml.so.1", &mut ok_nvml);
    if !ok_cuda {
        bad("CGPU_REAL_LIBCUDA", "…", "contains a NUL byte".into());
    }
    if !ok_nvml {
        bad("CGPU_REAL_LIBNVML", "…", "contains a NUL byte".into());
    }

    let any_limit = mem_container.iter().any(|&g| g > 0);
    let mode = if !errors.is_empty() {
        // A bad value anywhere: the container asked for isolation and we
        // cannot tell what it asked; it gets no GPU (nothing visible, so
        // no memory at all) rather than the whole GPU.
        visible = Some(Vec::new());
        Mode::Enforce
    } else if !any_limit {
        Mode::PassThrough
    } else if disable {
        Mode::Record
    } else {
        Mode::Enforce
    };
    Config {
        mode,
        mem_container,
        mem_dev,
        mem_container_mib: None,
        visible,
        weight,
        high_prio,
        container_id,
        container_name,
        real_libcuda,
        real_libnvml,
        errors,
        ignored: Vec::new(),
    }
}

/// `CGPU_ALLOC_FILE`: the values the cluster's device plugin decides only
/// after the kubelet's `Allocate` (at `PreStartContainer`), in a read-only
/// file of `KEY=VALUE` lines. Its keys, all required but `CGPU_DISABLE`:
pub const ALLOC_FILE_KEYS: [&str; 8] = [
    "CGPU_CONTAINER_ID",
    "ALIYUN_COM_GPU_MEM_CONTAINER",
    "ALIYUN_COM_GPU_MEM_DEV",
    "ALIYUN_COM_GPU_VISIBLE_DEVICES",
    "CGPU_DISABLE",
    "ALIYUN_COM_GPU_SCHD_WEIGHT",
    "ALIYUN_COM_GPU_HIGH_PRIO",
    MEM_CONTAINER_MIB,
];

/// The quota per GPU in MiB, exact (a node of the cluster that counts GPU
/// memory in MiB). Accepted only from the host's allocation file or
/// settings file, never from a process's environment: see
/// [`Config::mem_container_mib`].
pub const MEM_CONTAINER_MIB: &str = "CGPU_MEM_CONTAINER_MIB";

/// Parse `CGPU_MEM_CONTAINER_MIB`: comma-separated whole MiB (0 = that GPU
/// is not limited).
pub fn parse_mem_container_mib(v: &str) -> Result<Vec<u64>, String> {
    let v = v.trim();
    if v.is_empty() {
        return Err("empty: give whole MiB per GPU (e.g. 4096, or 4096,2048)".into());
    }
    v.split(',')
        .map(|p| {
            let p = p.trim();
            p.parse::<u64>()
                .ok()
                .filter(|m| *m <= 1 << 30)
                .ok_or_else(|| format!("'{p}' is not a whole number of MiB"))
        })
        .collect()
}

/// Applies the file's `CGPU_MEM_CONTAINER_MIB` (if any) to `c`: parsed,
/// and checked against `ALIYUN_COM_GPU_MEM_CONTAINER` (the same quotas
/// rounded up to whole GiB, GPU by GPU); a bad value is one more error of
/// `c`, as any other.
fn apply_mem_container_mib(c: &mut Config, value: Option<String>) {
    let mut var = Vars {
        get: &|_| value.clone(),
        errors: &mut c.errors,
    };
    let Some(mib) = var.parse(MEM_CONTAINER_MIB, Unset::Absent, parse_mem_container_mib) else {
        return;
    };
    let v = value.unwrap_or_default();
    if !c.errors.is_empty() {
        return;
    }
    let n = mib.len().max(c.mem_container.len());
    if let Some(i) = (0..n)
        .find(|&i| container_gib(&mib, i).div_ceil(1024) != container_gib(&c.mem_container, i))
    {
        c.errors.push(format!(
            "{MEM_CONTAINER_MIB}='{v}': GPU {i}'s {} MiB do not match ALIYUN_COM_GPU_MEM_CONTAINER's {} GiB (the same quota rounded up to whole GiB)",
            container_gib(&mib, i),
            container_gib(&c.mem_container, i)
        ));
        return;
    }
    c.mem_container_mib = Some(mib);
}

/// Settings a process's environment gives that only the host's files may
/// give (`KEY=VALUE` each): ignored, and said so.
pub fn file_only_settings_in_env(env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    env(MEM_CONTAINER_MIB)
        .map(|v| {
            format!(
                "{MEM_CONTAINER_MIB}='{v}' in the environment is ignored: only the host's allocation file or settings file may give it"
            )
        })
        .into_iter()
        .collect()
}

/// Largest settings file read: the allocation file, `/etc/cgpu/alloc.env`,
/// a host's per-container settings (a real one is a few hundred bytes).
pub const SETTINGS_FILE_MAX: u64 = 64 * 1024;

/// Read one of the settings files (the allocation file, the host's
/// per-container settings): a regular file (a FIFO, a device such as
/// `/dev/zero`, a directory are refused without reading: none can block
/// or grow without bound) of at most [`SETTINGS_FILE_MAX`] bytes, in UTF-8.
/// Symbolic links are followed (Kubernetes mounts files through them).
pub fn read_settings_file(path: &str) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| e.to_string())?;
    let m = f.metadata().map_err(|e| e.to_string())?;
    let t = m.file_type();
    if !t.is_file() {
        let what = if t.is_fifo() {
            "a FIFO"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else if t.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(format!("{what}, not a regular file: not read"));
    }
    if m.len() > SETTINGS_FILE_MAX {
        return Err(format!(
            "{} bytes, more than a settings file can be ({SETTINGS_FILE_MAX}): not read",
            m.len()
        ));
    }
    let mut buf = Vec::new();
    f.take(SETTINGS_FILE_MAX + 1)
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())?;
    if buf.len() as u64 > SETTINGS_FILE_MAX {
        return Err(format!(
            "longer than a settings file can be ({SETTINGS_FILE_MAX} bytes): not read"
        ));
    }
    String::from_utf8(buf).map_err(|_| "not UTF-8 text".to_string())
}

/// Parses `KEY=VALUE` lines whose keys are among `keys` (blank lines and
/// `#` comments allowed; an unknown or repeated key, or a missing one of
/// `required`, is an error): the allocation file and the host's settings
/// files.
fn parse_key_file(
    text: &str,
    keys: &[&str],
    required: &[&str],
) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("line {}: expected KEY=VALUE", n + 1));
        };
        let k = k.trim();
        if !keys.contains(&k) {
            return Err(format!("line {}: unknown key {k}", n + 1));
        }
        if out.iter().any(|(have, _)| have == k) {
            return Err(format!("line {}: {k} given twice", n + 1));
        }
        out.push((k.to_string(), v.trim().to_string()));
    }
    for k in required {
        if !out.iter().any(|(have, _)| have == k) {
            return Err(format!("{k} is missing"));
        }
    }
    Ok(out)
}

/// The value of key `k` among a file's `KEY=VALUE` pairs.
fn value_of<'a>(vals: &'a [(String, String)], k: &str) -> Option<&'a str> {
    vals.iter()
        .find(|(have, _)| have == k)
        .map(|(_, v)| v.as_str())
}

/// The configuration of a container whose host-given settings cannot be
/// used: isolation on and no GPU visible (so no GPU memory at all), the
/// cause said by the caller's message rather than in `errors`.
fn no_gpu(get: &dyn Fn(&str) -> Option<String>, cgroup: Option<&str>) -> Config {
    let mut c = from_lookup(get, cgroup);
    c.mode = Mode::Enforce;
    c.visible = Some(Vec::new());
    c.errors.clear();
    c
}

/// Parses an allocation file: the keys of [`ALLOC_FILE_KEYS`], the first
/// four required.
pub fn parse_alloc_file(text: &str) -> Result<Vec<(String, String)>, String> {
    parse_key_file(text, &ALLOC_FILE_KEYS, &ALLOC_FILE_KEYS[..4])
}

/// The configuration when `CGPU_ALLOC_FILE` is set: `file` is its text (or
/// why it could not be read). The file is the host's word: its settings
/// (every key of [`ALLOC_FILE_KEYS`]) come from it alone, and the
/// container's own environment cannot override them (a key the file does
/// not carry takes its default, never the environment's value; an
/// environment value that differs is named in [`Config::ignored`]). A
/// missing or invalid file (or values that do not parse) leaves the
/// container no GPU at all (no device visible), never the whole GPU.
/// Returns the configuration and, on failure, the message to log.
pub fn with_alloc_file(
    get: &dyn Fn(&str) -> Option<String>,
    cgroup: Option<&str>,
    path: &str,
    file: Result<String, String>,
) -> (Config, Option<String>) {
    let parsed = file.and_then(|t| parse_alloc_file(&t));
    let failure = match parsed {
        Ok(vals) => {
            let from_file = |k: &str| value_of(&vals, k).map(str::to_string);
            let merged = |k: &str| {
                if ALLOC_FILE_KEYS.contains(&k) {
                    from_file(k)
                } else {
                    get(k)
                }
            };
            let mut c = from_lookup(&merged, cgroup);
            apply_mem_container_mib(&mut c, from_file(MEM_CONTAINER_MIB));
            if c.errors.is_empty() && c.mode != Mode::PassThrough {
                for k in ALLOC_FILE_KEYS {
                    if let Some(v) = get(k) {
                        if from_file(k).as_deref() != Some(v.as_str()) {
                            c.ignored.push(format!(
                                "{k}='{v}' in the environment is ignored: the host's allocation file {path} decides ({})",
                                from_file(k).map_or("not set there: the default".to_string(), |f| format!("'{f}'"))
                            ));
                        }
                    }
                }
                return (c, None);
            }
            if c.errors.is_empty() {
                "it grants no GPU memory".to_string()
            } else {
                c.errors.join("; ")
            }
        }
        Err(e) => e,
    };
    let c = no_gpu(get, cgroup);
    let msg = format!(
        "cgpu: CGPU_ALLOC_FILE='{path}': {failure}: this container's GPU allocation is missing or \
         invalid, so no GPU is visible to it (ask the cluster's operator: cgpu-device-plugin logs say why)"
    );
    (c, Some(msg))
}

/// Where the cluster's device plugin mounts the allocation file in a
/// container: read when `CGPU_ALLOC_FILE` is unset and a regular file is
/// there, so that processes that lost their environment (`ssh`, `su -`,
/// cron) get the container's allocation too.
pub const DEFAULT_ALLOC_FILE: &str = "/etc/cgpu/alloc.env";

/// The directory of per-container settings an operator writes on the host
/// (`cgpuctl settings`) and mounts read-only into containers at this
/// path: `<dir>/<container id>.env` (64 hex digits, as the runtime names
/// the container). `CGPU_SETTINGS_DIR` names another directory.
pub const DEFAULT_SETTINGS_DIR: &str = "/etc/cgpu/containers";

/// Keys of a host-written settings file (`KEY=VALUE` lines, as the
/// allocation file); `ALIYUN_COM_GPU_MEM_CONTAINER` is required.
pub const SETTINGS_FILE_KEYS: [&str; 8] = [
    "ALIYUN_COM_GPU_MEM_CONTAINER",
    "ALIYUN_COM_GPU_MEM_DEV",
    "ALIYUN_COM_GPU_VISIBLE_DEVICES",
    "ALIYUN_COM_GPU_SCHD_WEIGHT",
    "ALIYUN_COM_GPU_HIGH_PRIO",
    "CGPU_DISABLE",
    "CGPU_CONTAINER_ID",
    MEM_CONTAINER_MIB,
];

/// Parses a host-written settings file: the keys of
/// [`SETTINGS_FILE_KEYS`], `ALIYUN_COM_GPU_MEM_CONTAINER` required.
pub fn parse_settings_file(text: &str) -> Result<Vec<(String, String)>, String> {
    parse_key_file(text, &SETTINGS_FILE_KEYS, &SETTINGS_FILE_KEYS[..1])
}

/// The configuration when the host wrote settings for this container
/// (`file`: its text, or why it could not be read). The settings are the
/// file's alone: the process's environment can neither override them nor
/// add one the host did not set (`CGPU_DISABLE`, a weight); only the name
/// (`CGPU_CONTAINER_ID`) and the paths to the real driver may come from the
/// environment when the file does not give them. A file that
/// cannot be read or parsed leaves the container no GPU (as a broken
/// allocation file does), never the whole GPU. Returns the configuration
/// and, on failure, the message to log.
pub fn with_settings_file(
    get: &dyn Fn(&str) -> Option<String>,
    cgroup: Option<&str>,
    path: &str,
    file: Result<String, String>,
) -> (Config, Option<String>) {
    let failure = match file.and_then(|t| parse_settings_file(&t)) {
        Ok(vals) => {
            let merged = |k: &str| {
                let file = value_of(&vals, k).map(str::to_string);
                if SETTINGS_FILE_KEYS.contains(&k) && k != "CGPU_CONTAINER_ID" {
                    file
                } else {
                    file.or_else(|| get(k))
                }
            };
            let mut c = from_lookup(&merged, cgroup);
            apply_mem_container_mib(&mut c, merged(MEM_CONTAINER_MIB));
            if c.errors.is_empty() {
                return (c, None);
            }
            c.errors.join("; ")
        }
        Err(e) => e,
    };
    let c = no_gpu(get, cgroup);
    let msg = format!(
        "cgpu: the host's settings for this container ({path}): {failure}: no GPU is visible to it until they are fixed (cgpuctl settings on the host)"
    );
    (c, Some(msg))
}

/// Settings in the environment that a host settings file `text` sets
/// otherwise or not at all (`KEY=VALUE` each): ignored, and said so.
pub fn ignored_by_settings_file(env: &dyn Fn(&str) -> Option<String>, text: &str) -> Vec<String> {
    let vals = parse_settings_file(text).unwrap_or_default();
    SETTINGS_FILE_KEYS
        .iter()
        .filter(|k| **k != "CGPU_CONTAINER_ID")
        .filter_map(|k| {
            let mine = env(k)?;
            let host = value_of(&vals, k);
            (host != Some(mine.trim())).then(|| format!("{k}={mine}"))
        })
        .collect()
}

/// The host's settings file for this container, if the settings directory
/// exists (one `stat` on hosts without it) and names this container.
pub fn settings_file_path(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let dir = env("CGPU_SETTINGS_DIR")
        .filter(|d| d.starts_with('/'))
        .unwrap_or_else(|| DEFAULT_SETTINGS_DIR.to_string());
    if !std::path::Path::new(&dir).is_dir() {
        return None;
    }
    let id = crate::identity::current(None);
    let cid = id.container_id.as_deref()?;
    let path = format!("{dir}/{cid}.env");
    std::path::Path::new(&path).exists().then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_lookup(&|k| m.get(k).cloned(), None)
    }

    fn mib(physical_mib: u64, dev: u64, container: u64) -> u64 {
        visible_total(physical_mib * MIB, container, Some(dev)) / MIB
    }

    #[test]
    fn seed_vectors() {
        assert_eq!(mib(15109, 15, 6), 6043); // T4
        assert_eq!(mib(16160, 15, 4), 4309); // V100
        assert_eq!(mib(23028, 23, 3), 3003); // A10
        assert_eq!(mib(23028, 23, 4), 4004);
        assert_eq!(mib(23028, 23, 5), 5006);
        assert_eq!(mib(23028, 23, 6), 6007);
        // TensorFlow prints 4.21GiB for 4309 MiB.
        let v100 = visible_total(16160 * MIB, 4, Some(15));
        assert_eq!(format!("{:.2}", v100 as f64 / GIB as f64), "4.21");
        // Without DEV: CONTAINER GiB exactly.
        assert_eq!(visible_total(15109 * MIB, 6, None), 6 * GIB);
    }

    #[test]
    fn seed_vectors_through_config() {
        let c = cfg(&[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "6"),
            ("ALIYUN_COM_GPU_MEM_DEV", "15"),
        ]);
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.quota_bytes(0, 15109 * MIB).unwrap() / MIB, 6043);
        // CGPU_DISABLE: the physical view.
        let c = cfg(&[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "3"),
            ("CGPU_DISABLE", "true"),
        ]);
        assert_eq!(c.mode, Mode::Record);
        let c = cfg(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "3"), ("CGPU_DISABLE", "1")]);
        assert_eq!(c.mode, Mode::Record);
        let c = cfg(&[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "3"),
            ("CGPU_DISABLE", "false"),
        ]);
        assert_eq!(c.mode, Mode::Enforce);
    }

    #[test]
    fn list_semantics() {
        let c = cfg(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "3,1")]);
        assert_eq!(
            (c.container_gib(0), c.container_gib(1), c.container_gib(7)),
            (3, 1, 1)
        );
        let c = cfg(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "3,4,5,6")]);
        assert_eq!(
            (0..5).map(|i| c.container_gib(i)).collect::<Vec<_>>(),
            vec![3, 4, 5, 6, 6]
        );
        let c = cfg(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "1,0,0")]);
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.quota_bytes(0, 16 * GIB), Some(GIB));
        assert_eq!(c.quota_bytes(1, 16 * GIB), None);
        assert_eq!(c.quota_bytes(5, 16 * GIB), None);
    }

    #[test]
    fn unset_and_zero_pass_through() {
        assert_eq!(cfg(&[]).mode, Mode::PassThrough);
        assert_eq!(
            cfg(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "0")]).mode,
            Mode::PassThrough
        );
        assert_eq!(cfg(&[]).quota_bytes(0, GIB), None);
        assert!(cfg(&[]).errors.is_empty());
    }

    #[test]
    fn bad_values_name_variable_and_value_and_leave_no_gpu() {
        let cases: &[(&str, &str)] = &[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "abc"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "3,,1"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "-1"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "1.5"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "2.0"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "4GiB"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", ""),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", " "),
            ("ALIYUN_COM_GPU_MEM_DEV", "0"),
            ("ALIYUN_COM_GPU_MEM_DEV", "15GiB"),
            ("CGPU_DISABLE", "maybe"),
            ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "zero"),
            ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "0,0"),
            ("ALIYUN_COM_GPU_SCHD_WEIGHT", "0"),
            ("ALIYUN_COM_GPU_SCHD_WEIGHT", "26"),
            ("ALIYUN_COM_GPU_SCHD_WEIGHT", "x"),
            ("ALIYUN_COM_GPU_HIGH_PRIO", "2"),
            ("CGPU_CONTAINER_ID", &"x".repeat(64)),
        ];
        for (k, v) in cases {
            let mut vars = vec![("ALIYUN_COM_GPU_MEM_CONTAINER", "4")];
            vars.retain(|(n, _)| n != k);
            vars.push((k, v));
            let c = cfg(&vars);
            // Never isolation off: nothing visible, so no GPU memory at all.
            assert_eq!(c.mode, Mode::Enforce, "{k}={v}");
            assert_eq!(c.visible, Some(vec![]), "{k}={v}");
            assert_eq!(c.errors.len(), 1, "{k}={v}: {:?}", c.errors);
            assert!(
                c.errors[0].contains(k) && c.errors[0].contains(v.trim()),
                "{:?}",
                c.errors
            );
        }
    }

    #[test]
    fn quota_mistakes_say_what_to_write() {
        let e = parse_mem_container("4GiB").unwrap_err();
        assert!(e.contains("write 4"), "{e}");
        let e = parse_mem_container("2.0").unwrap_err();
        assert!(e.contains("write 2"), "{e}");
        let e = parse_mem_container("4096MiB").unwrap_err();
        assert!(e.contains("write 4"), "{e}");
        let e = parse_mem_container("").unwrap_err();
        assert!(e.contains("unset the variable"), "{e}");
    }

    #[test]
    fn one_boolean_grammar() {
        for (v, b) in [
            ("1", true),
            ("true", true),
            ("YES", true),
            ("on", true),
            ("0", false),
            ("False", false),
            ("no", false),
            ("off", false),
            ("", false),
        ] {
            assert_eq!(parse_bool(v), Ok(b), "{v}");
            assert_eq!(parse_high_prio(v), Ok(b), "{v}");
        }
        for v in ["2", "y", "enabled"] {
            assert!(parse_bool(v).is_err() && parse_high_prio(v).is_err(), "{v}");
        }
    }

    #[test]
    fn settings_files_are_read_bounded_and_regular_only() {
        assert!(read_settings_file("/dev/zero")
            .unwrap_err()
            .contains("a device"));
        assert!(read_settings_file("/").unwrap_err().contains("a directory"));
        let dir = std::env::temp_dir().join(format!("cgpu-alloc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening a FIFO with no writer would block without O_NONBLOCK.
        assert!(read_settings_file(fifo.to_str().unwrap())
            .unwrap_err()
            .contains("a FIFO"));
        let big = dir.join("big");
        std::fs::write(&big, vec![b'#'; SETTINGS_FILE_MAX as usize + 1]).unwrap();
        assert!(read_settings_file(big.to_str().unwrap())
            .unwrap_err()
            .contains("more than"));
        let ok = dir.join("ok");
        std::fs::write(&ok, GOOD).unwrap();
        assert_eq!(read_settings_file(ok.to_str().unwrap()).unwrap(), GOOD);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn visible_devices() {
        let c = cfg(&[("ALIYUN_COM_GPU_VISIBLE_DEVICES", "1, 0")]);
        assert_eq!(
            c.visible,
            Some(vec![DeviceSel::Index(1), DeviceSel::Index(0)])
        );
        let c = cfg(&[(
            "ALIYUN_COM_GPU_VISIBLE_DEVICES",
            "GPU-B084AE33-e4a2-1c2f-2f4a-9bd1de0b14aa,2",
        )]);
        assert_eq!(
            c.visible,
            Some(vec![
                DeviceSel::Uuid("gpu-b084ae33-e4a2-1c2f-2f4a-9bd1de0b14aa".into()),
                DeviceSel::Index(2)
            ])
        );
        assert!(cfg(&[("ALIYUN_COM_GPU_VISIBLE_DEVICES", "")])
            .visible
            .is_none());
    }

    #[test]
    fn weight_prio_ids() {
        let c = cfg(&[
            ("ALIYUN_COM_GPU_SCHD_WEIGHT", "3"),
            ("ALIYUN_COM_GPU_HIGH_PRIO", "1"),
            ("CGPU_CONTAINER_ID", "pod-a"),
        ]);
        assert_eq!(
            (c.weight, c.high_prio, c.container_id.as_str()),
            (Some(3), true, "pod-a")
        );
        let long = "x".repeat(64);
        let c = cfg(&[("CGPU_CONTAINER_ID", &long)]);
        assert_eq!(c.errors.len(), 1);
    }

    #[test]
    fn cgroup_ids() {
        let id = "012b2edccd7a9f3bd8d3c1a5b2e0c6f1d9e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4";
        for text in [
            format!("12:memory:/docker/{id}\n0::/\n"),
            format!("0::/system.slice/docker-{id}.scope\n"),
            format!("0::/kubepods/besteffort/pod1234/cri-containerd-{id}.scope\n"),
            format!("1:name=systemd:/kubepods/crio-{id}\n"),
        ] {
            assert_eq!(
                container_id_from_cgroup(&text).as_deref(),
                Some("012b2edccd7a"),
                "{text}"
            );
        }
        assert_eq!(container_id_from_cgroup("0::/\n"), None);
        assert_eq!(
            container_id_from_cgroup("0::/user.slice/user-1000.slice\n"),
            None
        );
    }

    #[test]
    fn implausible_values_are_named() {
        let t4 = 15109 * MIB;
        let ok = cfg(&[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "6"),
            ("ALIYUN_COM_GPU_MEM_DEV", "15"),
        ]);
        assert!(ok.implausible(0, t4).is_empty());
        let big = cfg(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "40")]);
        let w = big.implausible(0, t4);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("40.00 GiB") && w[0].contains("14.75 GiB"),
            "{w:?}"
        );
        let dev = cfg(&[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "4"),
            ("ALIYUN_COM_GPU_MEM_DEV", "80"),
        ]);
        let w = dev.implausible(0, t4);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("ALIYUN_COM_GPU_MEM_DEV=80"), "{w:?}");
        assert!(cfg(&[]).implausible(0, t4).is_empty());
    }

    #[test]
    fn real_lib_paths() {
        let c = cfg(&[]);
        assert_eq!(c.real_libcuda.to_str().unwrap(), "libcuda.so.1");
        assert_eq!(c.real_libnvml.to_str().unwrap(), "libnvidia-ml.so.1");
        let c = cfg(&[("CGPU_REAL_LIBCUDA", "/x/libcuda.so")]);
        assert_eq!(c.real_libcuda.to_str().unwrap(), "/x/libcuda.so");
    }

    fn alloc(vars: &[(&str, &str)], file: Result<&str, &str>) -> (Config, Option<String>) {
        let env = |k: &str| {
            vars.iter()
                .find(|(a, _)| *a == k)
                .map(|(_, v)| v.to_string())
        };
        with_alloc_file(
            &env,
            None,
            "/etc/cgpu/alloc.env",
            file.map(str::to_string).map_err(str::to_string),
        )
    }

    const GOOD: &str = "CGPU_CONTAINER_ID=default/tf/main\nALIYUN_COM_GPU_MEM_CONTAINER=4,4\n\
                        ALIYUN_COM_GPU_MEM_DEV=15\nALIYUN_COM_GPU_VISIBLE_DEVICES=GPU-0a,GPU-0b\n";

    #[test]
    fn alloc_file_values_win_over_the_environment() {
        let (c, err) = alloc(
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "15"),
                ("ALIYUN_COM_GPU_SCHD_WEIGHT", "2"),
            ],
            Ok(GOOD),
        );
        assert_eq!(err, None);
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.mem_container, vec![4, 4]);
        assert_eq!(c.mem_dev, Some(15));
        assert_eq!(c.container_id, "default/tf/main");
        assert_eq!(
            c.visible,
            Some(vec![
                DeviceSel::Uuid("gpu-0a".into()),
                DeviceSel::Uuid("gpu-0b".into())
            ])
        );
        // Settings the file does not carry take their defaults: the pod's
        // own environment cannot override the host's allocation.
        assert_eq!(c.weight, None);
        assert_eq!(c.ignored.len(), 2, "{:?}", c.ignored);
        assert!(c.ignored[0].contains("ALIYUN_COM_GPU_MEM_CONTAINER='15'"));
        let (c, _) = alloc(&[("CGPU_DISABLE", "true")], Ok(GOOD));
        assert_eq!(c.mode, Mode::Enforce);
        assert!(
            c.ignored[0].contains("CGPU_DISABLE='true'"),
            "{:?}",
            c.ignored
        );
        // The host may say so itself.
        let (c, _) = alloc(
            &[],
            Ok(&format!(
                "{GOOD}CGPU_DISABLE=true\nALIYUN_COM_GPU_SCHD_WEIGHT=3\n"
            )),
        );
        assert_eq!((c.mode, c.weight), (Mode::Record, Some(3)));
    }

    #[test]
    fn a_missing_or_invalid_alloc_file_leaves_no_gpu_visible() {
        let cases: [(Result<&str, &str>, &str); 6] = [
            (Err("No such file or directory (os error 2)"), "No such file"),
            (Ok(""), "CGPU_CONTAINER_ID is missing"),
            (Ok("CGPU_CONTAINER_ID=x\nALIYUN_COM_GPU_MEM_CONTAINER=4\n"), "ALIYUN_COM_GPU_MEM_DEV is missing"),
            (Ok("LD_PRELOAD=/x\n"), "unknown key LD_PRELOAD"),
            (Ok("CGPU_CONTAINER_ID=x\nALIYUN_COM_GPU_MEM_CONTAINER=four\nALIYUN_COM_GPU_MEM_DEV=15\nALIYUN_COM_GPU_VISIBLE_DEVICES=GPU-0a\n"), "ALIYUN_COM_GPU_MEM_CONTAINER='four'"),
            (Ok("CGPU_CONTAINER_ID=x\nALIYUN_COM_GPU_MEM_CONTAINER=0\nALIYUN_COM_GPU_MEM_DEV=15\nALIYUN_COM_GPU_VISIBLE_DEVICES=GPU-0a\n"), "grants no GPU memory"),
        ];
        for (file, why) in cases {
            let (c, err) = alloc(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "15")], file);
            let err = err.expect("a failure message");
            assert!(err.contains(why), "{err}");
            assert!(err.contains("no GPU is visible"), "{err}");
            assert_eq!(c.visible, Some(vec![]), "{file:?}");
            assert_eq!(c.mode, Mode::Enforce);
        }
    }

    #[test]
    fn quotas_in_mib_come_from_the_hosts_files_exactly() {
        let file = |mib: &str, gib: &str| {
            format!(
                "CGPU_CONTAINER_ID=default/p/main\nALIYUN_COM_GPU_MEM_CONTAINER={gib}\n\
                 ALIYUN_COM_GPU_MEM_DEV=15\nALIYUN_COM_GPU_VISIBLE_DEVICES=GPU-0a,GPU-0b\n\
                 CGPU_MEM_CONTAINER_MIB={mib}\n"
            )
        };
        // Exactly 3000 MiB on each GPU, whatever ALIYUN_COM_GPU_MEM_DEV says.
        let (c, err) = alloc(&[], Ok(&file("3000", "3")));
        assert_eq!(err, None);
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.mem_container_mib, Some(vec![3000]));
        let v100 = 16160 * MIB;
        assert_eq!(c.quota_bytes(0, v100), Some(3000 * MIB));
        assert_eq!(c.quota_bytes(1, v100), Some(3000 * MIB));
        let (c, _) = alloc(&[], Ok(&file("1024,2049", "1,3")));
        assert_eq!(c.quota_bytes(0, v100), Some(1024 * MIB));
        assert_eq!(c.quota_bytes(1, v100), Some(2049 * MIB));
        // A bad or disagreeing value: one message, no GPU (fail closed).
        for (mib, gib, why) in [
            (
                "3000",
                "2",
                "GPU 0's 3000 MiB do not match ALIYUN_COM_GPU_MEM_CONTAINER's 2 GiB",
            ),
            ("3000,1024", "3", "GPU 1's 1024 MiB do not match"),
            (
                "3GiB",
                "3",
                "CGPU_MEM_CONTAINER_MIB='3GiB': '3GiB' is not a whole number of MiB",
            ),
            ("", "3", "CGPU_MEM_CONTAINER_MIB='': empty"),
            ("0", "3", "GPU 0's 0 MiB do not match"),
        ] {
            let (c, err) = alloc(&[], Ok(&file(mib, gib)));
            let err = err.expect("a failure message");
            assert!(err.contains(why), "{err}");
            assert_eq!(err.matches("no GPU is visible").count(), 1, "{err}");
            assert_eq!(c.visible, Some(vec![]));
        }
        // From a process's environment it counts for nothing, and is said.
        let (c, err) = alloc(&[("CGPU_MEM_CONTAINER_MIB", "15000")], Ok(GOOD));
        assert_eq!(err, None);
        assert_eq!(c.mem_container_mib, None);
        assert_eq!(
            c.quota_bytes(0, 16160 * MIB),
            Some(visible_total(16160 * MIB, 4, Some(15)))
        );
        assert!(
            c.ignored
                .iter()
                .any(|w| w.contains("CGPU_MEM_CONTAINER_MIB='15000'")),
            "{:?}",
            c.ignored
        );
        let env = |k: &str| {
            (k == "CGPU_MEM_CONTAINER_MIB" || k == "ALIYUN_COM_GPU_MEM_CONTAINER")
                .then(|| "1".to_string())
        };
        let c = from_lookup(&env, None);
        assert_eq!(c.mem_container_mib, None);
        assert_eq!(c.quota_bytes(0, 16160 * MIB), Some(GIB));
        assert_eq!(file_only_settings_in_env(&env).len(), 1);
        // A host settings file may give it too.
        let (c, err) = with_settings_file(
            &|_: &str| None,
            None,
            "/s/x.env",
            Ok("ALIYUN_COM_GPU_MEM_CONTAINER=1\nCGPU_MEM_CONTAINER_MIB=700\n".into()),
        );
        assert_eq!(err, None);
        assert_eq!(c.quota_bytes(0, 16160 * MIB), Some(700 * MIB));
    }

    #[test]
    fn host_settings_win_over_the_environment() {
        let env = |k: &str| match k {
            "ALIYUN_COM_GPU_MEM_CONTAINER" => Some("8".to_string()),
            "CGPU_DISABLE" => Some("true".to_string()),
            "ALIYUN_COM_GPU_SCHD_WEIGHT" => Some("2".to_string()),
            _ => None,
        };
        let file = "# from cgpuctl\nALIYUN_COM_GPU_MEM_CONTAINER=1\nCGPU_DISABLE=false\nCGPU_CONTAINER_ID=web-1\n";
        let (c, err) =
            with_settings_file(&env, None, "/etc/cgpu/containers/x.env", Ok(file.into()));
        assert_eq!(err, None);
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.mem_container, vec![1]);
        assert_eq!(c.container_name.as_deref(), Some("web-1"));
        assert_eq!(
            c.weight, None,
            "the environment adds nothing the host did not set"
        );
        let env_disable = |k: &str| (k == "CGPU_DISABLE").then(|| "true".to_string());
        let (c, _) = with_settings_file(
            &env_disable,
            None,
            "/s/x.env",
            Ok("ALIYUN_COM_GPU_MEM_CONTAINER=1\n".into()),
        );
        assert_eq!(c.mode, Mode::Enforce, "CGPU_DISABLE from inside is ignored");
        assert_eq!(
            ignored_by_settings_file(&env, file),
            vec![
                "ALIYUN_COM_GPU_MEM_CONTAINER=8".to_string(),
                "ALIYUN_COM_GPU_SCHD_WEIGHT=2".to_string(),
                "CGPU_DISABLE=true".to_string()
            ]
        );
        for (bad, why) in [
            ("", "ALIYUN_COM_GPU_MEM_CONTAINER is missing"),
            ("LD_PRELOAD=/x\n", "unknown key LD_PRELOAD"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER=lots\n", "'lots'"),
        ] {
            let (c, err) = with_settings_file(&env, None, "/s/x.env", Ok(bad.into()));
            let err = err.expect("a message");
            assert!(
                err.contains(why) && err.contains("no GPU is visible"),
                "{err}"
            );
            assert_eq!(c.visible, Some(vec![]), "fail closed: no GPU");
        }
    }
}
