//! The installed `libcgpu.so` and its version (`cgpuctl version`), read from
//! the file without loading it: the library carries
//! `\0cgpu-library-version=X.Y.Z\0` (`cgpu_ledger::VERSION_TAG`, exported as
//! `CGPU_LIBRARY_VERSION` so the linker keeps it, stripped or not).

use std::path::{Path, PathBuf};

/// Where hosts and images usually put the library, after the entries of
/// `/etc/ld.so.preload`.
pub const USUAL_PATHS: &[&str] = &[
    "/opt/cgpu/libcgpu.so",
    "/usr/local/lib/libcgpu.so",
    "/usr/lib/libcgpu.so",
    "/usr/lib64/libcgpu.so",
    "/usr/lib/x86_64-linux-gnu/libcgpu.so",
];

const MARKER: &[u8] = b"\0cgpu-library-version=";
/// Larger files are not a cgpu library (ours is a few MiB, with debug info
/// tens): do not read them.
const MAX_LIBRARY_BYTES: u64 = 256 << 20;

/// The version a cgpu library file carries; `Ok(None)` for a file without
/// the tag (not a cgpu library, or one older than the tag).
pub fn library_version(path: &Path) -> std::io::Result<Option<String>> {
    let len = std::fs::metadata(path)?.len();
    if len > MAX_LIBRARY_BYTES {
        return Ok(None);
    }
    let bytes = std::fs::read(path)?;
    let Some(at) = bytes.windows(MARKER.len()).position(|w| w == MARKER) else {
        return Ok(None);
    };
    let rest = &bytes[at + MARKER.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let v = &rest[..end];
    let plausible = !v.is_empty()
        && v.len() <= 64
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || b".-+_".contains(b));
    Ok(plausible.then(|| String::from_utf8_lossy(v).into_owned()))
}

/// Library files named in `/etc/ld.so.preload`-style text (whitespace or
/// colon separated) whose name contains `cgpu`.
pub fn preload_entries(text: &str) -> Vec<PathBuf> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split(|c: char| c.is_whitespace() || c == ':'))
        .filter(|w| !w.is_empty())
        .filter(|w| {
            Path::new(w)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains("cgpu"))
        })
        .map(PathBuf::from)
        .collect()
}

/// Existing candidate files: `/etc/ld.so.preload`'s cgpu entries, then the
/// usual paths, each file once.
pub fn find_installed() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    let preload = std::fs::read_to_string("/etc/ld.so.preload").unwrap_or_default();
    let candidates = preload_entries(&preload)
        .into_iter()
        .chain(USUAL_PATHS.iter().map(PathBuf::from));
    for p in candidates {
        if !p.is_file() {
            continue;
        }
        let canon = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
        if !seen.contains(&canon) {
            seen.push(canon);
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_entries_keep_cgpu_libraries_only() {
        let t =
            "# comment\n/opt/cgpu/libcgpu.so /usr/lib/libfoo.so\n/x/libcgpu-dbg.so:/y/libbar.so\n";
        assert_eq!(
            preload_entries(t),
            [
                PathBuf::from("/opt/cgpu/libcgpu.so"),
                PathBuf::from("/x/libcgpu-dbg.so")
            ]
        );
    }

    #[test]
    fn version_read_from_a_file() {
        let dir = std::env::temp_dir().join(format!("cgpu-installed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("lib.so");
        let mut bytes = vec![7u8; 1000];
        bytes.extend_from_slice(cgpu_ledger::VERSION_TAG.as_bytes());
        bytes.extend_from_slice(&[9u8; 100]);
        std::fs::write(&f, &bytes).unwrap();
        assert_eq!(
            library_version(&f).unwrap().as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        std::fs::write(&f, b"\0cgpu-library-version=\xff\xfe\0").unwrap();
        assert_eq!(library_version(&f).unwrap(), None);
        std::fs::write(&f, b"no tag here").unwrap();
        assert_eq!(library_version(&f).unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
