//! Properties of placement over random nodes and pods: it never over-commits
//! a GPU, and it finds a placement whenever one exists (checked against an
//! exhaustive search over every set of GPUs).

use cgpu_cluster_core::placement::{place, ContainerRequest, Gpu, Policy, Request};
use proptest::prelude::*;

fn node() -> impl Strategy<Value = Vec<Gpu>> {
    prop::collection::vec(
        (
            prop::sample::select(vec![15u64, 23, 31]),
            0u64..=31,
            0u32..4,
        ),
        1..6,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (total, used, pods))| Gpu {
                index: i as u32,
                total,
                used: used.min(total),
                pods,
            })
            .collect()
    })
}

fn request() -> impl Strategy<Value = Request> {
    (
        prop::collection::vec((0u64..=24, any::<bool>()), 1..4),
        1u32..5,
    )
        .prop_map(|(cs, m)| Request {
            containers: cs
                .into_iter()
                .enumerate()
                .map(|(i, (mem, init))| ContainerRequest {
                    name: format!("c{i}"),
                    mem,
                    init,
                })
                .collect(),
            gpu_count: m,
        })
}

fn policy() -> impl Strategy<Value = Policy> {
    prop::sample::select(vec![Policy::Binpack, Policy::Spread])
}

/// Every set of `m` GPUs of equal size on which `per_gpu` fits.
fn exists(gpus: &[Gpu], m: usize, per_gpu: u64) -> bool {
    let n = gpus.len();
    (0u32..(1 << n)).any(|mask| {
        let set: Vec<&Gpu> = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| &gpus[i])
            .collect();
        set.len() == m
            && set
                .iter()
                .all(|g| g.total == set[0].total && g.free() >= per_gpu)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn finds_a_placement_whenever_one_exists(gpus in node(), req in request(), policy in policy()) {
        match req.per_gpu() {
            Err(_) => prop_assert!(place(&gpus, &req, policy).is_err()),
            Ok(per_gpu) => {
                let possible = exists(&gpus, req.gpu_count as usize, per_gpu);
                let got = place(&gpus, &req, policy);
                prop_assert_eq!(got.is_ok(), possible, "{:?}", got);
                if let Err(r) = got {
                    // Preemption can help exactly when M GPUs of one size
                    // would hold the share were they empty.
                    let empty: Vec<Gpu> = gpus.iter().map(|g| Gpu { used: 0, pods: 0, ..g.clone() }).collect();
                    prop_assert_eq!(r.resolvable_by_preemption, exists(&empty, req.gpu_count as usize, per_gpu), "{}", r.reason);
                }
            }
        }
    }

    #[test]
    fn never_over_commits(mut gpus in node(), reqs in prop::collection::vec(request(), 1..30), policy in policy()) {
        for req in &reqs {
            if let Ok(p) = place(&gpus, req, policy) {
                prop_assert_eq!(p.gpus.len(), req.gpu_count as usize);
                let mut sorted = p.gpus.clone();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), p.gpus.len(), "a GPU chosen twice");
                for g in gpus.iter_mut().filter(|g| p.gpus.contains(&g.index)) {
                    prop_assert_eq!(g.total, p.gpu_total);
                    g.used += p.per_gpu;
                    g.pods += 1;
                    prop_assert!(g.used <= g.total, "GPU{} over-committed: {}/{}", g.index, g.used, g.total);
                }
            }
        }
    }

    #[test]
    fn is_deterministic(gpus in node(), req in request(), policy in policy()) {
        prop_assert_eq!(place(&gpus, &req, policy), place(&gpus, &req, policy));
    }
}
