//! Secure mode (`cgpu-agent --secure`): the agent alone writes the books.
//!
//! The agent owns the ledger directory (root's, mode 0755) and each GPU's
//! ledger in it (root's, mode 0644: containers map it and read it, never
//! write it). Processes of containers ask it for memory over a
//! `SOCK_SEQPACKET` socket, `<ledger dir>/agent.sock` (mode 0666: any
//! process may connect), in the fixed messages of [`cgpu_ledger::wire`].
//! Who asks comes from the kernel: the socket's peer credentials give the
//! caller's pid on the host, and what the host sees of that pid (mounts,
//! cgroup, PID namespace) gives its container. What a container may have
//! comes from the host's settings file for it, never from the caller.
//!
//! One thread serves every connection from one `epoll` loop: a request
//! is a few atomic operations on the mapped ledger, so no caller waits for
//! another's work, and a flood of connections costs a descriptor each, not
//! a thread. Connections are capped per container
//! ([`SecureOptions::max_per_container`]) and in all ([`SecureOptions::max_connections`]).
//!
//! When a connection closes (its process exited or died: the kernel
//! closes its sockets), everything it held is given back and its process
//! slots freed, in the same turn of the loop.

use crate::nvml::{GpuInfo, Nvml};
use crate::sched;
use cgpu_ledger::identity::Identity;
use cgpu_ledger::page;
use cgpu_ledger::settings::{self, DeviceSel, Mode};
use cgpu_ledger::wire::{self, Op, Reply, Request, Status, REPLY_LEN, REQUEST_LEN};
use cgpu_ledger::{JoinRequest, Ledger, Membership, AGENT_MODE, QUOTA_UNLIMITED};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What secure mode is given.
#[derive(Debug, Clone)]
pub struct SecureOptions {
    /// The ledger directory the agent owns.
    pub ledger_dir: PathBuf,
    /// The host's per-container settings (`<dir>/<container id>.env`).
    pub settings_dir: PathBuf,
    /// Connections one container may hold open at once; more are closed
    /// as they come.
    pub max_per_container: usize,
    /// Connections in all.
    pub max_connections: usize,
}

/// Default [`SecureOptions::max_per_container`]: a process of the library
/// holds one connection; 256 processes of one container on one node is
/// already far more than GPUs can serve.
pub const MAX_PER_CONTAINER: usize = 256;
/// Default [`SecureOptions::max_connections`].
pub const MAX_CONNECTIONS: usize = 8192;

/// How long a Hello waits for a ledger's table lock before it answers
/// [`Status::Busy`] (the loop serves everyone else meanwhile only after it).
const JOIN_WAIT: Duration = Duration::from_millis(20);
/// How often processes whose rows were adopted after a restart, and that
/// have not said Hello again, are checked for life.
const ORPHAN_CHECK: Duration = Duration::from_millis(200);
/// Requests served from one connection per turn of the loop (fairness).
const BURST: usize = 64;

/// The settings directory when neither `--settings-dir` nor
/// `CGPU_SETTINGS_DIR` names one.
pub fn default_settings_dir() -> PathBuf {
    match std::env::var_os("CGPU_SETTINGS_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(settings::DEFAULT_SETTINGS_DIR),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Make sure `dir` is a directory only root writes: create it (0755) when
/// missing; refuse one that is a link, not root's, or writable by others.
pub fn own_dir(dir: &Path) -> Result<(), String> {
    if !is_root() {
        return Err("secure mode runs as root (it owns the ledger directory)".into());
    }
    if !dir.is_absolute() {
        return Err(format!("{}: expected an absolute path", dir.display()));
    }
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))?;
            Ok(())
        }
        Err(e) => Err(format!("{}: {e}", dir.display())),
        Ok(m) if m.file_type().is_symlink() => Err(format!(
            "{} is a symbolic link: secure mode owns a real directory",
            dir.display()
        )),
        Ok(m) if !m.is_dir() => Err(format!("{} is not a directory", dir.display())),
        Ok(m) if m.uid() != 0 => Err(format!(
            "{} is owned by uid {}, not root: in secure mode only root may write the books (chown root {0}, or start with another --ledger-dir)",
            dir.display(),
            m.uid()
        )),
        Ok(m) if m.mode() & 0o022 != 0 => Err(format!(
            "{} has mode {:o}: writable by others, it lets them replace the books (chmod 755 {0}; containers then only read it)",
            dir.display(),
            m.mode() & 0o7777
        )),
        Ok(_) => Ok(()),
    }
}

/// After a request, how long the server looks for the next one before it
/// sleeps (see `Server::run`).
const SERVE_SPIN: Duration = Duration::from_micros(50);

/// One GPU served.
struct Gpu {
    info: GpuInfo,
    /// Shared with the compute scheduler's thread (`crate::sched`).
    ledger: Arc<Ledger>,
}

/// One connection's place on one GPU.
struct Joined {
    gpu: usize,
    m: Membership,
}

/// What the kernel says of a connection's process.
#[derive(Debug, Clone)]
struct Peer {
    /// On the host.
    pid: u32,
    /// In its own PID namespace (what it calls itself).
    nspid: i32,
    pidns: u64,
    /// `starttime` of `/proc/<pid>/stat`.
    start: u64,
}

struct Conn {
    fd: i32,
    peer: Option<Peer>,
    ident: Option<Identity>,
    joined: Vec<Joined>,
}

/// A row adopted after a restart whose process has not said Hello again.
struct Orphan {
    gpu: usize,
    pid: u32,
    start: u64,
    m: Membership,
}

/// The server's state.
pub struct Server {
    opts: SecureOptions,
    gpus: Vec<Gpu>,
    listen: i32,
    epoll: i32,
    conns: HashMap<i32, Conn>,
    per_container: HashMap<u64, usize>,
    orphans: Vec<Orphan>,
    /// Since when the listening socket is out of the epoll set (accepting
    /// failed for want of descriptors or memory).
    accept_paused: Option<Instant>,
    /// Time from a connection's end being seen to its bytes being back,
    /// the last one (ns), for the log.
    pub last_release_ns: u64,
    /// The compute scheduler's thread (`None`: it could not start; then
    /// processes are told so and their launches are not held back).
    sched: Option<sched::Handle>,
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `starttime` (field 22) of `/proc/<pid>/stat`.
pub fn start_time(pid: u32) -> Option<u64> {
    crate::proc_stat(pid).map(|(_, start)| start)
}

/// Is another agent serving `sock`? (It answers a connection.)
pub fn agent_alive(sock: &Path) -> bool {
    wire::connect(sock, None).is_ok()
}

/// Opens a connection to the agent's socket at `path` (its descriptor,
/// the caller's to close).
fn connect_to(path: &Path) -> std::io::Result<i32> {
    wire::connect(path, None).map(std::os::fd::IntoRawFd::into_raw_fd)
}

fn ucred(fd: i32) -> Option<libc::ucred> {
    // SAFETY: an all-zero ucred is valid; getsockopt writes at most `len`.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(c)
}

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SO_PEERPIDFD: libc::c_int = 77;

/// The caller's identity with the container id the host's view of its
/// cgroup names (`host_cgroup`: `/proc/<pid>/cgroup` as the agent reads
/// it, which shows the whole path whatever the caller's cgroup
/// namespace). A process cannot leave its container's cgroup (only go
/// below it), whereas its mount table is its own to change (a process
/// that may make a user and mount namespace can bind a file named after
/// another container on `/etc/hostname`): when the two disagree the
/// cgroup wins, for the settings file and, unless the kubelet's bind
/// (inherited, first, and locked in place) named the container, for the
/// row too.
pub(crate) fn pinned_to_cgroup(mut id: Identity, host_cgroup: Option<&str>) -> Identity {
    use cgpu_ledger::identity::{container_id_in_cgroup, key_of_container_id, Source};
    let Some(real) = host_cgroup.and_then(container_id_in_cgroup) else {
        return id;
    };
    if id.container_id.as_deref() == Some(real.as_str()) {
        return id;
    }
    if id.source != Source::Kubelet {
        id.key = key_of_container_id(&real);
        id.name = real[..12].to_string();
        id.source = Source::Cgroup;
    }
    id.container_id = Some(real);
    id
}

/// A pidfd of the process that connected `fd` (`None`: a kernel before
/// 6.5, or another architecture).
fn peer_pidfd(fd: i32) -> Option<i32> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let mut p: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `p` is a writable c_int of `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_PEERPIDFD,
                (&mut p as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (rc == 0 && p >= 0).then_some(p)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = fd;
        None
    }
}

/// Does pidfd `p`'s process still hold its pid (running, or exited and
/// not yet reaped)? Then what was read of that pid was read of it. Closes `p`.
fn pidfd_holds_pid(p: i32) -> bool {
    // SAFETY: signal 0 to our pidfd checks without sending; no siginfo.
    let ok = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            p,
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    } == 0;
    // SAFETY: our descriptor.
    unsafe { libc::close(p) };
    ok
}

impl Server {
    /// Takes the ledger directory, opens (creating) every GPU's ledger,
    /// adopts the rows of live processes a previous agent served, and
    /// listens. Every failure is one message.
    pub fn start(opts: SecureOptions, nvml: &Nvml) -> Result<Server, String> {
        own_dir(&opts.ledger_dir)?;
        let sock = opts.ledger_dir.join(wire::SOCKET_NAME);
        if agent_alive(&sock) {
            return Err(format!(
                "another agent already serves {}: one agent per ledger directory",
                sock.display()
            ));
        }
        let infos = nvml.gpus()?;
        if infos.is_empty() {
            return Err("NVML lists no GPU".into());
        }
        let mut gpus = Vec::new();
        for info in infos {
            // A missing ledger is created (root's, 0644); an existing one is
            // opened as it is: opening to create reaps, and the rows of
            // running processes whose agent was this one's predecessor must
            // be taken over first (nobody holds their liveness locks now).
            let live = Ledger::live_path(&opts.ledger_dir, &info.uuid);
            if std::fs::symlink_metadata(&live).is_err() {
                Ledger::open_or_create_mode(
                    &opts.ledger_dir,
                    &info.uuid,
                    info.index,
                    info.total,
                    AGENT_MODE,
                )
                .map_err(|e| format!("GPU {}: {e}", info.uuid))?;
            }
            private_lock_file(&live)?;
            let ledger = Ledger::open(&live)
                .and_then(|l| {
                    if l.uuid() == info.uuid {
                        Ok(l)
                    } else {
                        Err(cgpu_ledger::LedgerError::Corrupt {
                            path: live.clone(),
                            why: format!("holds GPU {:?}", l.uuid()),
                        })
                    }
                })
                .map_err(|e| format!("GPU {}: {e}", info.uuid))?;
            // A ledger left by the cooperative mode is every uid's: make it
            // the agent's.
            let path = ledger.path().to_owned();
            let m =
                std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            if m.uid() != 0 {
                std::os::unix::fs::chown(&path, Some(0), Some(0))
                    .map_err(|e| format!("cannot chown {}: {e}", path.display()))?;
            }
            if m.mode() & 0o7777 != AGENT_MODE {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(AGENT_MODE))
                    .map_err(|e| format!("cannot chmod {}: {e}", path.display()))?;
            }
            gpus.push(Gpu {
                info,
                ledger: Arc::new(ledger),
            });
        }
        let orphans = adopt_live(&gpus);

        // A socket left by a previous agent (not answering: checked above)
        // is replaced; anything else of that name is not ours to remove.
        match std::fs::symlink_metadata(&sock) {
            Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
                std::fs::remove_file(&sock)
                    .map_err(|e| format!("cannot remove the stale {}: {e}", sock.display()))?;
            }
            Ok(_) => {
                return Err(format!(
                    "{} exists and is not a socket: not replaced",
                    sock.display()
                ))
            }
            Err(_) => {}
        }
        // SAFETY: plain socket(2).
        let listen = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if listen < 0 {
            return Err(format!("socket: {}", errno()));
        }
        let (a, len) = wire::sockaddr(&sock).map_err(|e| e.to_string())?;
        // SAFETY: a valid address of `len` bytes.
        if unsafe { libc::bind(listen, (&a as *const libc::sockaddr_un).cast(), len) } != 0 {
            return Err(format!("bind {}: {}", sock.display(), errno()));
        }
        // Any process may connect: who it is comes from the kernel.
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| format!("chmod {}: {e}", sock.display()))?;
        // SAFETY: a bound socket.
        if unsafe { libc::listen(listen, 1024) } != 0 {
            return Err(format!("listen {}: {}", sock.display(), errno()));
        }
        // SAFETY: plain epoll_create1(2).
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(format!("epoll_create1: {}", errno()));
        }
        let sched = match sched::start(gpus.iter().map(|g| g.ledger.clone()).collect()) {
            Ok(h) => Some(h),
            Err(e) => {
                eprintln!("cgpu-agent: cannot start the compute scheduler ({e}): compute shares are not enforced");
                None
            }
        };
        let s = Server {
            sched,
            opts,
            gpus,
            listen,
            epoll,
            conns: HashMap::new(),
            per_container: HashMap::new(),
            orphans,
            accept_paused: None,
            last_release_ns: 0,
        };
        s.watch(listen, libc::EPOLLIN as u32)?;
        raise_fd_limit();
        Ok(s)
    }

    /// The GPUs served: (index, UUID, ledger path).
    pub fn gpus(&self) -> Vec<(u32, String, PathBuf)> {
        self.gpus
            .iter()
            .map(|g| {
                (
                    g.info.index,
                    g.info.uuid.clone(),
                    g.ledger.path().to_owned(),
                )
            })
            .collect()
    }

    /// Rows of live processes adopted at start that no process claimed yet.
    pub fn orphans(&self) -> usize {
        self.orphans.len()
    }

    fn watch(&self, fd: i32, events: u32) -> Result<(), String> {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: a valid epoll instance, descriptor and event.
        if unsafe { libc::epoll_ctl(self.epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            return Err(format!("epoll_ctl: {}", errno()));
        }
        Ok(())
    }

    /// Serves until the process ends.
    pub fn run(mut self) -> ! {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut last_check = Instant::now();
        // After a request, the loop looks for the next one without sleeping
        // for `SERVE_SPIN` (requests come in bursts: an allocation after a
        // free; a thread woken on an idle CPU costs tens of microseconds).
        let mut spin_until: Option<Instant> = None;
        loop {
            let spinning = spin_until.is_some_and(|t| Instant::now() < t);
            // SAFETY: `events` holds that many entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll,
                    events.as_mut_ptr(),
                    events.len() as i32,
                    if spinning {
                        0
                    } else {
                        ORPHAN_CHECK.as_millis() as i32
                    },
                )
            };
            let n = if n < 0 { 0 } else { n as usize };
            let mut served = false;
            for ev in &events[..n] {
                let fd = ev.u64 as i32;
                if fd == self.listen {
                    self.accept_all();
                } else {
                    served |= self.serve(fd);
                }
            }
            if served {
                spin_until = Some(Instant::now() + SERVE_SPIN);
            } else if spinning && n == 0 {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
                continue;
            }
            if self
                .accept_paused
                .is_some_and(|t| t.elapsed() >= ORPHAN_CHECK)
                && self.watch(self.listen, libc::EPOLLIN as u32).is_ok()
            {
                self.accept_paused = None;
            }
            if !self.orphans.is_empty() && last_check.elapsed() >= ORPHAN_CHECK {
                last_check = Instant::now();
                self.reap_orphans();
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            // SAFETY: a listening socket; no address wanted.
            let fd = unsafe {
                libc::accept4(
                    self.listen,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if fd < 0 {
                // EAGAIN: all taken. Out of descriptors or memory: the
                // connection stays queued, and the level-triggered socket
                // would wake the loop again at once, forever; it is left
                // out of the set for one check interval instead.
                let e = errno().raw_os_error();
                if matches!(
                    e,
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) && self.accept_paused.is_none()
                {
                    // SAFETY: our epoll instance and listening socket.
                    unsafe {
                        libc::epoll_ctl(
                            self.epoll,
                            libc::EPOLL_CTL_DEL,
                            self.listen,
                            std::ptr::null_mut(),
                        )
                    };
                    self.accept_paused = Some(Instant::now());
                }
                return;
            }
            // The connecting process itself (not its pid, which may be
            // another process's by the time /proc is read).
            let pidfd = peer_pidfd(fd);
            let peer = ucred(fd).and_then(|c| {
                let pid = u32::try_from(c.pid).ok().filter(|&p| p > 0)?;
                let start = start_time(pid)?;
                let (nspid, pidns) = cgpu_ledger::identity::ns_pid(pid).unwrap_or((0, 0));
                Some(Peer {
                    pid,
                    nspid,
                    pidns,
                    start,
                })
            });
            let ident = peer.as_ref().and_then(|p| {
                let id = cgpu_ledger::identity::of_pid(p.pid, None)?;
                let id = pinned_to_cgroup(
                    id,
                    cgpu_ledger::identity::read_proc(&format!("/proc/{}/cgroup", p.pid)).as_deref(),
                );
                // The process is still the one whose credentials came with
                // the connection (not a pid reused meanwhile).
                (start_time(p.pid) == Some(p.start)).then_some(id)
            });
            // What was read of the pid was read of the process that
            // connected only if that process still held the pid after
            // the reads (its pid reused between its connect and this
            // accept would name another container's process).
            let (peer, ident) = match pidfd {
                Some(p) if !pidfd_holds_pid(p) => (None, None),
                _ => (peer, ident),
            };
            let key = ident.as_ref().map_or(0, |i| i.key);
            let count = self.per_container.get(&key).copied().unwrap_or(0);
            if self.conns.len() >= self.opts.max_connections || count >= self.opts.max_per_container
            {
                // SAFETY: our descriptor; the caller sees the connection end.
                unsafe { libc::close(fd) };
                continue;
            }
            if self
                .watch(fd, (libc::EPOLLIN | libc::EPOLLRDHUP) as u32)
                .is_err()
            {
                // SAFETY: our descriptor.
                unsafe { libc::close(fd) };
                continue;
            }
            *self.per_container.entry(key).or_default() += 1;
            self.conns.insert(
                fd,
                Conn {
                    fd,
                    peer,
                    ident,
                    joined: Vec::new(),
                },
            );
        }
    }

    /// Serves what `fd` sent (at most [`BURST`] requests a turn); ends
    /// the connection when its peer closed it, sent something malformed or
    /// does not read its replies.
    fn serve(&mut self, fd: i32) -> bool {
        let mut buf = [0u8; REQUEST_LEN + 1];
        let mut end = false;
        let mut served = false;
        for _ in 0..BURST {
            // MSG_TRUNC: the packet's real length, however long.
            // SAFETY: `buf` holds `buf.len()` writable bytes.
            let n = unsafe {
                libc::recv(
                    fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                )
            };
            if n < 0 {
                // Nothing more for now (level-triggered: the rest wakes
                // the loop again), or the connection failed.
                end = errno().kind() != std::io::ErrorKind::WouldBlock;
                break;
            }
            if n == 0 {
                end = true; // the peer closed: its process exited or died
                break;
            }
            let n = n as usize;
            match Request::decode(&buf[..n.min(buf.len())]) {
                Ok(req) if req.op == Op::Sched => {
                    // The connection becomes the process's scheduling
                    // connection (or ends): nothing more is served here.
                    self.sched_join(fd, &req);
                    return true;
                }
                Ok(req) => {
                    served = true;
                    let r = self.answer(fd, &req);
                    if !send_reply(fd, &r) {
                        end = true;
                        break;
                    }
                }
                Err(_) => {
                    // Malformed: one refusal, then the connection ends.
                    let seq = if n >= 16 {
                        u64::from_le_bytes(buf[8..16].try_into().unwrap_or([0; 8]))
                    } else {
                        0
                    };
                    send_reply(fd, &Reply::refuse(Status::BadRequest, seq));
                    end = true;
                    break;
                }
            }
        }
        if end {
            self.close(fd);
        }
        served
    }

    /// Ends a connection: everything it held goes back to its containers
    /// and its process slots are freed, now.
    fn close(&mut self, fd: i32) {
        let t0 = Instant::now();
        let Some(conn) = self.conns.remove(&fd) else {
            return;
        };
        for j in &conn.joined {
            self.gpus[j.gpu].ledger.leave(&j.m);
        }
        let key = conn.ident.as_ref().map_or(0, |i| i.key);
        if let Some(c) = self.per_container.get_mut(&key) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                self.per_container.remove(&key);
            }
        }
        // SAFETY: our descriptor (closing removes it from the epoll set).
        unsafe { libc::close(conn.fd) };
        if !conn.joined.is_empty() {
            self.last_release_ns = t0.elapsed().as_nanos() as u64;
        }
    }

    fn answer(&mut self, fd: i32, req: &Request) -> Reply {
        let seq = req.seq;
        let Some(g) = self
            .gpus
            .iter()
            .position(|g| g.info.uuid.eq_ignore_ascii_case(req.gpu_str()))
        else {
            return Reply::refuse(Status::NoGpu, seq);
        };
        match req.op {
            Op::Hello => self.hello(fd, g, seq),
            // Served by `sched_join`.
            Op::Sched => Reply::refuse(Status::BadRequest, seq),
            Op::Reserve | Op::Release => {
                let Some(conn) = self.conns.get(&fd) else {
                    return Reply::refuse(Status::Unknown, seq);
                };
                let Some(j) = conn.joined.iter().find(|j| j.gpu == g) else {
                    return Reply::refuse(Status::NotJoined, seq);
                };
                let ledger = &self.gpus[g].ledger;
                let status = if req.op == Op::Reserve {
                    match ledger.try_reserve(&j.m, req.bytes) {
                        Ok(()) => Status::Ok,
                        Err(_) => Status::OverQuota,
                    }
                } else {
                    // Never more than this connection holds there.
                    let held = ledger.file().processes[j.m.process]
                        .used
                        .load(std::sync::atomic::Ordering::Acquire);
                    ledger.release(&j.m, req.bytes.min(held));
                    Status::Ok
                };
                numbers(ledger, &j.m, status, seq)
            }
        }
    }

    fn hello(&mut self, fd: i32, g: usize, seq: u64) -> Reply {
        let Some(conn) = self.conns.get(&fd) else {
            return Reply::refuse(Status::Unknown, seq);
        };
        if let Some(j) = conn.joined.iter().find(|j| j.gpu == g) {
            return numbers(&self.gpus[g].ledger, &j.m, Status::Ok, seq);
        }
        let (Some(peer), Some(ident)) = (conn.peer.clone(), conn.ident.clone()) else {
            return Reply::refuse(Status::Unknown, seq);
        };
        // The process still is the one that connected.
        if start_time(peer.pid) != Some(peer.start) {
            return Reply::refuse(Status::Unknown, seq);
        }
        let Some(path) = settings_path(&self.opts.settings_dir, &ident) else {
            return Reply::refuse(Status::Unknown, seq);
        };
        if ident.source == cgpu_ledger::identity::Source::Kubelet
            && !kubelet_bind_is_its_pods(peer.pid, ident.key)
        {
            return Reply::refuse(Status::Unknown, seq);
        }
        let gpu = &self.gpus[g];
        let req = match settings_at(&path, &gpu.info) {
            Ok(Some(r)) => r,
            Ok(None) => return Reply::refuse(Status::NoGpu, seq),
            Err(_) => return Reply::refuse(Status::Unknown, seq),
        };
        // A process whose row was adopted after a restart gets it back.
        if let Some(i) = self
            .orphans
            .iter()
            .position(|o| o.gpu == g && o.pid == peer.pid && o.start == peer.start)
        {
            let o = self.orphans.swap_remove(i);
            let r = numbers(&gpu.ledger, &o.m, Status::Ok, seq);
            if let Some(c) = self.conns.get_mut(&fd) {
                c.joined.push(Joined { gpu: g, m: o.m });
            }
            return r;
        }
        let name = req.name.clone().unwrap_or_else(|| ident.name.clone());
        let jr = JoinRequest {
            container_id: &name,
            key: ident.key,
            quota: req.quota,
            weight: req.weight,
            highprio: req.highprio,
            enforce_off: req.enforce_off,
        };
        let m = match gpu.ledger.join_within(&jr, JOIN_WAIT) {
            Ok(m) => m,
            Err(e) if e.is_busy() => return Reply::refuse(Status::Busy, seq),
            Err(_) => return Reply::refuse(Status::Unknown, seq),
        };
        let f = gpu.ledger.file();
        // The slot names the caller, not the agent that claimed it for it.
        let p = &f.processes[m.process];
        use std::sync::atomic::Ordering::Release;
        p.pid.store(peer.nspid, Release);
        p.pidns.store(peer.pidns, Release);
        p.start_time.store(peer.start, Release);
        p.set_host_pid(peer.pid);
        let r = numbers(&gpu.ledger, &m, Status::Ok, seq);
        if let Some(c) = self.conns.get_mut(&fd) {
            c.joined.push(Joined { gpu: g, m });
        }
        r
    }

    /// `Op::Sched` on `fd`: hand the process a scheduling page for GPU
    /// `req.gpu` and the connection to the scheduler's thread. The process
    /// must have joined that GPU on another connection (its memory one):
    /// the scheduler places it in that container and process slot.
    fn sched_join(&mut self, fd: i32, req: &Request) {
        let seq = req.seq;
        let refuse = |s: &mut Server, status: Status| {
            send_reply(fd, &Reply::refuse(status, seq));
            s.close(fd);
        };
        let Some(g) = self
            .gpus
            .iter()
            .position(|g| g.info.uuid.eq_ignore_ascii_case(req.gpu_str()))
        else {
            return refuse(self, Status::NoGpu);
        };
        let Some(conn) = self.conns.get(&fd) else {
            return;
        };
        // A scheduling connection carries nothing else: one that joined a
        // GPU keeps its memberships on this loop (closed with them).
        if !conn.joined.is_empty() {
            return refuse(self, Status::BadRequest);
        }
        let Some(peer) = conn.peer.clone() else {
            return refuse(self, Status::Unknown);
        };
        if start_time(peer.pid) != Some(peer.start) {
            return refuse(self, Status::Unknown);
        }
        let joined = self.conns.values().find_map(|c| {
            let same = c.fd != fd
                && c.peer
                    .as_ref()
                    .is_some_and(|p| p.pid == peer.pid && p.start == peer.start);
            same.then(|| {
                c.joined
                    .iter()
                    .find(|j| j.gpu == g)
                    .map(|j| (j.m.container, j.m.process))
            })
            .flatten()
        });
        let Some((container, process)) = joined else {
            return refuse(self, Status::NotJoined);
        };
        let Some(h) = self.sched.clone().filter(|h| h.alive()) else {
            return refuse(self, Status::Unknown);
        };
        let key_now = self.gpus[g].ledger.file().containers[container]
            .key
            .load(std::sync::atomic::Ordering::Acquire);
        let made = page::create("cgpu-sched").and_then(|pf| {
            let pg = page::map(pf.as_raw_fd())?;
            let c = &self.gpus[g].ledger.file().containers[container];
            let r = Reply {
                status: Status::Ok,
                seq,
                used: c.used.load(std::sync::atomic::Ordering::Acquire),
                quota: c.quota.load(std::sync::atomic::Ordering::Acquire),
                container: container as u32,
                process: process as u32,
            };
            if let Err(e) = page::send_fds(fd, &r.encode(), &[pf.as_raw_fd()]) {
                // SAFETY: mapped just above, referenced nowhere else.
                unsafe { page::unmap(pg) };
                return Err(e);
            }
            Ok(pg)
        });
        let pg = match made {
            Ok(pg) => pg,
            Err(e) => {
                eprintln!(
                    "cgpu-agent: cannot hand pid {} its scheduling page: {e}",
                    peer.pid
                );
                return refuse(self, Status::Busy);
            }
        };
        // The connection leaves this loop (and its count) for the scheduler's.
        let Some(conn) = self.conns.remove(&fd) else {
            return;
        };
        let key = conn.ident.as_ref().map_or(0, |i| i.key);
        if let Some(c) = self.per_container.get_mut(&key) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                self.per_container.remove(&key);
            }
        }
        // SAFETY: our epoll instance and descriptor.
        unsafe { libc::epoll_ctl(self.epoll, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        // SAFETY: the descriptor is no longer in `conns`: owned from here.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        h.add(sched::Participant::new(
            owned,
            g,
            (container, process, key_now),
            peer.pid,
            pg,
        ));
    }

    /// Gives back the rows of adopted processes that have ended.
    fn reap_orphans(&mut self) {
        let mut i = 0;
        while i < self.orphans.len() {
            let o = &self.orphans[i];
            if start_time(o.pid) == Some(o.start) {
                i += 1;
                continue;
            }
            let o = self.orphans.swap_remove(i);
            self.gpus[o.gpu].ledger.leave(&o.m);
        }
    }
}

/// The row's numbers for a reply.
fn numbers(ledger: &Ledger, m: &Membership, status: Status, seq: u64) -> Reply {
    use std::sync::atomic::Ordering::Acquire;
    let c = &ledger.file().containers[m.container];
    let quota = c.quota.load(Acquire);
    Reply {
        status,
        seq,
        used: c.used.load(Acquire),
        quota: if quota == 0 || c.enforce_off.load(Acquire) != 0 {
            u64::MAX
        } else {
            quota
        },
        container: m.container as u32,
        process: m.process as u32,
    }
}

fn send_reply(fd: i32, r: &Reply) -> bool {
    let b = r.encode();
    // SAFETY: `b` holds REPLY_LEN bytes.
    let n = unsafe {
        libc::send(
            fd,
            b.as_ptr().cast(),
            REPLY_LEN,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    // A caller that does not read its replies (its buffer full) is ended.
    n == REPLY_LEN as isize
}

/// What the host's settings give a container on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSettings {
    /// For [`JoinRequest::quota`].
    pub quota: u64,
    pub weight: u32,
    pub highprio: bool,
    pub enforce_off: bool,
    /// `CGPU_CONTAINER_ID` in the file: the name the row is shown by.
    pub name: Option<String>,
}

/// The host's settings for container `cid` on `gpu`: `Ok(None)` when they
/// do not make the GPU visible to it, `Err` when there are none or they
/// cannot be read or parsed (the container then gets nothing).
pub fn host_settings(dir: &Path, cid: &str, gpu: &GpuInfo) -> Result<Option<HostSettings>, String> {
    if cid.len() != 64 || !cid.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("{cid:?} is not a runtime container id"));
    }
    settings_at(&dir.join(format!("{cid}.env")), gpu)
}

/// The name of the settings file the device plugin writes for a Kubernetes
/// container: its ledger key (the pod's uid and the container's name, from
/// the kubelet's per-container bind), known before the container exists.
pub fn kubelet_settings_name(key: u64) -> String {
    format!("k8s-{key:016x}.env")
}

/// Which of the host's settings files is a container's: for a Kubernetes
/// container, the one the device plugin wrote for it when there is one;
/// else (and for other containers) `<runtime container id>.env`. `None`:
/// the container has no name the host's files can be found by.
pub fn settings_path(dir: &Path, ident: &Identity) -> Option<PathBuf> {
    use cgpu_ledger::identity::Source;
    if ident.source == Source::Kubelet {
        let p = dir.join(kubelet_settings_name(ident.key));
        if p.symlink_metadata().is_ok() || ident.container_id.is_none() {
            return Some(p);
        }
    }
    let cid = ident.container_id.as_deref()?;
    if cid.len() != 64 || !cid.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    Some(dir.join(format!("{cid}.env")))
}

/// Does the kubelet bind that named a process's container belong to the
/// pod whose cgroup the process is in? A process that can make mounts (in
/// a user namespace of its own) could hide its own bind by changing its
/// root and show another pod's path; it cannot leave its pod's cgroup. The
/// kubelet names each pod's cgroup by the pod's uid (`pod<uid>` with the
/// cgroupfs driver, `…-pod<uid with _ for ->.slice` with systemd's), which
/// shows in `/proc/<pid>/cgroup` as the agent reads it, whatever cgroup
/// namespaces the two are in. True when a kubelet bind of that pod uid in
/// the process's mounts gives the identity's key `key`.
pub fn kubelet_bind_is_its_pods(pid: u32, key: u64) -> bool {
    let read = |f: &str| cgpu_ledger::identity::read_proc(&format!("/proc/{pid}/{f}"));
    let (Some(cgroup), Some(mountinfo)) = (read("cgroup"), read("mountinfo")) else {
        return false;
    };
    bind_is_pods(&cgroup, &mountinfo, key)
}

/// [`kubelet_bind_is_its_pods`] on a process's cgroup and mountinfo files.
fn bind_is_pods(cgroup: &str, mountinfo: &str, key: u64) -> bool {
    pod_uids_in_cgroup(cgroup).iter().any(|uid| {
        let prefix = format!("/pods/{uid}/containers/");
        mountinfo.lines().any(|l| {
            let root = l.split(' ').nth(3).unwrap_or("");
            root.find(&prefix)
                .and_then(|i| root[i + prefix.len()..].split('/').next())
                .filter(|name| !name.is_empty())
                .is_some_and(|name| {
                    cgpu_ledger::identity::key_of("k8s", &format!("{uid}/{name}")) == key
                })
        })
    })
}

/// The pod uid a cgroup file names (`pod` then 36 characters of a uid, its
/// `_` read as `-`): in each hierarchy's path the outermost one, the
/// kubelet's, which the container is below and cannot leave (a container
/// that can write its cgroup tree can name a cgroup of its own `pod<uid>`,
/// only below it). Hierarchies that name different pods name none.
pub fn pod_uids_in_cgroup(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        let Some(uid) = path
            .match_indices("pod")
            .filter_map(|(i, _)| pod_uid_at(path, i + 3))
            .next()
        else {
            continue;
        };
        if !out.contains(&uid) {
            out.push(uid);
        }
    }
    if out.len() > 1 {
        out.clear();
    }
    out
}

/// The pod uid at byte `i` of `path`, if 36 characters of one are there.
fn pod_uid_at(path: &str, i: usize) -> Option<String> {
    let uid = path.get(i..i + 36)?.replace('_', "-");
    let ok = uid.char_indices().all(|(j, c)| {
        if matches!(j, 8 | 13 | 18 | 23) {
            c == '-'
        } else {
            c.is_ascii_hexdigit()
        }
    });
    ok.then_some(uid)
}

/// The host's settings in the file at `path` for `gpu` (as
/// [`host_settings`]).
pub fn settings_at(path: &Path, gpu: &GpuInfo) -> Result<Option<HostSettings>, String> {
    let path_s = path.to_string_lossy().into_owned();
    let text = settings::read_settings_file(&path_s)?;
    let (cfg, failed) = settings::with_settings_file(&|_| None, None, &path_s, Ok(text));
    if let Some(e) = failed {
        return Err(e);
    }
    let i = match &cfg.visible {
        None => gpu.index as usize,
        Some(list) => match list.iter().position(|s| match s {
            DeviceSel::Index(i) => *i == gpu.index,
            DeviceSel::Uuid(u) => u.eq_ignore_ascii_case(&gpu.uuid),
        }) {
            Some(i) => i,
            None => return Ok(None),
        },
    };
    let quota = match cfg.mode {
        Mode::PassThrough => QUOTA_UNLIMITED,
        _ => cfg.quota_bytes(i, gpu.total).unwrap_or(QUOTA_UNLIMITED),
    };
    Ok(Some(HostSettings {
        quota,
        weight: cfg.weight.unwrap_or(1),
        highprio: cfg.high_prio,
        enforce_off: cfg.mode == Mode::Record,
        name: cfg.container_name.clone(),
    }))
}

/// After a restart: the rows of processes that are still alive (their
/// start time is the one in the slot) are held again by this agent, their
/// bytes still counted; then the rows of processes that are gone are
/// reaped (their bytes go back).
fn adopt_live(gpus: &[Gpu]) -> Vec<Orphan> {
    use std::sync::atomic::Ordering::Acquire;
    let mut out = Vec::new();
    for (g, gpu) in gpus.iter().enumerate() {
        let f = gpu.ledger.file();
        for (i, p) in f.processes.iter().enumerate() {
            if p.state.load(Acquire) != cgpu_ledger::SLOT_LIVE || gpu.ledger.is_alive(i) {
                continue;
            }
            let Some(pid) = p.host_pid() else { continue };
            let start = p.start_time.load(Acquire);
            if start_time(pid) != Some(start) {
                continue;
            }
            if let Some(m) = gpu.ledger.adopt(i) {
                out.push(Orphan {
                    gpu: g,
                    pid,
                    start,
                    m,
                });
            }
        }
        gpu.ledger.reap();
    }
    out
}

/// The ledger's private lock file (root's, 0600): the agent's table and
/// liveness locks go there, where no tenant can take a lock that would
/// stall them (a reader of the ledger could lock the ledger itself).
fn private_lock_file(ledger: &Path) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = Ledger::lock_file_path(ledger);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("cannot make {}: {e}", path.display()))?;
    let m = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !m.is_file() || m.uid() != 0 {
        return Err(format!("{} is not a file of root's", path.display()));
    }
    if m.mode() & 0o7777 != 0o600 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("cannot chmod {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Lets the loop hold as many connections as the hard limit allows.
fn raise_fd_limit() {
    // SAFETY: plain getrlimit/setrlimit on a valid struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// `cgpu-agent client SOCKET`: speaks the wire protocol with commands read
/// from standard input, one reply line per command, for diagnosis inside a
/// container and for tests. Commands: `hello UUID`, `reserve UUID BYTES`,
/// `release UUID BYTES`, `raw HEX` (send these bytes as one message),
/// `flood N` (open N more connections, say Hello on each to `UUID` given
/// by the last hello, print how many were answered), `unflood` (close
/// them), `reconnect`, `bench UUID N` (N timed round trips of a Reserve
/// and a Release of 4 KiB: p50, p99, max), `lock-read PATH` (hold a read lock on all of a
/// file, as any reader may), `open-write PATH` (try to open a file for writing,
/// print the errno), `exec PROGRAM ARGS...` (become that program, the
/// connection kept open: the same process then uses the GPU with what the
/// agent granted it still charged to it). It connects at its first command.
pub fn client(sock: &Path) -> i32 {
    use std::io::{BufRead, Write};
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut seq = 0u64;
    let mut last_gpu = String::new();
    let mut extra: Vec<i32> = Vec::new();
    // Connected at the first command that needs it (and again after
    // `reconnect`), so that the process can be placed first.
    let mut fd: Option<i32> = None;
    // A scheduling page the agent handed over (`sched`), kept mapped, and
    // its connection and the container slot it names.
    let mut page: Option<&'static page::Page> = None;
    let mut sched: Option<(i32, u32)> = None;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let w: Vec<&str> = line.split_whitespace().collect();
        seq += 1;
        if matches!(w.first(), Some(&"reconnect")) {
            if let Some(old) = fd.take() {
                // SAFETY: our descriptor.
                unsafe { libc::close(old) };
            }
        }
        let needs = matches!(
            w.first(),
            Some(&("hello" | "reserve" | "release" | "raw" | "reconnect" | "bench" | "sched-here"))
        );
        if needs && fd.is_none() {
            match connect_to(sock) {
                Ok(c) => fd = Some(c),
                Err(e) => {
                    let _ = writeln!(out, "error connect: {e}");
                    let _ = out.flush();
                    continue;
                }
            }
        }
        let c = fd.unwrap_or(-1);
        let text = match w.as_slice() {
            ["reconnect"] => "connected".to_string(),
            ["hello", gpu] => {
                last_gpu = gpu.to_string();
                exchange_req(c, Op::Hello, seq, gpu, 0)
            }
            ["reserve", gpu, n] => exchange_req(c, Op::Reserve, seq, gpu, n.parse().unwrap_or(0)),
            ["release", gpu, n] => exchange_req(c, Op::Release, seq, gpu, n.parse().unwrap_or(0)),
            ["raw", hex] => {
                let bytes: Vec<u8> = (0..hex.len() / 2)
                    .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
                    .collect();
                exchange(c, &bytes)
            }
            ["flood", n] => {
                let n: usize = n.parse().unwrap_or(0);
                let (mut answered, mut refused) = (0, 0);
                for _ in 0..n {
                    match connect_to(sock) {
                        Ok(x) => {
                            extra.push(x);
                            let r = exchange_req(x, Op::Hello, seq, &last_gpu, 0);
                            if r.starts_with("reply") {
                                answered += 1;
                            } else {
                                refused += 1;
                            }
                        }
                        Err(_) => refused += 1,
                    }
                }
                format!("flood answered={answered} refused={refused}")
            }
            ["unflood"] => {
                for x in extra.drain(..) {
                    // SAFETY: our descriptors.
                    unsafe { libc::close(x) };
                }
                "unflooded".to_string()
            }
            ["bench", gpu, n] => {
                // Round trips of a Reserve and its Release, each timed.
                let n: usize = n.parse().unwrap_or(0).max(1);
                let mut ns = Vec::with_capacity(2 * n);
                let mut bad = 0usize;
                for i in 0..n {
                    for op in [Op::Reserve, Op::Release] {
                        let t0 = Instant::now();
                        let r = exchange_req(c, op, i as u64, gpu, 4096);
                        ns.push(t0.elapsed().as_nanos() as u64);
                        if !r.contains("status=Ok") {
                            bad += 1;
                        }
                    }
                }
                ns.sort_unstable();
                let q = |f: f64| ns[((ns.len() - 1) as f64 * f) as usize];
                format!(
                    "bench n={} bad={bad} p50_ns={} p99_ns={} max_ns={}",
                    ns.len(),
                    q(0.5),
                    q(0.99),
                    ns[ns.len() - 1]
                )
            }
            ["sched", gpu] => {
                let (text, got) = sched_attach(sock, seq, gpu);
                if let Some((x, p, c)) = got {
                    extra.push(x);
                    sched = Some((x, c));
                    page = Some(p);
                }
                text
            }
            // `Sched` on the connection that said `Hello` (refused).
            ["sched-here", gpu] => exchange_req(c, Op::Sched, seq, gpu, 0),
            ["ring", n] => match sched {
                // `n` wake-up packets as fast as they go (a flood).
                Some((x, _)) => {
                    let n: u64 = n.parse().unwrap_or(1);
                    let mut sent = 0u64;
                    for _ in 0..n {
                        // SAFETY: our connection; one byte from a live buffer.
                        let r =
                            unsafe { libc::send(x, [1u8].as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
                        sent += u64::from(r == 1);
                    }
                    format!("rang {sent}")
                }
                None => "error no sched".to_string(),
            },
            ["stall", gpu, ms, every] => match (sched, page) {
                // For `ms`: always wants the GPU and, whenever its
                // container holds it, says it launched in that slice and
                // never drains; takes a fresh scheduling connection every
                // `every` ms (a hostile process).
                (Some((_, mut container)), Some(mut p)) => {
                    let ms: u64 = ms.parse().unwrap_or(0);
                    let every = Duration::from_millis(every.parse().unwrap_or(500));
                    let dir = sock.parent().unwrap_or(Path::new("/"));
                    match Ledger::open_read_only(&Ledger::live_path(dir, gpu)) {
                        Ok(l) => {
                            let t0 = Instant::now();
                            let mut fresh = Instant::now();
                            let mut again = 0;
                            while t0.elapsed() < Duration::from_millis(ms) {
                                let t = cgpu_ledger::words::Token::unpack(
                                    l.file().header.sched[cgpu_ledger::words::gpu::TOKEN]
                                        .load(std::sync::atomic::Ordering::Acquire),
                                );
                                // It always wants the GPU.
                                p.w(page::word::WANTS)
                                    .store(1, std::sync::atomic::Ordering::SeqCst);
                                if t.state == cgpu_ledger::words::RUNNING
                                    && t.holder == Some(container as usize)
                                {
                                    p.w(page::word::LAUNCHED).store(
                                        u64::from(t.seq),
                                        std::sync::atomic::Ordering::SeqCst,
                                    );
                                }
                                if fresh.elapsed() >= every {
                                    fresh = Instant::now();
                                    if let (_, Some((x, np, c))) = sched_attach(sock, seq, gpu) {
                                        extra.push(x);
                                        p = np;
                                        container = c;
                                        again += 1;
                                    }
                                }
                                std::thread::sleep(Duration::from_micros(200));
                            }
                            format!("stalled reconnected={again}")
                        }
                        Err(e) => format!("error {e}"),
                    }
                }
                _ => "error no sched".to_string(),
            },
            ["scribble", n] => match page {
                // Garbage in every word of its own page, `n` rounds (a
                // hostile process: it may write its page as it likes).
                Some(p) => {
                    let n: u64 = n.parse().unwrap_or(1);
                    let mut x = 0x9E37_79B9_7F4A_7C15u64;
                    for _ in 0..n {
                        for w in p.words.iter() {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            w.store(x, std::sync::atomic::Ordering::Relaxed);
                        }
                        p.w(page::word::WANTS)
                            .store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    format!("scribbled {n}")
                }
                None => "error no page".to_string(),
            },
            ["lock-read", path] => match lock_read(path) {
                Ok(l) => {
                    extra.push(l);
                    "locked".to_string()
                }
                Err(e) => format!("lock errno={}", e.raw_os_error().unwrap_or(0)),
            },
            ["open-write", path] => match std::fs::OpenOptions::new().write(true).open(path) {
                Ok(_) => "open ok".to_string(),
                Err(e) => format!("open errno={}", e.raw_os_error().unwrap_or(0)),
            },
            ["exec", prog, args @ ..] => {
                // The connection stays open across the exec (same process,
                // same pid): what it was granted stays this process's.
                if let Some(c) = fd {
                    // SAFETY: fcntl on our own descriptor.
                    unsafe { libc::fcntl(c, libc::F_SETFD, 0) };
                }
                let _ = out.flush();
                let e = std::os::unix::process::CommandExt::exec(
                    std::process::Command::new(prog).args(args),
                );
                format!("exec error {e}")
            }
            _ => "error unknown command".to_string(),
        };
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
    0
}

/// Opens `path` for reading and takes a read lock on all of it (an open
/// file description lock, as the ledger's own): what any reader can do.
fn lock_read(path: &str) -> std::io::Result<i32> {
    use std::os::unix::io::IntoRawFd;
    let f = std::fs::File::open(path)?;
    let fd = f.into_raw_fd();
    // SAFETY: an all-zero flock is valid; then a whole-file read lock.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_RDLCK as i16;
    l.l_whence = libc::SEEK_SET as i16;
    // SAFETY: our descriptor and a valid flock.
    if unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &l) } != 0 {
        let e = errno();
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    Ok(fd)
}

/// `Sched` on a new connection: the answer line, and the connection, its
/// page (mapped, leaked) and the container slot it names when granted.
fn sched_attach(
    sock: &Path,
    seq: u64,
    gpu: &str,
) -> (String, Option<(i32, &'static page::Page, u32)>) {
    let x = match connect_to(sock) {
        Ok(x) => x,
        Err(e) => return (format!("error connect: {e}"), None),
    };
    let r = Request::new(Op::Sched, seq, gpu, 0).map(|r| r.encode());
    let sent = r.is_some_and(|b| {
        // SAFETY: `b` holds that many bytes.
        let n = unsafe { libc::send(x, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
        n == b.len() as isize
    });
    let mut b = [0u8; 256];
    let (text, got) = match page::recv_fds(x, &mut b) {
        Ok((n, fds)) if sent && n > 0 => {
            let reply = Reply::decode(&b[..n.min(b.len())]);
            let mapped = fds.first().and_then(|f| page::map(f.as_raw_fd()).ok());
            let text = match &reply {
                Ok(r) => format!(
                    "sched {:?} container={} page={}",
                    r.status,
                    r.container,
                    mapped.is_some()
                ),
                Err(e) => format!("sched error {e}"),
            };
            let got = match (reply, mapped) {
                (Ok(r), Some(p)) if r.status == Status::Ok => Some((x, p, r.container)),
                _ => None,
            };
            (text, got)
        }
        _ => ("sched closed".to_string(), None),
    };
    if got.is_none() {
        // SAFETY: our descriptor, not kept.
        unsafe { libc::close(x) };
    }
    (text, got)
}

fn exchange_req(fd: i32, op: Op, seq: u64, gpu: &str, bytes: u64) -> String {
    match Request::new(op, seq, gpu, bytes) {
        Some(r) => exchange(fd, &r.encode()),
        None => "error not a request".to_string(),
    }
}

/// Sends one message and reads one reply: `reply status=… seq=… used=…
/// quota=… container=… process=…`, or `closed`.
fn exchange(fd: i32, msg: &[u8]) -> String {
    // SAFETY: `msg` holds that many bytes.
    let n = unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        return "closed".into();
    }
    let mut b = [0u8; 256];
    // SAFETY: `b` holds that many writable bytes.
    let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), 0) };
    if n <= 0 {
        return "closed".into();
    }
    match Reply::decode(&b[..n as usize]) {
        Ok(r) => format!(
            "reply status={:?} seq={} used={} quota={} container={} process={}",
            r.status, r.seq, r.used, r.quota, r.container, r.process
        ),
        Err(e) => format!("error {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cgpu_ledger::identity::{key_of_container_id, resolve, Facts, Source};

    #[test]
    fn pod_uids_are_read_from_either_cgroup_driver() {
        let uid = "0f6c1b7e-5a1d-4c1e-9b57-3c2f8a1d9e10";
        let cgroupfs = format!("12:pids:/kubepods/burstable/pod{uid}/{}\n", "ab".repeat(32));
        assert_eq!(pod_uids_in_cgroup(&cgroupfs), [uid]);
        let systemd = format!(
            "0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope\n",
            uid.replace('-', "_"),
            "cd".repeat(32)
        );
        assert_eq!(pod_uids_in_cgroup(&systemd), [uid]);
        assert!(pod_uids_in_cgroup("0::/\n").is_empty());
        assert!(pod_uids_in_cgroup("0::/podman/pod-x\n").is_empty());
    }

    #[test]
    fn a_pod_segment_made_below_the_kubelets_names_no_pod() {
        let mine = "0f6c1b7e-5a1d-4c1e-9b57-3c2f8a1d9e10";
        let victim = "7d2e9a41-3b6c-4f80-a1d2-5e6f7a8b9c0d";
        // A container that can write its cgroup tree made `pod<victim>`
        // below its own and moved there.
        let cgroup = format!(
            "0::/kubepods/burstable/pod{mine}/{}/pod{victim}\n",
            "ab".repeat(32)
        );
        let bind = |uid: &str| {
            format!(
                "1200 1100 8:1 /var/lib/kubelet/pods/{uid}/containers/app/0a1b2c3d \
                 /dev/termination-log rw,relatime - ext4 /dev/sda1 rw\n"
            )
        };
        let key = |uid: &str| cgpu_ledger::identity::key_of("k8s", &format!("{uid}/app"));
        assert!(!bind_is_pods(&cgroup, &bind(victim), key(victim)));
        assert_eq!(pod_uids_in_cgroup(&cgroup), [mine]);
        assert!(bind_is_pods(&cgroup, &bind(mine), key(mine)));
        // Hierarchies that name different pods name none.
        let split = format!("12:pids:/kubepods/pod{mine}/x\n0::/kubepods/pod{victim}/x\n");
        assert!(pod_uids_in_cgroup(&split).is_empty());
    }

    const MINE: &str = "3f4c0a6d2b1e9f8a7c6b5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f40";
    const VICTIM: &str = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b";

    /// A docker container's mount table, with a later bind on
    /// `/etc/hostname` of a file named after `forged` (what a process that
    /// can make a user and mount namespace can add), when given.
    fn mountinfo(forged: Option<&str>) -> String {
        let mut mi = format!(
            "1187 1098 0:120 / / rw,relatime - overlay overlay rw,upperdir=/var/lib/docker/overlay2/8c1f/diff\n\
1194 1187 259:2 /var/lib/docker/containers/{MINE}/hostname /etc/hostname rw,relatime - ext4 /dev/nvme0n1p2 rw\n"
        );
        if let Some(v) = forged {
            mi.push_str(&format!(
                "1300 1194 0:200 /var/lib/docker/containers/{v}/hostname /etc/hostname rw,relatime - tmpfs tmpfs rw\n"
            ));
        }
        mi
    }

    fn of(mi: &str) -> Identity {
        resolve(&Facts {
            cgroup: None, // its own cgroup namespace: says nothing
            mountinfo: Some(mi),
            pidns: 4026532301,
            hostname: "h",
            name: None,
        })
    }

    /// A forged bind names the victim; the host's view of the cgroup
    /// gives the caller's own container back.
    #[test]
    fn the_hosts_cgroup_view_wins_over_a_forged_bind() {
        let host_cg = format!("0::/system.slice/docker-{MINE}.scope\n");
        let forged = of(&mountinfo(Some(VICTIM)));
        assert_eq!(forged.container_id.as_deref(), Some(VICTIM));
        let id = pinned_to_cgroup(forged, Some(&host_cg));
        assert_eq!(id.container_id.as_deref(), Some(MINE));
        assert_eq!(id.key, key_of_container_id(MINE));
        // The honest caller is named as before.
        let honest = of(&mountinfo(None));
        assert_eq!(pinned_to_cgroup(honest.clone(), Some(&host_cg)), honest);
        assert_eq!(honest.source, Source::RuntimeBind);
        // Without a cgroup that names a container, nothing changes.
        assert_eq!(pinned_to_cgroup(honest.clone(), Some("0::/\n")), honest);
        assert_eq!(pinned_to_cgroup(honest.clone(), None), honest);
    }
}
