//! The layer below the hooks, memory accounting and the scheduler: what
//! this process knows of the driver and its GPUs. It calls none of them
//! (and never the hooks): they call it.
//!
//! - [`driver`]: loading the real driver; [`table`]: its function table
//!   (`real::<name>`, `sig::<name>`), generated from the declaration list;
//! - [`gpus`]: GPU identity and visibility (one table of the visible GPUs by
//!   UUID, host CUDA ordinal, NVML index, for the CUDA and the NVML hooks);
//!   joining a GPU's ledger lazily (when the process allocates, creates a
//!   context or launches there; asking about it never joins) is
//!   `crate::memory`'s;
//! - [`clock`]: the one clock (monotonic and wall time); [`cstr`]: text
//!   in fixed C buffers;
//! - [`fork`]: the fork generation (bumped in a forked child; caches made
//!   before a fork check it);
//! - [`types`]: the C types of the declaration list.
//!
//! Lock order: the capture lock (`hooks::stream`: stream-ordered
//! allocations shared, a capture's begin and end exclusive) before the
//! measurement lock (`hooks::context`: context creation, limits, module
//! loads) before the charges' locks (allocations, VMM, pools, modules);
//! none is held while calling a hook; the ledger's locks are taken last.
//! The capture and measurement locks are one per fork generation
//! ([`fork::ForkLocal`]): a forked child never waits on a parent thread.

/// Call the real function or return the loader's code for a missing one.
macro_rules! call_real {
    ($real:expr, $($arg:expr),* $(,)?) => {
        match $real.get() {
            // SAFETY: the real driver function of that name, with arguments
            // its C contract accepts: at every call site they are either the
            // application's own, passed on as its call gave them (valid by
            // the contract of the entry point it called), or cgpu's own:
            // out-parameters and buffers of live locals (with their lengths),
            // strings it keeps alive for the call, and handles, contexts,
            // streams and device numbers the driver handed out.
            Some(f) => unsafe { f($($arg),*) },
            None => $real.missing(),
        }
    };
}
pub(crate) use call_real;

pub mod driver;
pub mod fork;
pub mod gpus;
pub mod table;
pub mod types;

pub use cgpu_ledger::{clock, cstr};
pub use table::{real, sig};
