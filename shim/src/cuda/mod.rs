//! The CUDA driver API, by area. Every `#[unsafe(no_mangle)]` function here is
//! exported under the real driver's symbol name (`_v2`, `_ptds`, `_ptsz`
//! suffixes included) and listed in `procaddr_table.rs` for `cuGetProcAddress`.

pub mod array;
pub mod checkpoint;
pub mod context;
pub mod device;
pub mod diagnostics;
pub mod export_tables;
pub mod graph;
pub mod green;
pub mod init;
pub mod ipc;
pub mod launch;
pub mod limits;
pub mod link;
pub mod logs;
pub mod managed;
pub mod memory;
pub mod module;
pub mod multicast;
pub mod occupancy;
pub mod procaddr;
mod procaddr_table;
pub mod stream;
pub mod tensor_map;
pub mod unsupported;
pub mod vmm;

pub use array::*;
pub use checkpoint::*;
pub use context::*;
pub use device::*;
pub use diagnostics::*;
pub use export_tables::*;
pub use graph::*;
pub use green::*;
pub use init::*;
pub use ipc::*;
pub use launch::*;
pub use limits::*;
pub use link::*;
pub use logs::*;
pub use managed::*;
pub use memory::*;
pub use module::*;
pub use multicast::*;
pub use occupancy::*;
pub use procaddr::*;
pub use stream::*;
pub use tensor_map::*;
pub use unsupported::*;
pub use vmm::*;
