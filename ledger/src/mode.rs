//! Which mode a ledger directory is in, as the library and the tools both
//! decide it.
//!
//! **Secure**: the node agent (`cgpu-agent --secure`, root on the host)
//! alone writes the books; the directory holds its socket
//! ([`SOCKET_NAME`]) and both are the host's: the directory is root's and
//! writable by nobody else, the socket is root's. A socket anyone could
//! have made (in a directory others can write) is not trusted: a tenant
//! cannot switch other containers' processes over to an agent of its own.
//! Without the socket (the agent restarting), ledger files only root may
//! write, in such a directory, are the agent's books too: still secure,
//! waiting for the agent. **Cooperative** otherwise: the processes of the
//! containers write the books.

use crate::wire::SOCKET_NAME;
use crate::Ledger;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// `Ok(true)`: `dir` holds the host agent's socket. `Ok(false)`: no
/// socket. `Err`: a socket that is not the host's (the reason).
pub fn secure(dir: &Path) -> Result<bool, String> {
    let sock = dir.join(SOCKET_NAME);
    let s = match std::fs::symlink_metadata(&sock) {
        Ok(s) if s.file_type().is_socket() => s,
        // No socket (the agent is between its start and its bind, or
        // gone): the books are still the agent's if it made them (root's,
        // writable by root only, in a directory only root writes); then
        // allocations wait for the agent, never go back to the shared file.
        _ => return Ok(agents_books(dir)),
    };
    let d = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !d.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if d.uid() != 0 || d.mode() & 0o022 != 0 {
        return Err(format!(
            "{} holds {SOCKET_NAME} but is not the host's (owned by uid {}, mode {:o}; secure mode needs root's, writable by root only)",
            dir.display(),
            d.uid(),
            d.mode() & 0o7777
        ));
    }
    if s.uid() != 0 {
        return Err(format!(
            "{} is owned by uid {}, not root",
            sock.display(),
            s.uid()
        ));
    }
    Ok(true)
}

/// Does `dir` hold ledgers the node agent made: the directory root's and
/// writable by root only, and a ledger file in it root's and writable by
/// root only (the shared books are every uid's to write)?
fn agents_books(dir: &Path) -> bool {
    let host_only = |m: &std::fs::Metadata| m.uid() == 0 && m.mode() & 0o022 == 0;
    std::fs::symlink_metadata(dir).is_ok_and(|d| d.is_dir() && host_only(&d))
        && Ledger::list(dir)
            .iter()
            .any(|f| std::fs::symlink_metadata(f).is_ok_and(|m| m.is_file() && host_only(&m)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(mode: u32) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "cgpu-mode-{}-{}",
            std::process::id(),
            crate::clock::monotonic_ns()
        ));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        d
    }

    /// Only the host's socket, in a directory only root writes, is secure
    /// mode; a socket a tenant could plant is ignored, never trusted.
    #[test]
    fn only_the_hosts_socket_means_secure_mode() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test makes root's directories: run it as root");
        }
        let d = dir(0o755);
        assert_eq!(secure(&d), Ok(false), "no socket");
        // The agent's books without its socket (it is restarting): still
        // secure; the shared books (every uid's to write) are not.
        let f = Ledger::path_for(&d, "GPU-00000000-0000-0000-0000-000000000002");
        std::fs::write(&f, "").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(secure(&d), Ok(false), "shared books");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(secure(&d), Ok(true), "the agent's books, its socket gone");
        std::fs::remove_file(&f).unwrap();
        std::fs::write(d.join(SOCKET_NAME), "").unwrap();
        assert_eq!(secure(&d), Ok(false), "a plain file is no socket");
        std::fs::remove_file(d.join(SOCKET_NAME)).unwrap();
        let _l = std::os::unix::net::UnixListener::bind(d.join(SOCKET_NAME)).unwrap();
        assert_eq!(secure(&d), Ok(true));
        for m in [0o1777, 0o775] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(m)).unwrap();
            assert!(secure(&d).is_err(), "mode {m:o}: others could plant it");
        }
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::lchown(d.join(SOCKET_NAME), Some(65534), None).unwrap();
        assert!(secure(&d).is_err(), "a socket that is not root's");
        let _ = std::fs::remove_dir_all(&d);
    }
}
