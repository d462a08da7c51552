//! Which container this process belongs to (docs/identity.md).
//!
//! Every process of one container must land in the same ledger row, and no
//! two containers in one, whatever the runtime, the cgroup version and
//! namespace, host networking or host PIDs, and whatever a process does to
//! its environment, hostname or namespaces after it started. The sources,
//! strongest first (what a container cannot choose before what it can):
//!
//! 1. `/proc/self/mountinfo`, 4th field (the root of each mount within its
//!    filesystem): the kubelet's termination-log bind
//!    (`…/pods/<pod-uid>/containers/<name>/<hex>`), per container.
//! 2. `/proc/self/cgroup`: a 64-hex container id in a path (cgroup v1, or
//!    v2 with the host's cgroup namespace).
//! 3. `/proc/self/mountinfo` again: the per-container files a runtime binds
//!    in before the container starts, docker's and nerdctl's
//!    `…/containers/<64 hex>/{hostname,hosts,resolv.conf}`, podman's and
//!    CRI-O's `…/overlay-containers/<64 hex>/userdata/…` (after the cgroup
//!    path: a container sharing another's network, `--network
//!    container:<other>`, gets the other's files). A process that unshares
//!    its mount namespace keeps copies of these mounts.
//! 4. The root filesystem's overlay `upperdir` (per container for docker,
//!    containerd, podman and CRI-O with their overlay drivers).
//! 5. Per-pod binds (the kubelet's `…/pods/<uid>/etc-hosts`, containerd's
//!    `…/sandboxes/<id>/…`): all containers of a pod are one.
//! 6. The PID namespace (its inode), when it is not the host's: a process
//!    cannot leave its own PID namespace (`unshare -p` moves only its
//!    children), unlike its mount or UTS namespace.
//! 7. Otherwise the process is not in a container (the host's PID
//!    namespace and no runtime trace): `CGPU_CONTAINER_ID` if set, else the
//!    hostname, as the only way to tell jobs of a host apart.
//!
//! `CGPU_CONTAINER_ID` never chooses the identity of a process in a
//! container (sources 1–6): a process can drop or forge a variable, and one
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
        // The name: the one given, else the container id's 12 digits (the
        // name a cgroup path gave before), else the container's name in
        // its pod.
        let display = given
            .map(str::to_string)
            .or_else(|| cid.as_deref().map(|c| c[..12].to_string()))
            .unwrap_or_else(|| {
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
    if let Some(id) = f.cgroup.and_then(container_id_in_cgroup) {
        return Identity {
            key: key_of_container_id(&id),
            name: id_name(&id),
            source: Source::Cgroup,
            container_id: Some(id),
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

/// Host process `pid` as the ledger names a process: (its pid in its own
/// PID namespace, that namespace's inode), from `/proc/<pid>/status`
/// (`NSpid:`, innermost last) and `/proc/<pid>/ns/pid`. `None` when the
/// process is gone or unreadable.
pub fn ns_pid(pid: u32) -> Option<(i32, u64)> {
    let status = read_proc(&format!("/proc/{pid}/status"))?;
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())?;
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    let inode = ns
        .to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .parse()
        .ok()?;
    Some((nspid, inode))
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

/// What the host sees of another process (`/proc/<pid>`): the texts
/// [`resolve`] reads, as that process reads them of itself, so that both
/// find the same container. Its mountinfo and PID namespace are its own
/// whoever reads them. Its cgroup paths are shown relative to the
/// reader's cgroup namespace: when the process has a cgroup namespace of
/// its own (docker's and containerd's default on cgroup v2), it sees its
/// paths from its container's cgroup down, which name no container id, so
/// the host's longer view of them is not used (it would name an id the
/// process never saw, and another key than the one it joined with). For
/// the node agent, which maps the processes NVML reports to their
/// containers.
#[derive(Debug, Clone, Default)]
pub struct ProcessFacts {
    pub cgroup: Option<String>,
    pub mountinfo: Option<String>,
    /// Inode of `/proc/<pid>/ns/pid` (0: unknown).
    pub pidns: u64,
    /// The reader's hostname: another process's UTS namespace is not read
    /// (only a host process's display name and host-rule key depend on it).
    pub hostname: String,
}

impl ProcessFacts {
    /// Reads `/proc/<pid>/{cgroup,mountinfo,ns/pid}`; `None` when the
    /// process is gone or none of them can be read.
    pub fn read(pid: u32) -> Option<ProcessFacts> {
        let own_cgroupns = {
            let link = |p: String| std::fs::read_link(p).ok();
            match (
                link(format!("/proc/{pid}/ns/cgroup")),
                link("/proc/self/ns/cgroup".into()),
            ) {
                (Some(theirs), Some(mine)) => theirs != mine,
                _ => false,
            }
        };
        let cgroup = read_proc(&format!("/proc/{pid}/cgroup")).filter(|_| !own_cgroupns);
        let mountinfo = read_proc(&format!("/proc/{pid}/mountinfo"));
        let pidns = std::fs::read_link(format!("/proc/{pid}/ns/pid"))
            .ok()
            .and_then(|l| {
                l.to_str()?
                    .strip_prefix("pid:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        if mountinfo.is_none() && pidns == 0 {
            return None;
        }
        Some(ProcessFacts {
            cgroup,
            mountinfo,
            pidns,
            hostname: hostname(),
        })
    }

    /// The container of that process, named `name` when given (as
    /// [`current`] does for this process).
    pub fn resolve(&self, name: Option<&str>) -> Identity {
        resolve(&Facts {
            cgroup: self.cgroup.as_deref(),
            mountinfo: self.mountinfo.as_deref(),
            pidns: self.pidns,
            hostname: &self.hostname,
            name,
        })
    }
}

/// The identity of another process, from `/proc/<pid>` (see
/// [`ProcessFacts`]); `None` when the process is gone.
pub fn of_pid(pid: u32, name: Option<&str>) -> Option<Identity> {
    ProcessFacts::read(pid).map(|f| f.resolve(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCKER_ID: &str = "3f4c0a6d2b1e9f8a7c6b5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f40";
    const OTHER_ID: &str = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b";
    const POD_UID: &str = "5b9d3c1e-7a2f-4e6b-9c8d-0f1a2b3c4d5e";

    /// docker 24 on a cgroup v2 host (private cgroup namespace, the default):
    /// `/proc/self/cgroup` says nothing; the binds of hostname, hosts and
    /// resolv.conf name the container.
    fn docker_v2(id: &str) -> (String, String) {
        let mi = format!(
            "1187 1098 0:120 / / rw,relatime master:603 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/QX3V:/var/lib/docker/overlay2/l/7HZK,upperdir=/var/lib/docker/overlay2/8c1f0e2d/diff,workdir=/var/lib/docker/overlay2/8c1f0e2d/work,nouserxattr\n\
1188 1187 0:123 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n\
1189 1187 0:124 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755,inode64\n\
1192 1187 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate,memory_recursiveprot\n\
1193 1187 259:2 /var/lib/docker/containers/{id}/resolv.conf /etc/resolv.conf rw,relatime - ext4 /dev/nvme0n1p2 rw\n\
1194 1187 259:2 /var/lib/docker/containers/{id}/hostname /etc/hostname rw,relatime - ext4 /dev/nvme0n1p2 rw\n\
1195 1187 259:2 /var/lib/docker/containers/{id}/hosts /etc/hosts rw,relatime - ext4 /dev/nvme0n1p2 rw\n\
1099 1189 0:122 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k,inode64\n"
        );
        (mi, "0::/\n".to_string())
    }

    fn facts<'a>(mi: &'a str, cg: &'a str, pidns: u64, host: &'a str) -> Facts<'a> {
        Facts {
            cgroup: Some(cg),
            mountinfo: Some(mi),
            pidns,
            hostname: host,
            name: None,
        }
    }

    #[test]
    fn docker_cgroup_v2_private_namespace() {
        let (mi, cg) = docker_v2(DOCKER_ID);
        let id = resolve(&facts(&mi, &cg, 4026532301, "3f4c0a6d2b1e"));
        assert_eq!(id.source, Source::RuntimeBind);
        assert_eq!(id.name, "3f4c0a6d2b1e");
        assert_eq!(id.container_id.as_deref(), Some(DOCKER_ID));
        assert_eq!(id.key, key_of_container_id(DOCKER_ID));
        // Another container: another key.
        let (mi2, _) = docker_v2(OTHER_ID);
        assert_ne!(resolve(&facts(&mi2, &cg, 4026532301, "x")).key, id.key);
    }

    #[test]
    fn docker_host_network_and_host_pid_and_changed_hostname() {
        // --network host --pid host: the node's hostname, the host's PID
        // namespace; the binds still name the container. A process that
        // changed its hostname or unshared its mount namespace sees the same.
        let (mi, cg) = docker_v2(DOCKER_ID);
        let a = resolve(&facts(&mi, &cg, HOST_PIDNS, "gpu-node-7"));
        let b = resolve(&facts(&mi, &cg, 4026532999, "renamed"));
        assert_eq!(a.key, b.key);
        assert_eq!(a.name, "3f4c0a6d2b1e");
        // CGPU_CONTAINER_ID names it, never chooses it.
        let named = resolve(&Facts {
            name: Some("my-job"),
            ..facts(&mi, &cg, HOST_PIDNS, "gpu-node-7")
        });
        assert_eq!(named.key, a.key);
        assert_eq!(named.name, "my-job");
    }

    #[test]
    fn docker_cgroup_v1_and_host_cgroup_namespace() {
        let cg_v1 = format!(
            "12:hugetlb:/docker/{DOCKER_ID}\n11:memory:/docker/{DOCKER_ID}\n1:name=systemd:/docker/{DOCKER_ID}\n0::/system.slice/containerd.service\n"
        );
        let cg_v2_host = format!("0::/system.slice/docker-{DOCKER_ID}.scope\n");
        let mi = "612 530 0:55 / / rw,relatime - ext4 /dev/sda1 rw\n";
        for cg in [cg_v1, cg_v2_host] {
            let id = resolve(&facts(mi, &cg, 4026532301, "h"));
            assert_eq!(id.source, Source::Cgroup, "{cg}");
            assert_eq!(id.name, "3f4c0a6d2b1e");
            assert_eq!(
                id.key,
                key_of_container_id(DOCKER_ID),
                "same key as the binds"
            );
        }
    }

    /// containerd 1.7 under Kubernetes, cgroup v2 (private namespace): the
    /// kubelet's termination-log per container, the sandbox's files per pod.
    fn k8s_containerd(container: &str) -> String {
        format!(
            "2380 2296 0:360 / / rw,relatime master:941 - overlay overlay rw,lowerdir=/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/412/fs,upperdir=/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/977/fs,workdir=/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/977/work\n\
2381 2380 0:363 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n\
2390 2380 259:1 /var/lib/kubelet/pods/{POD_UID}/etc-hosts /etc/hosts rw,relatime - ext4 /dev/nvme0n1p1 rw\n\
2391 2382 259:1 /var/lib/kubelet/pods/{POD_UID}/containers/{container}/4a7b9c2e /dev/termination-log rw,relatime - ext4 /dev/nvme0n1p1 rw\n\
2392 2380 259:1 /var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/{OTHER_ID}/hostname /etc/hostname rw,relatime - ext4 /dev/nvme0n1p1 rw\n\
2393 2380 0:354 / /etc/resolv.conf rw,relatime - ext4 /dev/nvme0n1p1 rw\n\
2394 2380 0:352 / /var/run/secrets/kubernetes.io/serviceaccount ro,relatime - tmpfs tmpfs rw,size=15728640k\n"
        )
    }

    #[test]
    fn kubernetes_containerd_containers_of_one_pod_are_apart() {
        let cg = "0::/\n";
        let a = resolve(&facts(
            &k8s_containerd("trainer"),
            cg,
            4026532400,
            "trainer-pod",
        ));
        let b = resolve(&facts(
            &k8s_containerd("sidecar"),
            cg,
            4026532400,
            "trainer-pod",
        ));
        assert_eq!(a.source, Source::Kubelet);
        assert_ne!(a.key, b.key, "two containers of one pod");
        assert_eq!(a.name, "trainer@pod-5b9d3c1e");
        // The allocation file's name is kept (namespace/pod/container).
        let named = resolve(&Facts {
            name: Some("default/trainer-pod/trainer"),
            ..facts(&k8s_containerd("trainer"), cg, HOST_PIDNS, "node")
        });
        assert_eq!(named.key, a.key, "hostNetwork + hostPID: same container");
        assert_eq!(named.name, "default/trainer-pod/trainer");
    }

    #[test]
    fn kubernetes_cgroup_v1_gives_the_container_id_beside_the_kubelet_key() {
        let cg = format!(
            "11:memory:/kubepods/burstable/pod{POD_UID}/{DOCKER_ID}\n1:name=systemd:/kubepods/burstable/pod{POD_UID}/{DOCKER_ID}\n"
        );
        let id = resolve(&facts(&k8s_containerd("trainer"), &cg, 4026532400, "p"));
        assert_eq!(id.source, Source::Kubelet);
        assert_eq!(id.container_id.as_deref(), Some(DOCKER_ID));
        assert_eq!(id.name, "3f4c0a6d2b1e", "the name the cgroup path gave");
    }

    #[test]
    fn cri_o_and_podman() {
        // CRI-O under Kubernetes: the kubelet's bind decides.
        let crio = format!(
            "1401 1322 0:93 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/containers/storage/overlay/l/ABC,upperdir=/var/lib/containers/storage/overlay/5e6f/diff,workdir=/var/lib/containers/storage/overlay/5e6f/work\n\
1410 1401 0:25 /containers/storage/overlay-containers/{OTHER_ID}/userdata/resolv.conf /etc/resolv.conf rw,nosuid,nodev - tmpfs tmpfs rw,mode=755\n\
1411 1401 0:25 /containers/storage/overlay-containers/{OTHER_ID}/userdata/hostname /etc/hostname rw,nosuid,nodev - tmpfs tmpfs rw,mode=755\n\
1412 1401 259:1 /var/lib/kubelet/pods/{POD_UID}/containers/cuda/77e1aa01 /dev/termination-log rw,relatime - ext4 /dev/nvme0n1p1 rw\n"
        );
        let cg = format!("0::/kubepods.slice/kubepods-pod.slice/crio-{DOCKER_ID}.scope\n");
        let id = resolve(&facts(&crio, &cg, 4026532500, "p"));
        assert_eq!(id.source, Source::Kubelet);
        assert_eq!(id.key, key_of("k8s", &format!("{POD_UID}/cuda")));
        // podman (rootful), cgroup v2 private namespace: userdata binds.
        let podman = format!(
            "735 650 0:49 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/containers/storage/overlay/l/Q,upperdir=/var/lib/containers/storage/overlay/aa11/diff,workdir=/var/lib/containers/storage/overlay/aa11/work\n\
745 735 0:25 /containers/storage/overlay-containers/{DOCKER_ID}/userdata/.containerenv /run/.containerenv rw,nosuid,nodev - tmpfs tmpfs rw,mode=755\n\
746 735 0:25 /containers/storage/overlay-containers/{DOCKER_ID}/userdata/hostname /etc/hostname rw,nosuid,nodev - tmpfs tmpfs rw,mode=755\n\
747 735 0:25 /containers/storage/overlay-containers/{DOCKER_ID}/userdata/hosts /etc/hosts rw,nosuid,nodev - tmpfs tmpfs rw,mode=755\n"
        );
        let id = resolve(&facts(&podman, "0::/\n", 4026532600, "3f4c0a6d2b1e"));
        assert_eq!(id.source, Source::RuntimeBind);
        assert_eq!(id.key, key_of_container_id(DOCKER_ID));
        assert_eq!(id.name, "3f4c0a6d2b1e");
    }

    #[test]
    fn a_container_on_another_containers_network_is_told_apart_by_its_cgroup() {
        // docker run --network container:A B: docker binds A's hostname,
        // hosts and resolv.conf into B; B's cgroup path (v1, or v2 with the
        // host's cgroup namespace) names B.
        let (mi, _) = docker_v2(DOCKER_ID);
        let cg = format!("0::/system.slice/docker-{OTHER_ID}.scope\n");
        let b = resolve(&facts(&mi, &cg, 4026532301, "3f4c0a6d2b1e"));
        assert_eq!(b.source, Source::Cgroup);
        assert_eq!(b.container_id.as_deref(), Some(OTHER_ID));
    }

    #[test]
    fn a_container_that_sees_another_containers_files_keeps_its_own() {
        // A monitoring container that bind-mounts another container's hosts
        // file somewhere: its own /etc/hostname decides.
        let (mi, cg) = docker_v2(DOCKER_ID);
        let mi = format!(
            "900 1187 259:2 /var/lib/docker/containers/{OTHER_ID}/hosts /mnt/other-hosts rw - ext4 /dev/nvme0n1p2 rw\n{mi}"
        );
        assert_eq!(
            resolve(&facts(&mi, &cg, 1, "h")).container_id.as_deref(),
            Some(DOCKER_ID)
        );
    }

    #[test]
    fn overlay_then_pod_then_pid_namespace_then_host() {
        // An overlay root with no runtime binds: its upperdir.
        let ov = "10 1 0:40 / / rw - overlay overlay rw,lowerdir=/l,upperdir=/var/lib/x/7/diff,workdir=/var/lib/x/7/work\n";
        let a = resolve(&facts(ov, "0::/\n", 4026532700, "node"));
        assert_eq!(a.source, Source::Overlay);
        assert!(a.name.starts_with("node@"), "{}", a.name);
        // Only a pod's file.
        let pod = format!(
            "20 1 259:1 /var/lib/kubelet/pods/{POD_UID}/etc-hosts /etc/hosts rw - ext4 /dev/x rw\n"
        );
        assert_eq!(
            resolve(&facts(&pod, "0::/\n", 4026532700, "n")).source,
            Source::Pod
        );
        // Nothing but a PID namespace of its own (two host-network
        // containers made with unshare): the namespace tells them apart.
        let bare = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";
        let x = resolve(&facts(bare, "0::/\n", 4026532174, "vm"));
        let y = resolve(&facts(bare, "0::/\n", 4026532180, "vm"));
        assert_eq!(x.source, Source::PidNamespace);
        assert_ne!(x.key, y.key);
        assert_eq!(x.name, "vm@pidns-4026532174");
        // The host: CGPU_CONTAINER_ID or the hostname decides.
        let h = resolve(&facts(bare, "0::/\n", HOST_PIDNS, "vm"));
        assert_eq!((h.source, h.name.as_str()), (Source::Host, "vm"));
        assert_eq!(h.key, key_of_name("vm"));
        let named = resolve(&Facts {
            name: Some("job-a"),
            ..facts(bare, "0::/\n", HOST_PIDNS, "vm")
        });
        assert_eq!(named.key, key_of_name("job-a"));
        // Nothing readable at all.
        let none = resolve(&Facts {
            hostname: "",
            ..Facts::default()
        });
        assert_eq!(none.name, "unknown");
    }

    #[test]
    fn another_process_resolves_as_it_resolves_itself() {
        let me = std::process::id();
        let theirs = of_pid(me, Some("job-a")).expect("/proc/<own pid>");
        let mine = current(Some("job-a"));
        assert_eq!(theirs.key, mine.key);
        assert_eq!(theirs.source, mine.source);
        assert!(of_pid(u32::MAX, None).is_none());
    }

    #[test]
    fn escapes_and_long_names() {
        assert_eq!(unescape("/a\\040b/c"), "/a b/c");
        assert_eq!(unescape("/a\\04"), "/a\\04");
        let long = "h".repeat(80);
        let bare = "27 1 254:0 / / rw - ext4 /dev/vda rw\n";
        let x = resolve(&facts(bare, "", 4026532174, &long));
        assert!(x.name.len() <= MAX_NAME && x.name.ends_with("@pidns-4026532174"));
        let h = resolve(&facts(bare, "", HOST_PIDNS, &long));
        assert_eq!(h.name.len(), MAX_NAME);
    }

    #[test]
    fn own_ns_pid_is_read_from_proc() {
        let me = std::process::id();
        let (pid, ns) = ns_pid(me).expect("/proc/self");
        assert!(pid > 0);
        assert!(ns > 0);
        let own = std::fs::read_link("/proc/self/ns/pid").unwrap();
        assert_eq!(own.to_str().unwrap(), format!("pid:[{ns}]"));
        assert!(ns_pid(u32::MAX).is_none());
    }
}
