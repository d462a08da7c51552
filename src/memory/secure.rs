//! Secure mode: the node agent (`cgpu-agent --secure`, root on the host)
//! alone writes the books; this process reads them and asks the agent.
//!
//! - **Detection** ([`crate::ledger::mode::secure`]): the ledger directory
//!   and the agent's socket (or, while it restarts, its ledger files) are
//!   the host's; a socket a tenant could have planted is ignored, with a
//!   warning. Decided once per process.
//! - **Never writing the books**: each GPU's ledger is opened read-only
//!   (`O_RDONLY`, mapped `PROT_READ`); the process never joins it, never
//!   holds a slot or a lock there, never writes a knob, a weight or a
//!   scheduler word. The agent schedules the GPU; this process writes only
//!   its own scheduling page (`crate::scheduler`'s secure gate).
//! - **The client**: one `SOCK_SEQPACKET` connection per process (made on
//!   first need, closed in a forked child so that the parent's connection
//!   closes when the parent dies, and made again by the child), used under
//!   one lock on the allocation path only. `Hello` when a GPU is first used
//!   (its reply names the container's row), `Reserve` before each real
//!   allocation, `Release` after each free. A new connection (the agent
//!   restarted, or the old one failed) says `Hello` again on each GPU and
//!   re-registers what this process holds there.
//! - **Fail closed**: the agent unreachable, busy, or refusing for any
//!   reason but the quota: the allocation is refused
//!   (`CUDA_ERROR_OUT_OF_MEMORY`) with one error naming the cause and the
//!   fix (printed whatever the log level, once per cause), and the next
//!   allocation tries again, so the process heals by itself once the agent
//!   is back. Never back to the cooperative books.
//! - **Views** (`cuMemGetInfo`, NVML) read the container's row in the
//!   read-only mapping: no round trip once placed. The first view of a GPU
//!   says `Hello` (its reply names the row), waiting at most
//!   [`VIEW_WAIT`] for the connection's lock and for the answer; meanwhile
//!   the view shows nothing free. A view reads the replies to the releases
//!   sent that come within [`VIEW_WAIT`], never waiting longer.
//! - **Frees** never wait for the agent longer than [`VIEW_WAIT`] (for the
//!   connection's lock): a release is sent without waiting for its reply;
//!   when `MAX_PENDING` (32) replies are outstanding and none is there yet,
//!   or the lock is held, the bytes are kept and sent with the next
//!   request (the books count them meanwhile: more, never less).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;

use crate::ledger::wire::{Op, Reply, Request, Status, REPLY_LEN, SOCKET_NAME};
use crate::ledger::{human_bytes, Ledger};

/// Most releases sent without reading their replies yet.
const MAX_PENDING: u32 = 32;

/// Longest the agent may take to answer one request (then the connection
/// is dropped and the allocation refused).
pub const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// Longest a view (or a free) waits for the connection's lock, and a
/// view's `Hello` for its answer (then the view shows nothing free).
pub const VIEW_WAIT: Duration = Duration::from_millis(500);

/// How long a request looks for its answer before its thread sleeps.
const ANSWER_SPIN: Duration = Duration::from_micros(30);

/// Is the ledger directory the host agent's (see the module docs)? Decided
/// once per process.
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(
        || match crate::ledger::mode::secure(&Ledger::default_dir()) {
            Ok(on) => {
                if on {
                    tracing::info!(
                        "cgpu: secure mode: the node agent keeps the books and schedules the GPU"
                    );
                }
                on
            }
            Err(why) => {
                tracing::warn!("cgpu: {why}: ignored, the books are kept cooperatively");
                false
            }
        },
    )
}

/// The descriptor of this process's connection (-1: none), for the fork
/// handler, which closes it in the child.
static CONN_FD: AtomicI32 = AtomicI32::new(-1);

/// `pthread_atfork` child handler (async-signal-safe: an atomic and
/// `close`): the parent's connection is the parent's. Closed here so that
/// the agent sees it close when the parent dies; the child connects anew.
pub fn after_fork_child() {
    let fd = CONN_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: the inherited descriptor of the parent's connection; the
        // child's state that referenced it is abandoned (see `Proc`).
        unsafe { libc::close(fd) };
    }
}

/// Why a request got no usable answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    /// Cannot connect, or the connection failed: the cause.
    Unreachable(String),
    /// The agent answered with a refusal other than the quota.
    Refused(Status),
}

struct Conn {
    fd: i32,
    seq: u64,
    /// Requests sent whose replies are not read yet (the last ones sent).
    pending: u32,
    /// Bumped at each new connection.
    epoch: u64,
    /// How long a send or a receive waits (the socket's timeouts).
    wait: Duration,
}

/// This process's connection to the agent (one per process; a forked
/// child's `Proc` makes its own).
pub struct Client {
    sock: PathBuf,
    /// `Conn::pending`, readable without the lock (views).
    pending: AtomicU32,
    conn: Mutex<Conn>,
}

impl Default for Client {
    fn default() -> Self {
        Client::new(Ledger::default_dir().join(SOCKET_NAME))
    }
}

impl Client {
    pub fn new(sock: PathBuf) -> Client {
        Client {
            sock,
            pending: AtomicU32::new(0),
            conn: Mutex::new(Conn {
                fd: -1,
                seq: 0,
                pending: 0,
                epoch: 0,
                wait: ANSWER_WAIT,
            }),
        }
    }

    fn connect(&self, c: &mut Conn) -> Result<(), Fault> {
        if c.fd >= 0 {
            return Ok(());
        }
        let fd = connect_agent(&self.sock, c.wait).map_err(Fault::Unreachable)?;
        c.fd = fd;
        c.epoch += 1;
        CONN_FD.store(fd, Ordering::Release);
        Ok(())
    }

    /// Sends and receives on this connection (and the next) wait at most
    /// `wait`.
    fn set_wait(c: &mut Conn, wait: Duration) {
        c.wait = wait;
        if c.fd >= 0 {
            // SAFETY: the connection's descriptor, open while `c` holds it.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(c.fd) };
            let _ = crate::ledger::wire::set_timeouts(fd, wait);
        }
    }

    fn disconnect(c: &mut Conn) {
        if c.fd >= 0 {
            // Only if still ours (a forked child's handler may have taken it).
            if CONN_FD
                .compare_exchange(c.fd, -1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // SAFETY: our connection's descriptor, unpublished above.
                unsafe { libc::close(c.fd) };
            }
            c.fd = -1;
            c.pending = 0;
        }
    }

    /// Send one request (under the connection's lock, held by the caller);
    /// its sequence number. A failure drops the connection.
    fn send(&self, c: &mut Conn, op: Op, gpu: &str, bytes: u64) -> Result<u64, Fault> {
        c.seq += 1;
        let Some(req) = Request::new(op, c.seq, gpu, bytes) else {
            return Err(Fault::Unreachable(format!(
                "the GPU's UUID {gpu:?} cannot be sent"
            )));
        };
        let b = req.encode();
        // A socket with a send timeout is not restarted after a signal
        // (`SA_RESTART` does not apply): a signal is no failed connection.
        let n = loop {
            // SAFETY: valid descriptor and buffer of its length.
            let n = unsafe { libc::send(c.fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break n;
        };
        if n != b.len() as isize {
            let e = std::io::Error::last_os_error();
            Client::disconnect(c);
            return Err(Fault::Unreachable(format!(
                "the agent's connection failed ({e})"
            )));
        }
        Ok(req.seq)
    }

    /// The reply to request `seq`. A failure drops the connection.
    fn receive(&self, c: &mut Conn, seq: u64) -> Result<Reply, Fault> {
        // The agent answers within microseconds when its thread is awake:
        // look for the answer for up to `ANSWER_SPIN` before sleeping (a
        // thread woken on an idle CPU costs tens of microseconds more).
        let t0 = std::time::Instant::now();
        while t0.elapsed() < ANSWER_SPIN && c.fd >= 0 {
            if let Some(r) = self.receive_flags(c, seq, libc::MSG_DONTWAIT)? {
                return Ok(r);
            }
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        self.receive_flags(c, seq, 0)?
            .ok_or_else(|| Fault::Unreachable("the agent's connection failed".into()))
    }

    /// [`Self::receive`] with `recv` flags: `None` when `MSG_DONTWAIT`
    /// finds no reply there yet (the connection kept).
    fn receive_flags(&self, c: &mut Conn, seq: u64, flags: i32) -> Result<Option<Reply>, Fault> {
        let fail = |c: &mut Conn, what: String| {
            Client::disconnect(c);
            Err(Fault::Unreachable(what))
        };
        let mut r = [0u8; REPLY_LEN + 1];
        let n = loop {
            // SAFETY: valid descriptor and buffer of its length.
            let n = unsafe {
                libc::recv(
                    c.fd,
                    r.as_mut_ptr().cast(),
                    r.len(),
                    libc::MSG_TRUNC | flags,
                )
            };
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break n;
        };
        if n == 0 {
            return fail(c, "the agent closed the connection".into());
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if flags & libc::MSG_DONTWAIT != 0 && e.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(None);
            }
            let why = match e.raw_os_error() {
                Some(libc::EAGAIN) => {
                    format!("the agent did not answer within {} ms", c.wait.as_millis())
                }
                _ => format!("the agent's connection failed ({e})"),
            };
            return fail(c, why);
        }
        let n = n as usize;
        match Reply::decode(&r[..n.min(r.len())]) {
            Ok(reply) if n == REPLY_LEN && reply.seq == seq => Ok(Some(reply)),
            Ok(_) => fail(c, "the agent answered another request".into()),
            Err(e) => fail(c, format!("the agent's answer is not one ({e})")),
        }
    }

    /// Read the replies to the releases sent without waiting (they are
    /// the last `pending` requests, answered in order).
    fn drain(&self, c: &mut Conn) -> Result<(), Fault> {
        while c.pending > 0 && c.fd >= 0 {
            let seq = c.seq - u64::from(c.pending) + 1;
            let r = self.receive(c, seq);
            c.pending -= 1;
            self.pending.store(c.pending, Ordering::Release);
            if let Err(f) = r {
                c.pending = 0;
                self.pending.store(0, Ordering::Release);
                return Err(f);
            }
        }
        Ok(())
    }

    /// Read the outstanding replies that come before `end` (the
    /// connection kept when some do not).
    fn drain_until(&self, c: &mut Conn, end: std::time::Instant) {
        while c.pending > 0 && c.fd >= 0 {
            let left = end.saturating_duration_since(std::time::Instant::now());
            let mut p = libc::pollfd {
                fd: c.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis() as i32) };
            if n <= 0 {
                return;
            }
            self.drain_ready(c);
        }
    }

    /// Read the outstanding replies that are already there, never waiting
    /// for one.
    fn drain_ready(&self, c: &mut Conn) {
        while c.pending > 0 && c.fd >= 0 {
            let seq = c.seq - u64::from(c.pending) + 1;
            match self.receive_flags(c, seq, libc::MSG_DONTWAIT) {
                Ok(None) => return,
                Ok(Some(_)) => c.pending -= 1,
                Err(_) => c.pending = 0,
            }
            self.pending.store(c.pending, Ordering::Release);
        }
    }

    /// Connected, with no reply outstanding (a connection that failed
    /// while its replies were read is made again).
    fn settle(&self, c: &mut Conn) -> Result<(), Fault> {
        self.connect(c)?;
        if self.drain(c).is_err() {
            self.connect(c)?;
        }
        Ok(())
    }

    /// One request, one reply (under the connection's lock, held by the
    /// caller). A transport failure drops the connection.
    fn call(&self, c: &mut Conn, op: Op, gpu: &str, bytes: u64) -> Result<Reply, Fault> {
        self.connect(c)?;
        self.drain(c)?;
        let seq = self.send(c, op, gpu, bytes)?;
        let reply = self.receive(c, seq)?;
        match reply.status {
            Status::Ok | Status::OverQuota => Ok(reply),
            Status::BadRequest => {
                // The agent closes the connection after this.
                Client::disconnect(c);
                Err(Fault::Refused(Status::BadRequest))
            }
            s => Err(Fault::Refused(s)),
        }
    }

    /// Send a request whose reply is read later (a release: its answer
    /// changes nothing here; the next request or view reads it first). At
    /// most [`MAX_PENDING`] are outstanding, so the agent never blocks on a
    /// full socket: with that many and none of their replies there yet,
    /// nothing is sent (`Ok(false)`), never waiting for the agent.
    fn post(&self, c: &mut Conn, op: Op, gpu: &str, bytes: u64) -> Result<bool, Fault> {
        if c.pending >= MAX_PENDING {
            self.drain_ready(c);
            if c.pending >= MAX_PENDING {
                return Ok(false);
            }
        }
        self.send(c, op, gpu, bytes)?;
        c.pending += 1;
        self.pending.store(c.pending, Ordering::Release);
        Ok(true)
    }
}

/// A new connection to the agent's socket `sock` (close-on-exec), whose
/// sends and receives wait at most `wait`; the cause when there is none.
pub fn connect_agent(sock: &Path, wait: Duration) -> Result<i32, String> {
    // No allocation unless it fails (then the message is made).
    match crate::ledger::wire::connect(sock, Some(wait)) {
        Ok(fd) => Ok(std::os::fd::IntoRawFd::into_raw_fd(fd)),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput && e.raw_os_error().is_none() => {
            Err(format!("the socket path {} is too long", sock.display()))
        }
        Err(e) => Err(format!(
            "cannot connect to the agent's socket {}: {e}",
            sock.display()
        )),
    }
}

/// Has the peer of connection `fd` closed it (never waits)?
fn hung_up(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd; no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
}

/// Set a socket's send and receive timeouts to `wait`; false on failure.
fn hash(s: &str) -> u64 {
    // FNV-1a: only to tell one message from the next.
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// This process's account on one GPU in secure mode.
pub struct SecureAccount {
    /// For messages: `GPU <index> (<uuid>)`.
    gpu: String,
    uuid: String,
    dir: PathBuf,
    client: &'static Client,
    /// The connection epoch this GPU said `Hello` on (0: none yet).
    epoch: AtomicU64,
    /// The container's row (from the last `Hello`; `u32::MAX`: none).
    container: AtomicU32,
    /// The GPU's ledger, read-only (mapped at `Hello`; leaked, never freed:
    /// views may still read an older one).
    ledger: AtomicPtr<Ledger>,
    /// The container's use and quota from the last reply (views before the
    /// ledger could be mapped).
    used: AtomicU64,
    quota: AtomicU64,
    /// Bytes this process holds on this GPU.
    mine: AtomicU64,
    /// Bytes freed whose release is not sent yet (sent with the next
    /// request on this connection; a new connection's `Hello` counts
    /// `mine` only).
    unsent: AtomicU64,
    /// Held while `mine` and `unsent` change together (a free), or are
    /// read together (a new connection's `Hello`).
    frees: Mutex<()>,
    /// The last cause said (hash; 0: none, allocations accepted).
    said: AtomicU64,
    left: AtomicBool,
}

impl SecureAccount {
    /// An account on GPU `uuid` (never fails, never waits: `Hello` is said
    /// at the first allocation or view; allocations are refused until the
    /// agent answers).
    pub fn open(client: &'static Client, dir: &Path, uuid: &str, gpu: String) -> SecureAccount {
        SecureAccount {
            gpu,
            uuid: uuid.to_owned(),
            dir: dir.to_owned(),
            client,
            epoch: AtomicU64::new(0),
            container: AtomicU32::new(u32::MAX),
            ledger: AtomicPtr::new(std::ptr::null_mut()),
            used: AtomicU64::new(0),
            quota: AtomicU64::new(u64::MAX),
            mine: AtomicU64::new(0),
            unsent: AtomicU64::new(0),
            frees: Mutex::new(()),
            said: AtomicU64::new(0),
            left: AtomicBool::new(false),
        }
    }

    /// Before a view: `Hello` if the agent has not placed this process on
    /// this GPU yet, waiting at most [`VIEW_WAIT`] for the connection and
    /// for the answer (the view shows nothing free meanwhile; an answer
    /// that does not come in time drops the connection, which the next
    /// allocation makes again).
    pub fn glance(&self) {
        if self.known() || self.left.load(Ordering::Acquire) {
            return;
        }
        let Some(mut c) = self.client.conn.try_lock_for(VIEW_WAIT) else {
            return;
        };
        Client::set_wait(&mut c, VIEW_WAIT);
        let r = self.hello(&mut c);
        Client::set_wait(&mut c, ANSWER_WAIT);
        if let Err(f) = r {
            self.say(&f);
        }
    }

    /// Say `Hello` again if the connection the last one was said on has
    /// ended (the agent restarted): the compute scheduler places a process
    /// only where the agent knows it. Waits at most [`VIEW_WAIT`] for the
    /// connection and the answer.
    pub fn rejoin(&self) {
        if self.left.load(Ordering::Acquire) {
            return;
        }
        let Some(mut c) = self.client.conn.try_lock_for(VIEW_WAIT) else {
            return;
        };
        if c.fd >= 0 && hung_up(c.fd) {
            Client::disconnect(&mut c);
        }
        Client::set_wait(&mut c, VIEW_WAIT);
        let r = self.hello(&mut c);
        Client::set_wait(&mut c, ANSWER_WAIT);
        if let Err(f) = r {
            self.say(&f);
        }
    }

    /// `Hello` on the current connection if this GPU has not said it there
    /// yet; re-registers what this process holds on a new connection.
    fn hello(&self, c: &mut Conn) -> Result<(), Fault> {
        self.client.settle(c)?;
        if self.epoch.load(Ordering::Acquire) == c.epoch {
            return Ok(());
        }
        let r = self.client.call(c, Op::Hello, &self.uuid, 0)?;
        self.note(&r);
        self.map_ledger();
        // What this process holds and the agent does not count for it: all
        // of it after a connection the agent gave back when it closed;
        // nothing when a restarted agent kept this process's row (its slot
        // still counts it).
        let kept = self.process_row_used(r.process);
        let held = {
            // The releases not sent yet are in neither `mine` nor the row
            // this connection starts with.
            let _f = self.frees.lock();
            self.unsent.store(0, Ordering::Release);
            self.mine.load(Ordering::Acquire)
        };
        if kept > held {
            // Freed while the agent was away: give the kept row's surplus back.
            let r = self.client.call(c, Op::Release, &self.uuid, kept - held)?;
            self.note(&r);
        }
        let mine = held.saturating_sub(kept);
        if mine > 0 {
            let r = self.client.call(c, Op::Reserve, &self.uuid, mine)?;
            self.note(&r);
            if r.status != Status::Ok {
                tracing::warn!(
                    "{}: the agent did not take back the {} this process holds (the container is at its quota); they are not counted until freed",
                    self.gpu,
                    human_bytes(mine)
                );
            }
        }
        self.epoch.store(c.epoch, Ordering::Release);
        Ok(())
    }

    fn note(&self, r: &Reply) {
        if r.container != u32::MAX {
            self.container.store(r.container, Ordering::Release);
        }
        self.used.store(r.used, Ordering::Release);
        self.quota.store(r.quota, Ordering::Release);
    }

    /// Map the GPU's live ledger read-only (again, if the agent rebuilt it
    /// as a new file).
    fn map_ledger(&self) {
        let path = Ledger::live_path(&self.dir, &self.uuid);
        if let Some(l) = self.read_ledger() {
            if l.path() == path && !l.is_replaced() {
                return;
            }
        }
        match Ledger::open_read_only(&path) {
            Ok(l) => {
                let l = Box::into_raw(Box::new(l));
                // The old one is leaked: a view may still be reading it.
                self.ledger.store(l, Ordering::Release);
            }
            Err(e) => tracing::warn!(
                "{}: cannot read the GPU's ledger ({e}); memory views show the agent's last numbers",
                self.gpu
            ),
        }
    }

    fn read_ledger(&self) -> Option<&Ledger> {
        let p = self.ledger.load(Ordering::Acquire);
        // SAFETY: `ledger` only holds leaked boxes (never freed).
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Say why allocations are refused: one error per cause.
    fn say(&self, f: &Fault) {
        let (cause, fix) = match f {
            Fault::Unreachable(why) => (
                format!("the node agent cannot be reached: {why}"),
                "start the node agent on the host (`cgpu-agent --secure`, the cgpu DaemonSet or systemd unit) and mount its ledger directory into the container".to_string(),
            ),
            Fault::Refused(Status::Busy) => (
                "the node agent is rebuilding its books".to_string(),
                "none needed: wait a moment".to_string(),
            ),
            Fault::Refused(Status::Unknown) => (
                "the node agent does not know this process's container, or the host holds no settings for it".to_string(),
                "give the container its GPU settings on the host (the device plugin's allocation, or `cgpuctl` as root on the host)".to_string(),
            ),
            Fault::Refused(Status::NoGpu) => (
                "the node agent serves no GPU of this UUID".to_string(),
                "check the agent's GPU list on the host (it serves the GPUs NVML shows it)".to_string(),
            ),
            Fault::Refused(s) => (
                format!("the node agent refused the request ({s:?})"),
                "run the same cgpu version in the containers and the agent".to_string(),
            ),
        };
        let msg = format!(
            "{}: allocations on this GPU are refused (out of memory): {cause}; fix: {fix}. cgpu asks again at the next allocation and accepts allocations as soon as the agent answers",
            self.gpu
        );
        // Once per kind of cause (not per detail: an agent that closed the
        // connection, then refuses new ones, is one outage).
        let kind = match f {
            Fault::Unreachable(_) => "unreachable".to_string(),
            Fault::Refused(s) => format!("{s:?}"),
        };
        let h = hash(&kind).max(1);
        if self.said.swap(h, Ordering::Relaxed) != h {
            tracing::error!("{msg}");
        }
    }

    /// The agent answered: say so if allocations had been refused.
    fn healed(&self) {
        if self.said.swap(0, Ordering::Relaxed) != 0 {
            tracing::warn!(
                "{}: the node agent answers again; allocations are accepted",
                self.gpu
            );
        }
    }

    /// Charge `bytes` through the agent; false = over quota, or refused.
    pub fn reserve(&self, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        if self.left.load(Ordering::Acquire) {
            return false;
        }
        let mut c = self.client.conn.lock();
        let r = self.hello(&mut c).and_then(|()| {
            self.send_unsent(&mut c);
            self.client.call(&mut c, Op::Reserve, &self.uuid, bytes)
        });
        match r {
            Ok(r) => {
                self.note(&r);
                self.healed();
                if r.status == Status::Ok {
                    self.mine.fetch_add(bytes, Ordering::AcqRel);
                    true
                } else {
                    false
                }
            }
            Err(f) => {
                if f == Fault::Refused(Status::NotJoined) {
                    // The agent forgot this GPU's Hello: say it again next time.
                    self.epoch.store(0, Ordering::Release);
                }
                self.say(&f);
                false
            }
        }
    }

    /// Give back `bytes` charged earlier. Without a connection there is
    /// nothing to tell: the agent gave back what the closed one held. Never
    /// waits for the agent (see `Client::post`); the connection's lock at
    /// most [`VIEW_WAIT`], else the release goes with the next request.
    pub fn release(&self, bytes: u64) {
        if bytes == 0 || self.left.load(Ordering::Acquire) {
            return;
        }
        {
            let _f = self.frees.lock();
            let take = bytes.min(self.mine.load(Ordering::Acquire));
            if take == 0 {
                return;
            }
            self.mine.fetch_sub(take, Ordering::AcqRel);
            self.unsent.fetch_add(take, Ordering::AcqRel);
        }
        let Some(mut c) = self.client.conn.try_lock_for(VIEW_WAIT) else {
            return;
        };
        self.send_unsent(&mut c);
    }

    /// Send the releases kept (not waited for: a failed connection gives
    /// back everything it held anyway; a full queue keeps them).
    fn send_unsent(&self, c: &mut Conn) {
        if c.fd < 0 || self.epoch.load(Ordering::Acquire) != c.epoch {
            return;
        }
        let bytes = self.unsent.swap(0, Ordering::AcqRel);
        if bytes == 0 {
            return;
        }
        match self.client.post(c, Op::Release, &self.uuid, bytes) {
            Ok(true) => {}
            Ok(false) => {
                self.unsent.fetch_add(bytes, Ordering::AcqRel);
            }
            Err(f) => tracing::debug!(
                "{}: the release of {} was not sent ({f:?}); the closed connection gave it back",
                self.gpu,
                human_bytes(bytes)
            ),
        }
    }

    /// Bytes process slot `p` counts, from the read-only mapping (0 when
    /// unknown).
    fn process_row_used(&self, p: u32) -> u64 {
        let Some(l) = self.read_ledger() else {
            return 0;
        };
        l.file()
            .processes
            .get(p as usize)
            .filter(|s| s.state.load(Ordering::Acquire) == crate::ledger::SLOT_LIVE)
            .map_or(0, |s| s.used.load(Ordering::Acquire))
    }

    /// Before a view: the releases this process sent are applied by the
    /// agent (their replies read), so the row shows them.
    /// Only the replies already there are read, never waiting for the
    /// agent (nor for the connection, when a request holds it).
    /// The releases kept are sent first, room permitting.
    pub fn settle(&self) {
        if self.client.pending.load(Ordering::Acquire) == 0
            && self.unsent.load(Ordering::Acquire) == 0
        {
            return;
        }
        let Some(mut c) = self.client.conn.try_lock() else {
            return;
        };
        let end = std::time::Instant::now() + VIEW_WAIT;
        self.client.drain_until(&mut c, end);
        if self.unsent.load(Ordering::Acquire) > 0 {
            self.send_unsent(&mut c);
            self.client.drain_until(&mut c, end);
        }
    }

    /// The container's row in the read-only mapping, if known.
    fn row(&self) -> Option<&crate::ledger::ContainerSlot> {
        let c = self.container.load(Ordering::Acquire) as usize;
        self.read_ledger()?.file().containers.get(c)
    }

    /// Bytes the whole container holds on this GPU (its row; else the
    /// agent's last answer).
    pub fn container_used(&self) -> u64 {
        match self.row() {
            Some(r) => r.used.load(Ordering::Acquire),
            None => self.used.load(Ordering::Acquire),
        }
    }

    pub fn process_used(&self) -> u64 {
        self.mine.load(Ordering::Acquire)
    }

    /// Has the agent ever placed this process (told its container's row)?
    /// Until then nothing can be allocated, and views show nothing free.
    /// The agent's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join(SOCKET_NAME)
    }

    /// The GPU's ledger, read-only (mapped at the first `Hello`).
    pub fn ledger_view(&self) -> Option<&Ledger> {
        self.read_ledger()
    }

    pub fn known(&self) -> bool {
        self.container.load(Ordering::Acquire) != u32::MAX
    }

    /// The container's quota (`None`: not limited); see [`Self::known`].
    pub fn quota(&self) -> Option<u64> {
        if let Some(r) = self.row() {
            let q = r.quota.load(Ordering::Acquire);
            return (q != 0 && r.enforce_off.load(Ordering::Relaxed) == 0).then_some(q);
        }
        match self.quota.load(Ordering::Acquire) {
            u64::MAX => None,
            q => Some(q),
        }
    }

    /// Host pids of the container's live processes on this GPU, from the
    /// read-only mapping.
    pub fn container_pids(&self, pids: &mut Vec<u32>) {
        let c = self.container.load(Ordering::Acquire) as usize;
        let Some(l) = self.read_ledger() else { return };
        for p in l.file().processes.iter() {
            if p.state.load(Ordering::Acquire) == crate::ledger::SLOT_LIVE
                && p.container.load(Ordering::Acquire) as usize == c
            {
                if let Some(pid) = p.host_pid() {
                    if !pids.contains(&pid) {
                        pids.push(pid);
                    }
                }
            }
        }
    }

    /// The process is exiting: nothing more is charged (its connection
    /// closes with it, and the agent gives back what it held).
    pub fn leave(&self) {
        self.left.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(mode: u32) -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "cgpu-secure-detect-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        d
    }

    /// Without an agent, an allocation is refused (never granted), and the
    /// views show nothing free rather than the whole GPU.
    #[test]
    fn no_agent_refuses_and_shows_nothing_free() {
        let d = dir(0o755);
        let client: &'static Client = Box::leak(Box::new(Client::new(d.join(SOCKET_NAME))));
        let a = SecureAccount::open(
            client,
            &d,
            "GPU-00000000-0000-0000-0000-000000000001",
            "GPU 0".into(),
        );
        assert!(!a.reserve(1));
        assert!(!a.known());
        assert_eq!(a.process_used(), 0);
        a.release(1);
        assert_eq!(a.process_used(), 0);
        let _ = std::fs::remove_dir_all(&d);
    }
}
