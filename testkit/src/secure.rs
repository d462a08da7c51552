//! The rig of the secure-mode tests and benchmarks: tenants of the
//! unprivileged uid, cgroups of the test's own standing for containers
//! (the node agent tells containers apart by a process's cgroup), the
//! host's settings for a container written as an operator writes them,
//! the real `cgpu-agent --secure` started and serving, and what the books
//! then count. Most of it needs root.

use cgpu_ledger::wire::{Reply, Request, Status, WireError, REQUEST_LEN};
use cgpu_ledger::{JoinRequest, Ledger, Membership};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The uid (and gid) tenants run as: `nobody`, which owns nothing of the
/// host's.
pub const NOBODY: u32 = 65534;

/// Is this process root (the secure-mode rig needs it)?
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A runtime container id (64 hex digits) unique to this test process and
/// call, padded with `fill` (a hex digit: one per test file keeps their
/// ids apart); its first 12 digits (a row's name) differ between calls.
pub fn container_id(fill: char) -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{:04x}{:08x}{}",
        n,
        std::process::id(),
        fill.to_string().repeat(52)
    )
}

/// `c` runs as the tenant uid and gid ([`NOBODY`]).
pub fn as_nobody(c: &mut Command) -> &mut Command {
    c.uid(NOBODY).gid(NOBODY)
}

/// A shell's `exec` of `cmdline` as the tenant uid and gid, with no
/// supplementary groups (for a process that must do something as root
/// first, e.g. a bind mount in its own mount namespace).
pub fn exec_as_nobody(cmdline: &str) -> String {
    format!("exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups {cmdline}")
}

/// Makes a directory tree usable by every uid (directories 0777, files
/// 0666): the simulated device's state, which a root process may have
/// made first, stays the tenants' to use too (as a device node is
/// everyone's).
pub fn share_tree(p: &Path) {
    let Ok(md) = std::fs::symlink_metadata(p) else {
        return;
    };
    if md.is_dir() {
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777));
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            share_tree(&e.path());
        }
    } else if md.is_file() {
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666));
    }
}

/// Sets `p`'s mode (e.g. 0755 so that tenants can reach the agent's socket
/// below it).
pub fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", p.display()));
}

/// A tree of cgroups of the test's own, `<cgroup root>/<name>`
/// ([`crate::cgroup_root`]), removed (deepest first) when dropped; nothing
/// is made until [`Cgroups::make`].
pub struct Cgroups {
    root: PathBuf,
}

impl Cgroups {
    /// The tree `name` (unique to the test process and the rig: e.g. with
    /// the pid in it).
    pub fn new(name: &str) -> Cgroups {
        Cgroups {
            root: Path::new(crate::cgroup_root()).join(name),
        }
    }

    /// Its top.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The cgroup `rel` below the top (e.g. a container id, or
    /// `kubepods/pod<uid>/<container id>`), made with its parents.
    pub fn try_make(&self, rel: impl AsRef<Path>) -> std::io::Result<PathBuf> {
        let p = self.root.join(rel);
        std::fs::create_dir_all(&p)?;
        Ok(p)
    }

    /// [`Cgroups::try_make`], which must work (root; cgroup v2, or v1 with
    /// `pids`).
    pub fn make(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.try_make(rel).unwrap_or_else(|e| {
            panic!(
                "create a cgroup below {} (root; cgroup v2, or v1 with pids): {e}",
                self.root.display()
            )
        })
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        let mut dirs = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(d) = stack.pop() {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(e.path());
                    }
                }
            }
            dirs.push(d);
        }
        for d in dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Moves process `pid` into cgroup `cg`.
pub fn enter(cg: &Path, pid: u32) {
    std::fs::write(cg.join("cgroup.procs"), pid.to_string())
        .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", cg.display()));
}

/// The host's settings for container `id` (`KEY=VALUE` each), written into
/// `settings` by `cgpuctl settings` as root, as an operator does; `ledger`:
/// the ledger directory it names (`CGPU_LEDGER_DIR`), when given.
pub fn host_settings(
    settings: &Path,
    id: &str,
    kv: &[&str],
    ledger: Option<&Path>,
) -> Result<(), String> {
    let mut c = Command::new(crate::artifacts().bin("cgpuctl"));
    c.args(["settings", id])
        .args(kv)
        .arg("--settings-dir")
        .arg(settings);
    if let Some(l) = ledger {
        c.env("CGPU_LEDGER_DIR", l);
    }
    let o = c.output().map_err(|e| format!("cgpuctl settings: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "cgpuctl settings: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(())
}

/// `base` (the agent's program, with its environment) as `cgpu-agent
/// --secure` on the ledger directory `ledger` with the host's settings in
/// `settings`, passing every `interval`; further arguments may follow.
pub fn secure_agent_command(
    mut base: Command,
    ledger: &Path,
    settings: &Path,
    interval: &str,
) -> Command {
    base.args(["--secure", "--interval", interval, "--ledger-dir"])
        .arg(ledger)
        .arg("--settings-dir")
        .arg(settings);
    base
}

/// A `cgpu-agent --secure` that said it serves; killed when dropped.
pub struct SecureAgent {
    pub child: Child,
    /// Its log (stderr) lines up to the one saying it serves.
    pub started: Vec<String>,
}

impl SecureAgent {
    /// Starts `cmd` (a `cgpu-agent --secure` command line) and waits, at
    /// most `patience`, for its log to say it serves; the rest of its log
    /// is read and dropped. If it does not, it is killed, and the error is
    /// its log so far.
    pub fn start(cmd: &mut Command, patience: Duration) -> Result<SecureAgent, Vec<String>> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| vec![format!("spawn {:?}: {e}", cmd.get_program())])?;
        let err = child.stderr.take().expect("piped stderr");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                // Read to the end even when nobody listens any more: the
                // agent never blocks on a full pipe.
                let _ = tx.send(l);
            }
        });
        let mut started = Vec::new();
        let t0 = Instant::now();
        loop {
            match rx.recv_timeout(patience.saturating_sub(t0.elapsed())) {
                Ok(l) => {
                    let done = l.contains("secure: serving");
                    started.push(l);
                    if done {
                        return Ok(SecureAgent { child, started });
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(started);
                }
            }
        }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for SecureAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the ledger counts for container `id` (its live row is named by the
/// id's first 12 characters), 0 without a row.
pub fn row_used(ledger: &Ledger, id: &str) -> u64 {
    let name = &id[..id.len().min(12)];
    ledger
        .file()
        .containers
        .iter()
        .find(|c| c.state.load(Ordering::Acquire) == cgpu_ledger::SLOT_LIVE && c.id_str() == name)
        .map_or(0, |c| c.used.load(Ordering::Acquire))
}

/// A listening `SOCK_SEQPACKET` socket on `path` (mode 0666: any tenant may
/// connect), standing for the agent's in tests that serve the protocol
/// themselves; its descriptor, the caller's to close.
pub fn listen(path: &Path) -> i32 {
    let (a, len) = cgpu_ledger::wire::sockaddr(path).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: plain socket calls with valid arguments: an address of `len`
    // bytes.
    let (fd, ok) = unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        let ok = fd >= 0
            && libc::bind(fd, (&a as *const libc::sockaddr_un).cast(), len) == 0
            && libc::listen(fd, 64) == 0;
        (fd, ok)
    };
    assert!(
        ok,
        "listen on {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    set_mode(path, 0o666);
    fd
}

/// Accepts connections on the listening socket `listen` in a thread of its
/// own until accepting fails (the socket shut down): `accepted(fd)` runs
/// there for each, and what it returns serves that connection in a thread
/// of its own.
pub fn serve_each<S>(listen: i32, mut accepted: impl FnMut(i32) -> S + Send + 'static)
where
    S: FnOnce() + Send + 'static,
{
    std::thread::spawn(move || loop {
        // SAFETY: accept on the caller's listening socket.
        let fd = unsafe {
            libc::accept4(
                listen,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            return;
        }
        std::thread::spawn(accepted(fd));
    });
}

/// The next message on connection `fd`, as a request: `None` once the
/// connection is closed (or fails).
pub fn recv_request(fd: i32) -> Option<Result<Request, WireError>> {
    let mut b = [0u8; REQUEST_LEN + 1];
    // SAFETY: a valid buffer of its length.
    let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), 0) };
    (n > 0).then(|| Request::decode(&b[..n as usize]))
}

/// Sends `r` on connection `fd` (a failure is the peer's to see).
pub fn send_reply(fd: i32, r: &Reply) {
    let b = r.encode();
    // SAFETY: a valid buffer of its length.
    unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
}

/// The books of an agent a test serves itself: one container's row in a
/// real ledger file of one GPU (root's, mode 0644), charged through the
/// ledger's own `try_reserve`/`release`.
pub struct Row {
    pub ledger: Ledger,
    pub m: Membership,
}

impl Row {
    /// The GPU `gpu`'s ledger in `dir` (made with `total` bytes if new),
    /// and the row of container `name` there with `quota` bytes.
    pub fn join(dir: &Path, gpu: &str, total: u64, name: &str, quota: u64) -> Row {
        let ledger = Ledger::open_or_create(dir, gpu, 0, total).expect("the agent's ledger");
        set_mode(ledger.path(), 0o644);
        let m = ledger
            .join(&JoinRequest {
                container_id: name,
                key: 0,
                quota,
                weight: 1,
                highprio: false,
                enforce_off: false,
            })
            .expect("the agent joins the container's row");
        Row { ledger, m }
    }

    /// The reply `status` to request `seq`, with the row's numbers now.
    pub fn reply(&self, status: Status, seq: u64) -> Reply {
        let row = &self.ledger.file().containers[self.m.container];
        Reply {
            status,
            seq,
            used: row.used.load(Ordering::Acquire),
            quota: row.quota.load(Ordering::Acquire),
            container: self.m.container as u32,
            process: self.m.process as u32,
        }
    }
}

/// A `cgpu-agent client` process speaking to the agent for the test: one
/// command a line on its stdin, one answer a line on its stdout. Killed
/// when dropped.
pub struct AgentClient {
    pub child: Child,
    stdin: ChildStdin,
    answers: Receiver<String>,
    patience: Duration,
}

/// The numbers of an answer of `cgpu-agent client` (a reply of the agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientReply {
    pub status: String,
    pub used: u64,
    pub quota: u64,
    pub process: u32,
}

impl AgentClient {
    /// `child` (spawned with stdin and stdout piped), waiting at most
    /// `patience` for each answer.
    pub fn new(mut child: Child, patience: Duration) -> AgentClient {
        let out = child.stdout.take().expect("piped stdout");
        let (tx, answers) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        AgentClient {
            stdin: child.stdin.take().expect("piped stdin"),
            child,
            answers,
            patience,
        }
    }

    /// Sends `line`, not waiting for an answer.
    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends `line`; the answer.
    pub fn cmd(&mut self, line: &str) -> String {
        self.send(line);
        self.answers
            .recv_timeout(self.patience)
            .unwrap_or_else(|_| panic!("no answer to {line:?}"))
    }

    /// Sends `line`; the numbers of the agent's reply (panics on an answer
    /// that is no reply).
    pub fn ask(&mut self, line: &str) -> ClientReply {
        let l = self.cmd(line);
        let f = |k: &str| {
            crate::field(&l, k)
                .unwrap_or_else(|| panic!("{line:?}: no {k} in {l:?}"))
                .to_string()
        };
        ClientReply {
            status: f("status"),
            used: f("used").parse().unwrap(),
            quota: f("quota").parse().unwrap(),
            process: f("process").parse().unwrap(),
        }
    }

    /// Reads answers until one starts with `prefix`; all of them.
    pub fn until(&mut self, prefix: &str) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            let l = self
                .answers
                .recv_timeout(self.patience)
                .unwrap_or_else(|_| panic!("no {prefix:?} after {lines:?}"));
            let done = l.starts_with(prefix);
            lines.push(l);
            if done {
                return lines;
            }
        }
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentClient {
    fn drop(&mut self) {
        self.kill();
    }
}
