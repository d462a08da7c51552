//! Which GPUs of a node a pod gets, and how much of each.
//!
//! Pure and deterministic: the same node state and request always give the
//! same answer, so the scheduler extender's filter, its prioritize and its
//! final choice at bind agree, and tests can state exact vectors.
//!
//! Amounts are plain integers in one unit chosen by the caller. The cluster
//! uses whole GiB (a GPU of 16130 MiB counts as `floor(16130 / 1024) = 15`
//! unless its node states the size); the functions never convert units.
//!
//! A pod asks for `gpu-mem` per container (the total over its GPUs) and
//! `gpu-count` M for the whole pod: every container that asks for GPU memory
//! gets `gpu-mem / M` on each of the same M GPUs, which must all be of one
//! node and of equal size. Init containers run one at a time before the app
//! containers, so a GPU must hold the larger of the app containers' sum and
//! the largest init container.

use std::fmt;

/// How a node's GPUs are chosen for a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// Best fit: the GPUs left with the least free memory (fill one GPU
    /// before starting the next; keeps whole GPUs free for large pods).
    #[default]
    Binpack,
    /// The GPUs with the fewest pods, then the most free memory (one pod per
    /// GPU where possible, so one GPU failing takes down fewer pods).
    Spread,
}

impl Policy {
    /// `binpack` or `spread` (case-insensitive).
    pub fn parse(s: &str) -> Option<Policy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "binpack" => Some(Policy::Binpack),
            "spread" => Some(Policy::Spread),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
        }
    }
}

/// One GPU of a node as the scheduler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Index of the GPU on its node (NVML order).
    pub index: u32,
    /// Its size, in the caller's unit.
    pub total: u64,
    /// Already promised to pods (running, terminating or bound).
    pub used: u64,
    /// Number of pods holding a share of it.
    pub pods: u32,
}

impl Gpu {
    pub fn free(&self) -> u64 {
        self.total.saturating_sub(self.used)
    }
}

/// A container's request: its name and its `gpu-mem` (total over the pod's
/// GPUs; 0 for a container that asks for none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRequest {
    pub name: String,
    pub mem: u64,
    pub init: bool,
}

/// What a pod asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub containers: Vec<ContainerRequest>,
    /// `aliyun.com/gpu-count` (1 when the label is absent).
    pub gpu_count: u32,
}

impl Request {
    /// A pod with one app container.
    pub fn single(mem: u64, gpu_count: u32) -> Request {
        Request {
            containers: vec![ContainerRequest {
                name: "main".into(),
                mem,
                init: false,
            }],
            gpu_count,
        }
    }

    /// The same request with its one container renamed (tests, examples).
    pub fn renamed(mut self, name: &str) -> Request {
        if let Some(c) = self.containers.first_mut() {
            c.name = name.to_string();
        }
        self
    }

    /// Whether the pod asks for any GPU memory at all.
    pub fn wants_gpu_mem(&self) -> bool {
        self.containers.iter().any(|c| c.mem > 0)
    }

    /// Checks the request on its own (independent of any node) and returns
    /// what each of its M GPUs must hold: the app containers' shares summed,
    /// or the largest init container's share if that is larger.
    pub fn per_gpu(&self) -> Result<u64, Rejection> {
        let m = self.gpu_count;
        if m == 0 {
            return Err(Rejection::unresolvable(
                "aliyun.com/gpu-count is 0; it must be a whole number of GPUs, 1 or more".into(),
            ));
        }
        let mut app = 0u64;
        let mut init = 0u64;
        for c in &self.containers {
            if c.mem % u64::from(m) != 0 {
                return Err(Rejection::unresolvable(format!(
                    "container {:?} asks for aliyun.com/gpu-mem {} over aliyun.com/gpu-count {}: \
                     {} is not divisible by {} (each GPU must give the same whole number of GiB)",
                    c.name, c.mem, m, c.mem, m
                )));
            }
            let share = c.mem / u64::from(m);
            if c.init {
                init = init.max(share);
            } else {
                app = app.checked_add(share).ok_or_else(|| {
                    Rejection::unresolvable("aliyun.com/gpu-mem requests overflow".into())
                })?;
            }
        }
        Ok(app.max(init))
    }
}

/// Why a pod cannot go on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// For a human: what is wrong and what would fix it.
    pub reason: String,
    /// `true` when evicting pods from this node could make room (not enough
    /// free memory now); `false` when no eviction can help (the node has too
    /// few or too small GPUs, or the request itself is invalid).
    pub resolvable_by_preemption: bool,
}

impl Rejection {
    fn unresolvable(reason: String) -> Rejection {
        Rejection {
            reason,
            resolvable_by_preemption: false,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The GPUs chosen for a pod on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Indices of the chosen GPUs, ascending.
    pub gpus: Vec<u32>,
    /// What the pod holds on each of them.
    pub per_gpu: u64,
    /// Size of each chosen GPU (they are all equal).
    pub gpu_total: u64,
    /// Per container (in request order, containers with no request
    /// included, with 0): its share on each chosen GPU.
    pub containers: Vec<(String, u64)>,
    /// Free memory left on the chosen GPUs, summed, after placing the pod
    /// (the binpack score: lower is a tighter fit).
    pub free_after: u64,
}

/// Chooses the pod's GPUs on a node, or says why it cannot go there.
pub fn place(gpus: &[Gpu], req: &Request, policy: Policy) -> Result<Placement, Rejection> {
    let per_gpu = req.per_gpu()?;
    let m = req.gpu_count as usize;
    if m > gpus.len() {
        return Err(Rejection::unresolvable(format!(
            "the pod asks for {m} GPUs (aliyun.com/gpu-count) but the node has {}",
            gpus.len()
        )));
    }
    // Sizes present on the node, each with how many GPUs have it.
    let mut sizes: Vec<u64> = gpus.iter().map(|g| g.total).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let groups: Vec<(u64, Vec<&Gpu>)> = sizes
        .iter()
        .map(|&s| (s, gpus.iter().filter(|g| g.total == s).collect()))
        .collect();
    let big_enough: Vec<&(u64, Vec<&Gpu>)> = groups
        .iter()
        .filter(|(s, members)| members.len() >= m && *s >= per_gpu)
        .collect();
    if big_enough.is_empty() {
        let largest_group = groups.iter().map(|(_, g)| g.len()).max().unwrap_or(0);
        let reason = if largest_group < m {
            format!(
                "the pod asks for {m} GPUs of equal size (aliyun.com/gpu-count) but the node has \
                 at most {largest_group} of one size"
            )
        } else {
            let best = groups
                .iter()
                .filter(|(_, g)| g.len() >= m)
                .map(|(s, _)| *s)
                .max()
                .unwrap_or(0);
            format!(
                "each of the pod's {m} GPUs must give {per_gpu} but the node's GPUs hold at most \
                 {best} each"
            )
        };
        return Err(Rejection::unresolvable(reason));
    }
    // Within each size, the policy's order picks the M GPUs; across sizes,
    // binpack takes the tightest set and spread the set with the fewest
    // pods, then the most free memory (ties: the smaller size, seen first).
    let set_key = |set: &[&Gpu], free_after: u64| -> (u64, u64) {
        match policy {
            Policy::Binpack => (free_after, 0),
            Policy::Spread => (
                set.iter().map(|g| u64::from(g.pods)).sum(),
                u64::MAX - free_after,
            ),
        }
    };
    let mut best: Option<(Vec<&Gpu>, u64)> = None;
    for (_, members) in big_enough {
        let mut fit: Vec<&Gpu> = members
            .iter()
            .copied()
            .filter(|g| g.free() >= per_gpu)
            .collect();
        if fit.len() < m {
            continue;
        }
        match policy {
            Policy::Binpack => fit.sort_by_key(|g| (g.free(), g.index)),
            Policy::Spread => fit.sort_by_key(|g| (g.pods, std::cmp::Reverse(g.free()), g.index)),
        }
        fit.truncate(m);
        let free_after: u64 = fit.iter().map(|g| g.free() - per_gpu).sum();
        let better = match &best {
            None => true,
            Some((chosen, chosen_free)) => {
                set_key(&fit, free_after) < set_key(chosen, *chosen_free)
            }
        };
        if better {
            best = Some((fit, free_after));
        }
    }
    let Some((chosen, free_after)) = best else {
        let most_free: Vec<String> = {
            let mut f: Vec<&Gpu> = gpus.iter().collect();
            f.sort_by_key(|g| (std::cmp::Reverse(g.free()), g.index));
            f.iter()
                .take(m)
                .map(|g| format!("GPU{} {}/{}", g.index, g.free(), g.total))
                .collect()
        };
        return Err(Rejection {
            reason: format!(
                "not enough free GPU memory: the pod needs {per_gpu} on each of {m} GPUs; the most \
                 free (free/total) are {}; evicting pods from this node would make room",
                most_free.join(", ")
            ),
            resolvable_by_preemption: true,
        });
    };
    let mut gpus_idx: Vec<u32> = chosen.iter().map(|g| g.index).collect();
    gpus_idx.sort_unstable();
    let m64 = u64::from(req.gpu_count);
    Ok(Placement {
        gpus: gpus_idx,
        per_gpu,
        gpu_total: chosen[0].total,
        containers: req
            .containers
            .iter()
            .map(|c| (c.name.clone(), c.mem / m64))
            .collect(),
        free_after,
    })
}

/// A score in `0..=max` for the extender's prioritize: how well the pod fits
/// this node under the policy (binpack: tighter fit scores higher; spread:
/// more free memory left scores higher). `None` when it does not fit.
pub fn score(gpus: &[Gpu], req: &Request, policy: Policy, max: i64) -> Option<i64> {
    let p = place(gpus, req, policy).ok()?;
    let capacity = p.gpu_total.saturating_mul(p.gpus.len() as u64).max(1);
    let free_frac = (p.free_after as i128 * max as i128 / capacity as i128) as i64;
    Some(match policy {
        Policy::Binpack => max - free_frac,
        Policy::Spread => free_frac,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(free_total: &[(u64, u64)]) -> Vec<Gpu> {
        free_total
            .iter()
            .enumerate()
            .map(|(i, &(free, total))| Gpu {
                index: i as u32,
                total,
                used: total - free,
                pods: u32::from(free < total),
            })
            .collect()
    }

    fn apply(node: &mut [Gpu], p: &Placement) {
        for g in node.iter_mut() {
            if p.gpus.contains(&g.index) {
                g.used += p.per_gpu;
                g.pods += 1;
            }
        }
    }

    #[test]
    fn binpack_puts_two_small_pods_on_gpu0() {
        let mut node = gpus(&[(15, 15), (15, 15)]);
        let a = place(&node, &Request::single(2, 1), Policy::Binpack).unwrap();
        assert_eq!(a.gpus, vec![0]);
        apply(&mut node, &a);
        let b = place(&node, &Request::single(3, 1), Policy::Binpack).unwrap();
        assert_eq!(b.gpus, vec![0]);
        apply(&mut node, &b);
        assert_eq!(node[0].used, 5);
        assert_eq!(node[1].used, 0);
    }

    #[test]
    fn spread_puts_two_small_pods_on_gpu0_and_gpu1() {
        let mut node = gpus(&[(15, 15), (15, 15)]);
        let a = place(&node, &Request::single(2, 1), Policy::Spread).unwrap();
        assert_eq!(a.gpus, vec![0]);
        apply(&mut node, &a);
        let b = place(&node, &Request::single(3, 1), Policy::Spread).unwrap();
        assert_eq!(b.gpus, vec![1]);
    }

    #[test]
    fn eight_over_two_is_four_and_four() {
        let node = gpus(&[(15, 15), (15, 15)]);
        let p = place(&node, &Request::single(8, 2), Policy::Binpack).unwrap();
        assert_eq!(p.gpus, vec![0, 1]);
        assert_eq!(p.per_gpu, 4);
        assert_eq!(p.containers, vec![("main".to_string(), 4)]);
    }

    #[test]
    fn seven_over_two_is_rejected_for_good() {
        let node = gpus(&[(15, 15), (15, 15)]);
        let r = place(&node, &Request::single(7, 2), Policy::Binpack).unwrap_err();
        assert!(!r.resolvable_by_preemption);
        assert!(r.reason.contains("not divisible"), "{}", r.reason);
    }

    #[test]
    fn binpack_best_fit_in_mib() {
        // Free 12207/8138/4069/16276 MiB on four 16276 MiB GPUs, 8138 MiB asked.
        let node = gpus(&[(12207, 16276), (8138, 16276), (4069, 16276), (16276, 16276)]);
        let p = place(&node, &Request::single(8138, 1), Policy::Binpack).unwrap();
        assert_eq!(p.gpus, vec![1]);
        assert_eq!(p.free_after, 0);
    }

    #[test]
    fn more_gpus_than_the_node_has_is_unresolvable() {
        let node = gpus(&[(15, 15), (15, 15)]);
        let r = place(&node, &Request::single(6, 3), Policy::Binpack).unwrap_err();
        assert!(!r.resolvable_by_preemption);
        assert!(r.reason.contains("node has 2"), "{}", r.reason);
    }

    #[test]
    fn too_little_free_is_resolvable_by_preemption() {
        let node = gpus(&[(3, 15), (15, 15)]);
        let r = place(&node, &Request::single(8, 2), Policy::Binpack).unwrap_err();
        assert!(r.resolvable_by_preemption);
        assert!(
            r.reason.contains("needs 4 on each of 2 GPUs"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn a_share_larger_than_any_gpu_is_unresolvable() {
        let node = gpus(&[(15, 15), (15, 15)]);
        let r = place(&node, &Request::single(16, 1), Policy::Binpack).unwrap_err();
        assert!(!r.resolvable_by_preemption);
    }

    #[test]
    fn gpus_of_one_pod_have_equal_size() {
        // GPU0 is 15 GiB, GPU1 and GPU2 are 23 GiB: two GPUs must be 1 and 2.
        let node = vec![
            Gpu {
                index: 0,
                total: 15,
                used: 0,
                pods: 0,
            },
            Gpu {
                index: 1,
                total: 23,
                used: 10,
                pods: 1,
            },
            Gpu {
                index: 2,
                total: 23,
                used: 0,
                pods: 0,
            },
        ];
        let p = place(&node, &Request::single(8, 2), Policy::Binpack).unwrap();
        assert_eq!(p.gpus, vec![1, 2]);
        assert_eq!(p.gpu_total, 23);
        let node = vec![
            Gpu {
                index: 0,
                total: 15,
                used: 0,
                pods: 0,
            },
            Gpu {
                index: 1,
                total: 23,
                used: 0,
                pods: 0,
            },
        ];
        let r = place(&node, &Request::single(2, 2), Policy::Binpack).unwrap_err();
        assert!(!r.resolvable_by_preemption);
        assert!(r.reason.contains("equal size"), "{}", r.reason);
    }

    #[test]
    fn containers_share_the_pods_gpus_and_init_containers_take_the_max() {
        let req = Request {
            containers: vec![
                ContainerRequest {
                    name: "setup".into(),
                    mem: 10,
                    init: true,
                },
                ContainerRequest {
                    name: "a".into(),
                    mem: 4,
                    init: false,
                },
                ContainerRequest {
                    name: "sidecar".into(),
                    mem: 0,
                    init: false,
                },
                ContainerRequest {
                    name: "b".into(),
                    mem: 2,
                    init: false,
                },
            ],
            gpu_count: 2,
        };
        assert_eq!(req.per_gpu().unwrap(), 5);
        let node = gpus(&[(15, 15), (15, 15)]);
        let p = place(&node, &req, Policy::Binpack).unwrap();
        assert_eq!(p.per_gpu, 5);
        assert_eq!(
            p.containers,
            vec![
                ("setup".to_string(), 5),
                ("a".to_string(), 2),
                ("sidecar".to_string(), 0),
                ("b".to_string(), 1)
            ]
        );
    }

    #[test]
    fn gpu_count_zero_is_rejected() {
        let r = Request::single(4, 0).per_gpu().unwrap_err();
        assert!(!r.resolvable_by_preemption);
    }

    #[test]
    fn scores_follow_the_policy() {
        let tight = gpus(&[(4, 15)]);
        let loose = gpus(&[(15, 15)]);
        let req = Request::single(4, 1);
        assert!(
            score(&tight, &req, Policy::Binpack, 10) > score(&loose, &req, Policy::Binpack, 10)
        );
        assert!(score(&tight, &req, Policy::Spread, 10) < score(&loose, &req, Policy::Spread, 10));
        assert_eq!(score(&gpus(&[(3, 15)]), &req, Policy::Binpack, 10), None);
    }
}
