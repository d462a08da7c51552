//! Which container this process belongs to (docs/identity.md).
//!
//! Every process of one container must land in the same ledger row, and no
//! two containers in one, whatever the runtime, the cgroup version and
//! namespace, host networking or host PIDs, and whatever a process does to
//! its environment, hostname or namespaces after it started. The sources,
//! strongest first (what a container cannot choose before what it can):
//!
//! 1. `/proc/self/mountinfo`, 4th field (the root of each mount within its
//!    filesystem): the per-container files a runtime binds in before the
//!    container starts. The kubelet's termination-log
//!    (`…/pods/<pod-uid>/containers/<name>/<hex>`), docker's and nerdctl's
//!    `…/containers/<64 hex>/{hostname,hosts,resolv.conf}`, podman's and
//!    CRI-O's `…/overlay-containers/<64 hex>/userdata/…`. A process that
//!    unshares its mount namespace keeps copies of these mounts.
//! 2. `/proc/self/cgroup`: a 64-hex container id in a path (cgroup v1, or
//!    v2 with the host's cgroup namespace).
//! 3. The root filesystem's overlay `upperdir` (per container for docker,
//!    containerd, podman and CRI-O with their overlay drivers).
//! 4. Per-pod binds (the kubelet's `…/pods/<uid>/etc-hosts`, containerd's
//!    `…/sandboxes/<id>/…`): all containers of a pod are one.
//! 5. The PID namespace (its inode), when it is not the host's: a process
//!    cannot leave its own PID namespace (`unshare -p` moves only its
//!    children), unlike its mount or UTS namespace.
//! 6. Otherwise the process is not in a container (the host's PID
//!    namespace and no runtime trace): `CGPU_CONTAINER_ID` if set, else the
//!    hostname, as the only way to tell jobs of a host apart.
//!
//! `CGPU_CONTAINER_ID` never chooses the identity of a process in a
//! container (sources 1–5): a process can drop or forge a variable, and one
//! started without it must still land in its container. There it only
//! names the container (the name `cgpu-smi` shows) when the process is the
//! first of its container on a GPU.
//!
//! Everything here but [`current`] is a pure function of the texts, tested
//! with fixtures of each runtime.

use std::sync::OnceLock;

/// Where an identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The kubelet's per-container termination-log bind.
    Kubelet,
    /// A runtime's per-container binds (docker, nerdctl, podman, CRI-O).
    RuntimeBind,
    /// A 64-hex container id in `/proc/self/cgroup`.
    Cgroup,
    /// The root filesystem's overlay `upperdir`.
    Overlay,
    /// A per-pod bind (all containers of the pod are one).
    Pod,
    /// The PID namespace.
    PidNamespace,
    /// Not in a container: `CGPU_CONTAINER_ID` or the hostname.
    Host,
}

impl Source {
    /// Does the identity come from the process's container (not from a
    /// name the process was given)?
    pub fn is_container(self) -> bool {
        self != Source::Host
    }
}

/// This process's container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Ledger key (never 0): a 64-bit hash of the source and its value.
    pub key: u64,
    /// What operators read (`cgpu-smi`'s pod): docker's 12-hex short id,
    /// `CGPU_CONTAINER_ID` when given, … (at most 63 bytes).
    pub name: String,
    pub source: Source,
    /// The runtime's full container id (64 hex, lower case) when a source
    /// names it: the name of the container's settings file on the host.
    pub container_id: Option<String>,
}

/// What a process can see of itself.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    pub cgroup: Option<&'a str>,
    pub mountinfo: Option<&'a str>,
    /// Inode of `/proc/self/ns/pid` (0: unknown).
    pub pidns: u64,
    pub hostname: &'a str,
    /// `CGPU_CONTAINER_ID` (or the allocation file's), already validated.
    pub name: Option<&'a str>,
}

/// The host's (initial) PID namespace inode (`PROC_PID_INIT_INO`, fixed by
/// the kernel).
pub const HOST_PIDNS: u64 = 0xEFFF_FFFC;

/// Longest display name (the ledger's id field holds 64 bytes).
const MAX_NAME: usize = 63;

/// 64-bit FNV-1a of `tag` and `value` (never 0).
pub fn key_of(tag: &str, value: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tag.bytes().chain([0u8]).chain(value.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

/// The key of a container known only by its name (a host process's
/// `CGPU_CONTAINER_ID` or hostname; what an older library's row is).
pub fn key_of_name(name: &str) -> u64 {
    key_of("name", name)
}

/// The key of a runtime container id (64 hex): the same from the runtime's
/// binds and from the cgroup path, and what `cgpuctl` computes on the host.
pub fn key_of_container_id(id: &str) -> u64 {
    key_of("container", &id.to_ascii_lowercase())
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

fn is_pod_uid(s: &str) -> bool {
    // 8-4-4-4-12 hex (the kubelet also accepts other uids: any 1..=64
    // characters of hex digits, letters, '-' and '_').
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// Undo mountinfo's octal escapes (`\040` for a space, …).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One mountinfo line: (root, mount point, filesystem type, super options).
fn mount_fields(line: &str) -> Option<(String, String, &str, &str)> {
    let mut it = line.split(' ');
    let _id = it.next()?;
    let _parent = it.next()?;
    let _dev = it.next()?;
    let root = unescape(it.next()?);
    let point = unescape(it.next()?);
    let _opts = it.next()?;
    // Optional fields up to the separator.
    for f in it.by_ref() {
        if f == "-" {
            break;
        }
    }
    let fstype = it.next()?;
    let _source = it.next()?;
    let superopts = it.next().unwrap_or("");
    Some((root, point, fstype, superopts))
}

/// What one bind root says, if anything.
#[derive(Debug, PartialEq, Eq)]
enum Bind {
    /// Kubelet termination-log: (pod uid, container name).
    KubeletContainer(String, String),
    /// A runtime container's own file: 64-hex id.
    Container(String),
    /// A pod's file: a tag and the pod's id.
    Pod(&'static str, String),
}

fn classify(root: &str) -> Option<Bind> {
    let seg: Vec<&str> = root.split('/').filter(|s| !s.is_empty()).collect();
    for i in 0..seg.len() {
        // …/pods/<uid>/containers/<name>/<file>
        if seg[i] == "pods" && i + 4 < seg.len() && seg[i + 2] == "containers" {
            let (uid, name) = (seg[i + 1], seg[i + 3]);
            if is_pod_uid(uid) && !name.is_empty() {
                return Some(Bind::KubeletContainer(uid.to_string(), name.to_string()));
            }
        }
        // …/pods/<uid>/etc-hosts
        if seg[i] == "pods" && seg.get(i + 2) == Some(&"etc-hosts") && is_pod_uid(seg[i + 1]) {
            return Some(Bind::Pod("k8s-pod", seg[i + 1].to_string()));
        }
        if is_hex64(seg[i]) {
            let id = seg[i].to_ascii_lowercase();
            let prev = i.checked_sub(1).map(|p| seg[p]);
            let next = seg.get(i + 1).copied();
            if prev == Some("sandboxes") {
                return Some(Bind::Pod("sandbox", id));
            }
            if let Some("hostname" | "hosts" | "resolv.conf" | "userdata") = next {
                return Some(Bind::Container(id));
            }
        }
    }
    None
}

/// The identity the runtime's binds give, and the strength of each kind:
/// (kubelet container, runtime container, pod).
fn from_mountinfo(text: &str) -> (Option<Bind>, Option<Bind>, Option<Bind>, Option<String>) {
    let (mut kube, mut ctr, mut pod, mut upper) = (None, None, None, None);
    for line in text.lines() {
        let Some((root, point, fstype, superopts)) = mount_fields(line) else {
            continue;
        };
        if point == "/" && fstype == "overlay" {
            if let Some(u) = superopts
                .split(',')
                .find_map(|o| o.strip_prefix("upperdir="))
            {
                upper = Some(u.to_string());
            }
        }
        match classify(&root) {
            Some(b @ Bind::KubeletContainer(..)) if kube.is_none() => kube = Some(b),
            Some(b @ Bind::Container(_)) => {
                // The one bound on the runtime's own mount points wins
                // (a container may also see other containers' files).
                let own = matches!(
                    point.as_str(),
                    "/etc/hostname" | "/etc/hosts" | "/etc/resolv.conf" | "/run/.containerenv"
                );
                if ctr.is_none() || own {
                    ctr = Some(b);
                }
            }
            Some(b @ Bind::Pod(..)) if pod.is_none() => pod = Some(b),
            _ => {}
        }
    }
    (kube, ctr, pod, upper)
}

/// The first run of exactly 64 hex digits in a cgroup path (docker,
/// containerd, CRI-O, podman), lower case.
pub fn container_id_in_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        let b = path.as_bytes();
        let mut run = 0usize;
        for (i, c) in b.iter().enumerate() {
            if c.is_ascii_hexdigit() {
                run += 1;
                if run == 64 && b.get(i + 1).is_none_or(|c| !c.is_ascii_hexdigit()) {
                    let start = i + 1 - 64;
                    return Some(path[start..start + 64].to_ascii_lowercase());
                }
            } else {
                run = 0;
            }
        }
    }
    None
}

/// `host@suffix`, cut to fit the ledger's id field.
fn suffixed(host: &str, suffix: &str) -> String {
    let keep = MAX_NAME.saturating_sub(suffix.len() + 1);
    let mut h: String = String::new();
    for c in host.chars() {
        if h.len() + c.len_utf8() > keep {
            break;
        }
        h.push(c);
    }
    format!("{h}@{suffix}")
}

/// The container of a process that sees `f` (pure).
pub fn resolve(f: &Facts<'_>) -> Identity {
    let host = if f.hostname.is_empty() {
        "unknown"
    } else {
        f.hostname
    };
    let given = f.name.filter(|n| !n.is_empty() && n.len() <= MAX_NAME);
    let (kube, ctr, pod, upper) = f.mountinfo.map(from_mountinfo).unwrap_or_default();
    let id_name = |id: &str| {
        given
            .map(str::to_string)
            .unwrap_or_else(|| id[..12].to_string())
    };
    if let Some(Bind::KubeletContainer(uid, name)) = kube {
        let cid = ctr
            .as_ref()
            .and_then(|b| match b {
                Bind::Container(id) => Some(id.clone()),
                _ => None,
            })
            .or_else(|| f.cgroup.and_then(container_id_in_cgroup));
        let display = given.map(str::to_string).unwrap_or_else(|| {
            let short: String = uid.chars().take(8).collect();
            suffixed(&name, &format!("pod-{short}"))
        });
        return Identity {
            key: key_of("k8s", &format!("{uid}/{name}")),
            name: display,
            source: Source::Kubelet,
            container_id: cid,
        };
    }
    if let Some(Bind::Container(id)) = ctr {
        return Identity {
            key: key_of_container_id(&id),
            name: id_name(&id),
            source: Source::RuntimeBind,
            container_id: Some(id),
        };
    }
    if let Some(id) = f.cgroup.and_then(container_id_in_cgroup) {
        return Identity {
            key: key_of_container_id(&id),
            name: id_name(&id),
            source: Source::Cgroup,
            container_id: Some(id),
        };
    }
    if let Some(u) = upper {
        let key = key_of("overlay", &u);
        return Identity {
            key,
            name: given
                .map(str::to_string)
                .unwrap_or_else(|| suffixed(host, &format!("{:08x}", key as u32))),
            source: Source::Overlay,
            container_id: None,
        };
    }
    if let Some(Bind::Pod(tag, id)) = pod {
        let short: String = id.chars().take(12).collect();
        return Identity {
            key: key_of(tag, &id),
            name: given.map(str::to_string).unwrap_or_else(|| {
                if tag == "sandbox" {
                    short
                } else {
                    format!("pod-{short}")
                }
            }),
            source: Source::Pod,
            container_id: None,
        };
    }
    if f.pidns != 0 && f.pidns != HOST_PIDNS {
        return Identity {
            key: key_of("pidns", &f.pidns.to_string()),
            name: given
                .map(str::to_string)
                .unwrap_or_else(|| suffixed(host, &format!("pidns-{}", f.pidns))),
            source: Source::PidNamespace,
            container_id: None,
        };
    }
    let name = given.unwrap_or(host);
    let name: String = {
        let mut s = String::new();
        for c in name.chars() {
            if s.len() + c.len_utf8() > MAX_NAME {
                break;
            }
            s.push(c);
        }
        s
    };
    Identity {
        key: key_of_name(&name),
        name,
        source: Source::Host,
        container_id: None,
    }
}

/// At most this many bytes of a `/proc` text are read (mountinfo of a busy
/// host is tens of KiB; a bigger one is cut, never read without bound).
const MAX_PROC_TEXT: u64 = 1 << 20;

/// A `/proc/self` text, bounded.
pub fn read_proc(path: &str) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).ok()?;
    let mut s = String::new();
    f.take(MAX_PROC_TEXT).read_to_string(&mut s).ok()?;
    Some(s)
}

/// The inode of a `/proc/self/ns/<kind>` link (0: unknown).
pub fn ns_inode(kind: &str) -> u64 {
    std::fs::read_link(format!("/proc/self/ns/{kind}"))
        .ok()
        .and_then(|l| {
            let s = l.to_string_lossy().into_owned();
            s.strip_prefix(&format!("{kind}:["))?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// This process's hostname (`unknown` if none).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its whole length; gethostname NUL-terminates
    // when the name fits, and we search for the NUL within the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return "unknown".into();
    }
    let n = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    let s = String::from_utf8_lossy(&buf[..n]).into_owned();
    if s.is_empty() {
        "unknown".into()
    } else {
        s
    }
}

/// What this process sees of itself, read once (at its first use of a GPU
/// or of the ledger; never on a launch or an allocation).
struct Seen {
    cgroup: Option<String>,
    mountinfo: Option<String>,
    pidns: u64,
    hostname: String,
}

fn seen() -> &'static Seen {
    static SEEN: OnceLock<Seen> = OnceLock::new();
    SEEN.get_or_init(|| Seen {
        cgroup: read_proc("/proc/self/cgroup"),
        mountinfo: read_proc("/proc/self/mountinfo"),
        pidns: ns_inode("pid"),
        hostname: hostname(),
    })
}

/// This process's container, named `name` when given (the configured
/// `CGPU_CONTAINER_ID`). Callers keep the answer: it is worked out from
/// texts read once.
pub fn current(name: Option<&str>) -> Identity {
    let s = seen();
    let id = resolve(&Facts {
        cgroup: s.cgroup.as_deref(),
        mountinfo: s.mountinfo.as_deref(),
        pidns: s.pidns,
        hostname: &s.hostname,
        name,
    });
    tracing::debug!(
        "cgpu: container {} (identity from {:?}, key {:016x})",
        id.name,
        id.source,
        id.key
    );
    id
}
