//! The layer below the hooks: what this process knows of the driver and its
//! GPUs, used by memory accounting (`crate::memory`), the scheduler and the
//! hooks (which translate C calls into it), and never calling back into the
//! hooks.
//!
//! - [`driver`]: loading the real driver; [`table`]: its function table
//!   (`real::<name>`, `sig::<name>`), generated from the declaration list;
//! - [`gpus`]: GPU identity and visibility (one table of the visible GPUs by
//!   UUID, host CUDA ordinal, NVML index, for the CUDA and the NVML hooks)
//!   and lazy joining (a GPU is joined when the process allocates, creates
//!   a context or launches there; asking about it never joins);
//! - [`clock`]: the one clock (monotonic and wall time); [`cstr`]: text
//!   in fixed C buffers;
//! - [`fork`]: the fork generation (bumped in a forked child; caches made
//!   before a fork check it);
//! - [`charges`]: which object owns each memory charge (context, pool,
//!   device, handle, mapping, graph pool) and what gives it back; the
//!   accounting against the ledger (`crate::memory::Gpu`) is done by
//!   `crate::memory`;
//! - [`types`]: the C types of the declaration list.
//!
//! Lock order: the measurement lock (`hooks::context`: context creation and
//! limits) before the charges' locks (allocations, VMM, pools); none is
//! held while calling a hook; the ledger's locks are taken last.

/// Call the real function or return the loader's code for a missing one.
macro_rules! call_real {
    ($real:expr, $($arg:expr),* $(,)?) => {
        match $real.get() {
            // SAFETY: the real driver function with the caller's own arguments,
            // which the C contract of this entry point makes valid.
            Some(f) => unsafe { f($($arg),*) },
            None => $real.missing(),
        }
    };
}
pub(crate) use call_real;

pub mod charges;
pub mod clock;
pub mod cstr;
pub mod driver;
pub mod fork;
pub mod gpus;
pub mod table;
pub mod types;

pub use table::{real, sig};
