//! Secure mode's per-process scheduling page: the words a process writes on
//! its launch path, in memory only that process and the node agent share.
//!
//! In secure mode the ledger is read-only to every container, so the
//! scheduler's shared words cannot live there for writing. Instead the
//! agent makes one page per (process, GPU): a `memfd` of [`PAGE_LEN`]
//! bytes, sealed against shrinking and growing (so the process can never
//! make the agent's reads fault), and hands it to the process over its
//! scheduling connection ([`send_fds`]). The process maps it read-write and
//! writes its words ([`word`]); the agent reads them to decide who holds
//! the GPU, and writes its decisions into the ledger, which every process
//! reads. No process can write another's page, the token or a bucket.
//!
//! Every word is untrusted by the agent: it only ever steers decisions
//! about the process's own container.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicU64;

/// Length of a page, bytes.
pub const PAGE_LEN: usize = 4096;
/// Words in a page.
pub const WORDS: usize = PAGE_LEN / 8;

/// The words of a page (`u64`; times are `CLOCK_MONOTONIC` ns).
pub mod word {
    /// Threads of the process waiting to launch now.
    pub const WANTS: usize = 0;
    /// The token sequence number of the last slice it launched in.
    pub const LAUNCHED: usize = 1;
    /// The token sequence number of the last slice whose work it drained
    /// ([`LAUNCHED`] = `DRAINED`: nothing of it is queued on the GPU).
    pub const DRAINED: usize = 2;
    /// Threads of the process inside a synchronise call (waiting for their
    /// GPU work: a holder that waits is busy, not idle).
    pub const SYNCING: usize = 3;
    /// Time its threads were held back in launch hooks, ns (summed).
    pub const THROTTLED_NS: usize = 4;
    /// Launches tried in the slice [`SLICE_OF`] names (the slice's launch
    /// allowance bounds the admitted ones); the agent reads the pair as the
    /// process's activity.
    pub const SLICE_LAUNCHES: usize = 5;
    pub const SLICE_OF: usize = 6;
}

/// A page as mapped.
#[repr(C)]
pub struct Page {
    pub words: [AtomicU64; WORDS],
}

impl Page {
    #[inline(always)]
    pub fn w(&self, i: usize) -> &AtomicU64 {
        &self.words[i]
    }
}

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// A new page: a sealed `memfd` of [`PAGE_LEN`] zero bytes (the agent's).
pub fn create(name: &str) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a NUL-terminated name; the flags are valid.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            cname.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(last_err());
    }
    // SAFETY: a descriptor the kernel just gave us, owned from here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: our descriptor; plain fcntl/ftruncate calls.
    let ok = unsafe {
        libc::ftruncate(fd.as_raw_fd(), PAGE_LEN as libc::off_t) == 0
            && libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            ) == 0
    };
    if !ok {
        return Err(last_err());
    }
    Ok(fd)
}

/// Map a page read-write, shared. The mapping lives for the process's life
/// (the caller leaks it) or until [`unmap`]. Only a sealed page
/// ([`is_sealed_page`]) is mapped: a shorter file would fault on access.
pub fn map(fd: RawFd) -> io::Result<&'static Page> {
    if !is_sealed_page(fd) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a sealed scheduling page",
        ));
    }
    // SAFETY: a fresh shared mapping of PAGE_LEN bytes of a descriptor the
    // caller holds; the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE_LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_err());
    }
    // SAFETY: PAGE_LEN mapped bytes, page-aligned, which only ever hold
    // plain integers (any bit pattern is a valid `AtomicU64`); the mapping
    // is never unmapped while referenced (see `unmap`).
    Ok(unsafe { &*(p as *const Page) })
}

/// Unmap a page [`map`] returned. The caller holds no other reference.
///
/// # Safety
/// No reference to `page` may be used afterwards.
pub unsafe fn unmap(page: &'static Page) {
    // SAFETY: the caller's promise; the address and length are the mapping's.
    unsafe { libc::munmap(page as *const Page as *mut libc::c_void, PAGE_LEN) };
}

/// Whether `fd` is a page as [`create`] makes it: a memfd of exactly
/// [`PAGE_LEN`] bytes sealed against shrinking and growing (a process
/// checks what it was handed before it maps it).
pub fn is_sealed_page(fd: RawFd) -> bool {
    // SAFETY: fcntl/fstat on a descriptor the caller holds; `st` is written
    // by the kernel before it is read.
    unsafe {
        let seals = libc::fcntl(fd, libc::F_GET_SEALS);
        let mut st: libc::stat = std::mem::zeroed();
        seals >= 0
            && seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
                == libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
            && libc::fstat(fd, &mut st) == 0
            && st.st_size == PAGE_LEN as libc::off_t
    }
}

/// Send `msg` on the connected `SOCK_SEQPACKET` socket `sock` with `fds`
/// attached (`SCM_RIGHTS`), in one packet.
pub fn send_fds(sock: RawFd, msg: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: zeroed msghdr is valid; every pointer set below points into
    // live buffers of the lengths given.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    if !fds.is_empty() {
        mh.msg_control = cbuf.as_mut_ptr().cast();
        mh.msg_controllen = space as _;
        // SAFETY: the control buffer holds one header of `payload` bytes.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c) as *mut RawFd,
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: `mh` describes live buffers.
        let n = unsafe { libc::sendmsg(sock, &mh, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return if n as usize == msg.len() {
                Ok(())
            } else {
                Err(io::ErrorKind::WriteZero.into())
            };
        }
        let e = last_err();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receive one packet into `buf` on `sock`, with up to two descriptors
/// attached (taken with `MSG_CMSG_CLOEXEC`). The packet's real length (a
/// longer one is cut: its length says so) and the descriptors.
pub fn recv_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(2 * std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: zeroed msghdr is valid; the pointers set point into live buffers.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = space as _;
    let n = loop {
        // SAFETY: `mh` describes live buffers.
        let n = unsafe { libc::recvmsg(sock, &mut mh, libc::MSG_CMSG_CLOEXEC | libc::MSG_TRUNC) };
        if n >= 0 {
            break n as usize;
        }
        let e = last_err();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled the control buffer; the CMSG_* walk stays
    // within `msg_controllen`; each descriptor received is ours to own.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    Ok((n, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn a_page_is_sealed_shared_and_travels_over_a_socket() {
        let fd = create("cgpu-test").unwrap();
        assert!(is_sealed_page(fd.as_raw_fd()));
        // SAFETY: our descriptor; a shrink must be refused by the seal.
        assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) }, 0);
        let mut sv = [0; 2];
        // SAFETY: a fresh socket pair.
        assert_eq!(
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, sv.as_mut_ptr()) },
            0
        );
        send_fds(sv[0], b"hello", &[fd.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv_fds(sv[1], &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        assert!(is_sealed_page(fds[0].as_raw_fd()));
        let a = map(fd.as_raw_fd()).unwrap();
        let b = map(fds[0].as_raw_fd()).unwrap();
        a.w(word::SLICE_LAUNCHES).store(42, Relaxed);
        assert_eq!(b.w(word::SLICE_LAUNCHES).load(Relaxed), 42);
        // A plain file is not a page.
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(!is_sealed_page(f.as_raw_fd()));
        // SAFETY: no reference is used afterwards; our socket pair.
        unsafe {
            unmap(a);
            unmap(b);
            libc::close(sv[0]);
            libc::close(sv[1]);
        }
    }
}
