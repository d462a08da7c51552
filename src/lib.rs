//! cgpu: GPU sharing for containers. See README.md and docs/.

mod api;
pub mod config;
pub mod hooks;
pub mod log;
pub mod memory;
pub mod process;
pub mod scheduler;

/// The books shared with every process and tool on the host (crate
/// `cgpu-ledger`), by the names the library's modules use.
pub use cgpu_ledger as ledger;
pub use cgpu_ledger::identity;

/// The real driver's loader (kept at its old path: `process::driver`).
pub use process::driver;

/// `cgpu-library-version=X.Y.Z` between NULs: how the tools read the version
/// of an installed `libcgpu.so` from its file, without loading it
/// (`cgpuctl version`). Exported so that the linker keeps it.
#[unsafe(no_mangle)]
pub static CGPU_LIBRARY_VERSION: [u8; VERSION_TAG.len()] = {
    let mut out = [0u8; VERSION_TAG.len()];
    let tag = VERSION_TAG.as_bytes();
    let mut i = 0;
    while i < tag.len() {
        out[i] = tag[i];
        i += 1;
    }
    out
};

pub use cgpu_ledger::VERSION_TAG;
