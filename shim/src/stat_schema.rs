//! The JSON document `cgpu-sim-stat --json` prints (schema in
//! `shim/README.md`). Plain data only: the test kit compiles this same file
//! (`#[path]`) to read the document, so the schema is written once.

use serde::{Deserialize, Serialize};

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DeviceStat {
    pub index: usize,
    pub uuid: String,
    pub name: String,
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub busy_ns: u64,
    pub kernels: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ProcessStat {
    pub pid: u32,
    pub slot: usize,
    pub comm: String,
    pub alive: bool,
    pub device: usize,
    pub mem_bytes: u64,
    pub device_time_ns: u64,
    pub kernels: u64,
}

/// Calls to a function the sim only stubs (see `stubs.rs`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StubStat {
    pub name: String,
    pub calls: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub schema: u32,
    pub state_dir: String,
    pub devices: Vec<DeviceStat>,
    pub processes: Vec<ProcessStat>,
    /// Every stub called at least once, by name (all processes together).
    #[serde(default)]
    pub stubs: Vec<StubStat>,
}

impl Snapshot {
    /// The record of `pid` on `device`.
    pub fn process(&self, pid: u32, device: usize) -> Option<&ProcessStat> {
        self.processes
            .iter()
            .find(|p| p.pid == pid && p.device == device)
    }
}
