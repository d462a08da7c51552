//! `wire::connect`: the one way every side opens a connection to the
//! agent's socket (a listener of this test stands for the agent).

use cgpu_ledger::wire;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cgpu-wire-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `SOCK_SEQPACKET` listener on `path` (backlog `backlog`).
fn listen(path: &Path, backlog: i32) -> OwnedFd {
    let (a, len) = wire::sockaddr(path).unwrap();
    // SAFETY: plain socket calls with valid arguments; the descriptor is
    // owned by the value returned.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let fd = OwnedFd::from_raw_fd(fd);
        assert_eq!(
            libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len),
            0
        );
        assert_eq!(libc::listen(fd.as_raw_fd(), backlog), 0);
        fd
    }
}

fn sockopt_int(fd: &OwnedFd, level: i32, opt: i32) -> i32 {
    let mut v = 0i32;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: a valid descriptor and an out-value of its length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&mut v as *mut i32).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0);
    v
}

fn timeout(fd: &OwnedFd, opt: i32) -> Duration {
    // SAFETY: an all-zero timeval is valid.
    let mut tv: libc::timeval = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: a valid descriptor and an out-value of its length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0);
    Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64)
}

#[test]
fn a_connection_is_a_close_on_exec_seqpacket_socket_with_the_timeouts_asked() {
    let d = scratch("ok");
    let path = d.join(wire::SOCKET_NAME);
    let _l = listen(&path, 8);
    let c = wire::connect(&path, Some(Duration::from_millis(1500))).expect("connect");
    assert_eq!(
        sockopt_int(&c, libc::SOL_SOCKET, libc::SO_TYPE),
        libc::SOCK_SEQPACKET
    );
    // SAFETY: fcntl on a valid descriptor.
    let flags = unsafe { libc::fcntl(c.as_raw_fd(), libc::F_GETFD) };
    assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    assert_eq!(timeout(&c, libc::SO_RCVTIMEO), Duration::from_millis(1500));
    assert_eq!(timeout(&c, libc::SO_SNDTIMEO), Duration::from_millis(1500));
    let plain = wire::connect(&path, None).expect("connect");
    assert_eq!(timeout(&plain, libc::SO_RCVTIMEO), Duration::ZERO);
    assert_eq!(timeout(&plain, libc::SO_SNDTIMEO), Duration::ZERO);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn no_listener_is_the_systems_error() {
    let d = scratch("none");
    let e = wire::connect(&d.join(wire::SOCKET_NAME), None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    // A socket file nobody listens on any more.
    let path = d.join("stale.sock");
    drop(listen(&path, 8));
    let e = wire::connect(&path, None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_path_too_long_for_a_socket_is_refused_by_name() {
    let long = PathBuf::from(format!("/tmp/{}/agent.sock", "x".repeat(120)));
    let e = wire::connect(&long, None).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(e.raw_os_error(), None);
    assert_eq!(
        e.to_string(),
        format!("{}: too long for a socket path", long.display())
    );
    // The longest that fits: 107 bytes and the NUL.
    let fits = PathBuf::from(format!("/{}", "y".repeat(106)));
    let e = wire::connect(&fits, None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    let over = PathBuf::from(format!("/{}", "y".repeat(107)));
    let e = wire::connect(&over, None).unwrap_err();
    assert_eq!(
        (e.kind(), e.raw_os_error()),
        (std::io::ErrorKind::InvalidInput, None),
        "{e}"
    );
    assert!(
        e.to_string().ends_with(": too long for a socket path"),
        "{e}"
    );
}
