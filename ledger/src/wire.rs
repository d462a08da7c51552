//! Secure mode's messages between a process of a container and the node
//! agent (`cgpu-agent --secure`), which alone writes the books.
//!
//! The transport is a `SOCK_SEQPACKET` Unix socket, [`SOCKET_NAME`] in the
//! ledger directory: one message per packet, so a message is never split
//! or run together with the next, and the agent sees a process's death as
//! its socket closing. Every message has a fixed length ([`REQUEST_LEN`],
//! [`REPLY_LEN`]), little-endian fields at fixed offsets, and starts with
//! [`MAGIC`] and [`VERSION`]; anything else is refused whole (never read in
//! part). A request carries no claim about who sends it: the agent takes the
//! caller's identity from the kernel (the socket's peer credentials and what
//! the host sees of that pid), never from the message.
//!
//! The exchange: a process sends [`Op::Hello`] for a GPU (by UUID) before
//! its first allocation there; the agent joins it to its container's row
//! and answers with the row's quota and use and the slots it holds. Then
//! [`Op::Reserve`] asks for bytes before an allocation (granted only within
//! the container's quota), [`Op::Release`] gives bytes back after a free
//! (never more than this connection holds on that GPU). Each request gets
//! exactly one reply with the same `seq`. [`Op::Sched`] opens a second
//! connection of the process to the GPU's compute scheduler, which the
//! agent runs (see `crate::page`).

/// The agent's socket, in the ledger directory.
pub const SOCKET_NAME: &str = "agent.sock";
/// First four bytes of every message.
pub const MAGIC: u32 = u32::from_le_bytes(*b"CGPW");
/// The protocol's version; a message of another version is refused.
pub const VERSION: u16 = 1;
/// Length of a request, bytes.
pub const REQUEST_LEN: usize = 96;
/// Length of a reply, bytes.
pub const REPLY_LEN: usize = 48;
/// Room for a GPU's UUID (`GPU-` and 36 characters), NUL-padded.
pub const GPU_LEN: usize = 64;

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    /// Join this GPU's books (idempotent per connection and GPU).
    Hello = 1,
    /// Charge `bytes` to the caller's container before allocating them.
    Reserve = 2,
    /// Give back `bytes` the caller charged earlier on this GPU.
    Release = 3,
    /// Join this GPU's compute scheduler, on a connection of its own that
    /// carries nothing else afterwards (the scheduling connection): the
    /// reply carries the process's scheduling page (`crate::page`) as an
    /// `SCM_RIGHTS` descriptor. The caller must have said `Hello` for that
    /// GPU on another connection of the same process first (`NotJoined`
    /// otherwise). After it, any packet the process sends on the
    /// connection only wakes the agent's scheduler (its content is
    /// ignored), and its end is the process's end.
    Sched = 4,
}

impl Op {
    fn from_u16(v: u16) -> Option<Op> {
        match v {
            1 => Some(Op::Hello),
            2 => Some(Op::Reserve),
            3 => Some(Op::Release),
            4 => Some(Op::Sched),
            _ => None,
        }
    }
}

/// The agent's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// Refused: the container's quota would be exceeded.
    OverQuota = 1,
    /// Refused: the agent cannot tell which container the caller is in, or
    /// the host holds no settings for it.
    Unknown = 2,
    /// Refused: the message was malformed (the connection is then closed).
    BadRequest = 3,
    /// Refused: the agent serves no GPU of that UUID.
    NoGpu = 4,
    /// Refused for now: the agent is rebuilding its books; ask again.
    Busy = 5,
    /// Refused: `Reserve` or `Release` before `Hello` on that GPU.
    NotJoined = 6,
}

impl Status {
    fn from_u16(v: u16) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::OverQuota,
            2 => Status::Unknown,
            3 => Status::BadRequest,
            4 => Status::NoGpu,
            5 => Status::Busy,
            6 => Status::NotJoined,
            _ => return None,
        })
    }
}

/// Why bytes are not a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Not exactly the message's length.
    Length(usize),
    /// Does not start with [`MAGIC`].
    Magic,
    /// Another protocol version.
    Version(u16),
    /// An unknown operation or status.
    Code(u16),
    /// The GPU field is not a UUID's characters, NUL-padded.
    Gpu,
    /// Bytes that must be zero are not.
    Reserved,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Length(n) => write!(f, "a message of {n} bytes"),
            WireError::Magic => write!(f, "not a cgpu message"),
            WireError::Version(v) => write!(f, "protocol version {v}, this side speaks {VERSION}"),
            WireError::Code(c) => write!(f, "unknown code {c}"),
            WireError::Gpu => write!(f, "a malformed GPU UUID"),
            WireError::Reserved => write!(f, "reserved bytes set"),
        }
    }
}

impl std::error::Error for WireError {}

/// A process's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    /// Echoed in the reply.
    pub seq: u64,
    /// The GPU's UUID as the driver names it, NUL-padded.
    pub gpu: [u8; GPU_LEN],
    /// Bytes to reserve or release (0 for `Hello`).
    pub bytes: u64,
}

/// The agent's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub status: Status,
    /// The request's `seq`.
    pub seq: u64,
    /// The container's bytes in use on that GPU, after the request.
    pub used: u64,
    /// The container's quota on that GPU (`u64::MAX`: none).
    pub quota: u64,
    /// The container's slot in that GPU's ledger (`u32::MAX`: none).
    pub container: u32,
    /// The caller's process slot in that GPU's ledger (`u32::MAX`: none).
    pub process: u32,
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn get32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn get64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Magic, version and length: what every message must have.
fn check_frame(b: &[u8], len: usize) -> Result<(), WireError> {
    if b.len() != len {
        return Err(WireError::Length(b.len()));
    }
    if get32(b, 0) != MAGIC {
        return Err(WireError::Magic);
    }
    match get16(b, 4) {
        VERSION => Ok(()),
        v => Err(WireError::Version(v)),
    }
}

/// A GPU field: UUID characters (`[A-Za-z0-9-]`), at least one, then NULs.
fn gpu_ok(g: &[u8; GPU_LEN]) -> bool {
    let n = g.iter().position(|&c| c == 0).unwrap_or(GPU_LEN);
    n > 0
        && g[..n]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && g[n..].iter().all(|&c| c == 0)
}

impl Request {
    /// A request for the GPU of that UUID; `None` if the UUID does not fit
    /// or has other characters than a UUID's.
    pub fn new(op: Op, seq: u64, gpu: &str, bytes: u64) -> Option<Request> {
        let mut g = [0u8; GPU_LEN];
        if gpu.len() >= GPU_LEN {
            return None;
        }
        g[..gpu.len()].copy_from_slice(gpu.as_bytes());
        gpu_ok(&g).then_some(Request {
            op,
            seq,
            gpu: g,
            bytes,
        })
    }

    /// The GPU's UUID.
    pub fn gpu_str(&self) -> &str {
        let n = self.gpu.iter().position(|&c| c == 0).unwrap_or(GPU_LEN);
        // Checked to be ASCII when made or decoded.
        std::str::from_utf8(&self.gpu[..n]).unwrap_or("")
    }

    /// Layout: magic u32 @0, version u16 @4, op u16 @6, seq u64 @8,
    /// bytes u64 @16, gpu [u8; 64] @24, 8 reserved zero bytes @88.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        put32(&mut b, 0, MAGIC);
        put16(&mut b, 4, VERSION);
        put16(&mut b, 6, self.op as u16);
        put64(&mut b, 8, self.seq);
        put64(&mut b, 16, self.bytes);
        b[24..24 + GPU_LEN].copy_from_slice(&self.gpu);
        b
    }

    /// The request these bytes are, checked whole.
    pub fn decode(b: &[u8]) -> Result<Request, WireError> {
        check_frame(b, REQUEST_LEN)?;
        let code = get16(b, 6);
        let op = Op::from_u16(code).ok_or(WireError::Code(code))?;
        let mut gpu = [0u8; GPU_LEN];
        gpu.copy_from_slice(&b[24..24 + GPU_LEN]);
        if !gpu_ok(&gpu) {
            return Err(WireError::Gpu);
        }
        if b[24 + GPU_LEN..].iter().any(|&c| c != 0) {
            return Err(WireError::Reserved);
        }
        Ok(Request {
            op,
            seq: get64(b, 8),
            gpu,
            bytes: get64(b, 16),
        })
    }
}

impl Reply {
    /// A refusal carrying no numbers.
    pub fn refuse(status: Status, seq: u64) -> Reply {
        Reply {
            status,
            seq,
            used: 0,
            quota: u64::MAX,
            container: u32::MAX,
            process: u32::MAX,
        }
    }

    /// Layout: magic u32 @0, version u16 @4, status u16 @6, seq u64 @8,
    /// used u64 @16, quota u64 @24, container u32 @32, process u32 @36,
    /// 8 reserved zero bytes @40.
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        put32(&mut b, 0, MAGIC);
        put16(&mut b, 4, VERSION);
        put16(&mut b, 6, self.status as u16);
        put64(&mut b, 8, self.seq);
        put64(&mut b, 16, self.used);
        put64(&mut b, 24, self.quota);
        put32(&mut b, 32, self.container);
        put32(&mut b, 36, self.process);
        b
    }

    /// The reply these bytes are, checked whole.
    pub fn decode(b: &[u8]) -> Result<Reply, WireError> {
        check_frame(b, REPLY_LEN)?;
        let code = get16(b, 6);
        let status = Status::from_u16(code).ok_or(WireError::Code(code))?;
        if b[40..].iter().any(|&c| c != 0) {
            return Err(WireError::Reserved);
        }
        Ok(Reply {
            status,
            seq: get64(b, 8),
            used: get64(b, 16),
            quota: get64(b, 24),
            container: get32(b, 32),
            process: get32(b, 36),
        })
    }
}

/// The address of the Unix socket at `path` and its length; an error
/// naming the path when it does not fit `sun_path` (with its NUL).
pub fn sockaddr(path: &std::path::Path) -> std::io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    if b.len() >= a.sun_path.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: too long for a socket path", path.display()),
        ));
    }
    for (d, s) in a.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + b.len() + 1) as libc::socklen_t;
    Ok((a, len))
}

/// Each send and receive on socket `fd` waits at most `wait` (`SO_SNDTIMEO`
/// and `SO_RCVTIMEO`; a zero `wait` waits without end).
pub fn set_timeouts(
    fd: std::os::fd::BorrowedFd<'_>,
    wait: std::time::Duration,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_usec: wait.subsec_micros() as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: a valid descriptor and an option of its size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A connection to the agent's socket at `path`: a `SOCK_SEQPACKET` Unix
/// socket, close-on-exec, connected. With `timeout`, each send and receive
/// on it waits at most that long, and so does the connect itself when the
/// agent's backlog is full. A path too long for a socket address is an
/// `InvalidInput` error naming it (the one error made here: the others are
/// the system's, and allocate nothing).
pub fn connect(
    path: &std::path::Path,
    timeout: Option<std::time::Duration>,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
    let (a, len) = sockaddr(path)?;
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made, owned by nothing else (closed when
    // `fd` drops, on every error below).
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(wait) = timeout {
        set_timeouts(fd.as_fd(), wait)?;
    }
    // SAFETY: a valid descriptor and an address of `len` bytes.
    if unsafe { libc::connect(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: &str = "GPU-5fd3c4a2-1b7e-4c1f-9a43-0e5c1c2d3e4f";

    #[test]
    fn a_request_survives_the_wire_byte_for_byte() {
        let r = Request::new(Op::Reserve, 7, GPU, 3 << 30).unwrap();
        let b = r.encode();
        assert_eq!(&b[0..4], b"CGPW");
        assert_eq!(u16::from_le_bytes([b[6], b[7]]), 2);
        assert_eq!(Request::decode(&b), Ok(r));
        assert_eq!(Request::decode(&b).unwrap().gpu_str(), GPU);
    }

    #[test]
    fn a_reply_survives_the_wire() {
        let r = Reply {
            status: Status::OverQuota,
            seq: 9,
            used: 1 << 30,
            quota: 2 << 30,
            container: 3,
            process: 17,
        };
        assert_eq!(Reply::decode(&r.encode()), Ok(r));
        let refused = Reply::refuse(Status::Busy, 4);
        assert_eq!(Reply::decode(&refused.encode()), Ok(refused));
    }

    #[test]
    fn anything_but_a_whole_message_is_refused_whole() {
        let good = Request::new(Op::Hello, 1, GPU, 0).unwrap().encode();
        assert_eq!(Request::decode(&good[..95]), Err(WireError::Length(95)));
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(Request::decode(&long), Err(WireError::Length(97)));
        let mut b = good;
        b[0] ^= 1;
        assert_eq!(Request::decode(&b), Err(WireError::Magic));
        let mut b = good;
        b[4] = 2;
        assert_eq!(Request::decode(&b), Err(WireError::Version(2)));
        let mut b = good;
        b[6] = 9;
        assert_eq!(Request::decode(&b), Err(WireError::Code(9)));
        let mut b = good;
        b[24 + 3] = b'/';
        assert_eq!(Request::decode(&b), Err(WireError::Gpu));
        let mut b = good;
        b[24 + 50] = b'A';
        assert_eq!(
            Request::decode(&b),
            Err(WireError::Gpu),
            "text after the NUL padding"
        );
        let mut b = good;
        b[24] = 0;
        assert_eq!(Request::decode(&b), Err(WireError::Gpu), "an empty UUID");
        let mut b = good;
        b[REQUEST_LEN - 1] = 1;
        assert_eq!(Request::decode(&b), Err(WireError::Reserved));
        let mut r = Reply::refuse(Status::Ok, 1).encode();
        r[6] = 77;
        assert_eq!(Reply::decode(&r), Err(WireError::Code(77)));
    }

    #[test]
    fn uuids_that_could_name_a_path_are_not_requests() {
        assert!(Request::new(Op::Hello, 1, "../../etc/passwd", 0).is_none());
        assert!(Request::new(Op::Hello, 1, "", 0).is_none());
        assert!(Request::new(Op::Hello, 1, &"A".repeat(GPU_LEN), 0).is_none());
        assert!(Request::new(Op::Hello, 1, GPU, 0).is_some());
    }
}
