//! Secure mode: what the device shows and the books do not is charged.
//!
//! Every pass, for each process of a container on a GPU, the bytes NVML
//! shows it holding beyond what the ledger charges that process (its
//! context, loaded modules, anything allocated around the library) are
//! charged to its container's row, through a process slot the agent holds
//! for that row (the row's "device" charge). The charge is kept per
//! process: when a process ends, or holds less, its part is given back at
//! the next pass. A container over its quota because of such bytes is
//! refused further allocations by the ledger's own quota check.
//!
//! A container with no row on that GPU gets one from the host's settings
//! (as its first Hello would); without settings nothing is charged (the
//! pass still reports it).

use crate::nvml::GpuInfo;
use crate::secure::host_settings;
use crate::GpuUse;
use cgpu_ledger::{JoinRequest, Ledger, Membership};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The device charge of one container row on one GPU.
struct Row {
    m: Membership,
    /// What the row's agent slot holds now.
    charged: u64,
    /// Per process (host pid): its part of `charged`.
    per_proc: HashMap<u32, u64>,
}

/// One GPU's ledger, held open so that the agent's slots stay alive.
struct Held {
    ledger: Ledger,
    /// By container identity key.
    rows: HashMap<u64, Row>,
}

/// The agent's device charges on every GPU.
pub struct Books {
    settings_dir: PathBuf,
    held: HashMap<PathBuf, Held>,
}

impl Books {
    pub fn new(settings_dir: PathBuf) -> Books {
        Books {
            settings_dir,
            held: HashMap::new(),
        }
    }

    /// The handle of the ledger at `path`, opened once and kept.
    pub fn ledger(&mut self, path: &Path) -> Result<&Ledger, cgpu_ledger::LedgerError> {
        if !self.held.contains_key(path) {
            let ledger = Ledger::open(path)?;
            self.held.insert(
                path.to_owned(),
                Held {
                    ledger,
                    rows: HashMap::new(),
                },
            );
        }
        Ok(&self.held[path].ledger)
    }

    /// Charges what `g`'s processes hold beyond the books to their rows,
    /// gives back what is no longer held, and writes what each row is
    /// charged into `g`'s containers (and each process's part into its
    /// `unseen`, which stays what it holds beyond its own slots).
    pub fn settle(&mut self, g: &mut GpuUse) {
        let Some(h) = self.held.get_mut(&g.ledger) else {
            return;
        };
        let info = {
            let f = h.ledger.file();
            GpuInfo {
                index: f.header.read_gpu_index(),
                uuid: f.header.uuid_str(),
                total: f.header.read_physical_total(),
            }
        };
        let mut seen = Vec::new();
        for c in &mut g.containers {
            let key = c.identity.key;
            let want: HashMap<u32, u64> = c
                .procs
                .iter()
                .filter(|p| p.unseen > 0)
                .map(|p| (p.pid, p.unseen))
                .collect();
            let total: u64 = want.values().sum();
            if total == 0 {
                continue; // a row it had is given back below
            }
            if !h.rows.contains_key(&key) {
                let Some(m) = join_row(&h.ledger, &self.settings_dir, c, &info) else {
                    continue;
                };
                h.rows.insert(
                    key,
                    Row {
                        m,
                        charged: 0,
                        per_proc: HashMap::new(),
                    },
                );
            }
            let row = h.rows.get_mut(&key).expect("inserted above");
            if total > row.charged {
                // They exist on the device: they count, whatever the quota.
                h.ledger.register_held(&row.m, total - row.charged);
            } else if total < row.charged {
                h.ledger.release(&row.m, row.charged - total);
            }
            row.charged = total;
            row.per_proc = want;
            c.charged = total;
            c.slot = c.slot.or(Some(row.m.container));
            seen.push(key);
        }
        // Rows whose processes are gone or hold nothing beyond the books.
        let gone: Vec<u64> = h
            .rows
            .keys()
            .filter(|k| !seen.contains(k))
            .copied()
            .collect();
        for k in gone {
            if let Some(row) = h.rows.remove(&k) {
                h.ledger.leave(&row.m);
            }
        }
        // The row's numbers as they are now.
        let snap = h.ledger.snapshot();
        for c in &mut g.containers {
            if let Some(r) = c
                .slot
                .and_then(|s| snap.containers.iter().find(|r| r.slot == s))
            {
                c.quota = r.quota;
                c.ledger_used = r.used;
                c.enforce_off = r.enforce_off;
            }
        }
    }

    /// Per GPU ledger and container key: the bytes charged, per process.
    pub fn charges(&self, ledger: &Path, key: u64) -> Option<&HashMap<u32, u64>> {
        self.held.get(ledger)?.rows.get(&key).map(|r| &r.per_proc)
    }
}

/// A process slot in `c`'s row for the device charge: the row as it is
/// when it exists (its settings unchanged), else made from the host's
/// settings for the container. `None` when the container has neither.
fn join_row(
    l: &Ledger,
    settings_dir: &Path,
    c: &crate::ContainerUse,
    info: &GpuInfo,
) -> Option<Membership> {
    let f = l.file();
    let existing = c.slot.and_then(|s| {
        let r = &f.containers[s];
        (r.state.load(std::sync::atomic::Ordering::Acquire) == cgpu_ledger::SLOT_LIVE).then(|| {
            (
                r.id_str(),
                r.key.load(std::sync::atomic::Ordering::Acquire),
                r.enforce_off.load(std::sync::atomic::Ordering::Acquire) != 0,
                r.highprio.load(std::sync::atomic::Ordering::Acquire) != 0,
            )
        })
    });
    let (name, key, quota, weight, highprio, enforce_off) = match existing {
        // Defaults (no quota asked, weight 1) never change a live row.
        Some((name, key, off, high)) => (name, key, 0, 1, high, off),
        None => {
            let cid = c.identity.container_id.as_deref()?;
            let s = host_settings(settings_dir, cid, info).ok()??;
            let name = s.name.unwrap_or_else(|| c.identity.name.clone());
            (
                name,
                c.identity.key,
                s.quota,
                s.weight,
                s.highprio,
                s.enforce_off,
            )
        }
    };
    let jr = JoinRequest {
        container_id: &name,
        key,
        quota,
        weight,
        highprio,
        enforce_off,
    };
    l.join_within(&jr, std::time::Duration::from_millis(50))
        .ok()
}
