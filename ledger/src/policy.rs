//! Shares by policy (docs/scheduling.md): pure functions, no clock, no ledger.

/// Base slice: long enough that a handover (a drain and a wake-up, tens to
/// hundreds of µs) costs well under 1% of the GPU, short enough that 20 ms
/// kernels still alternate many times per second.
pub const SLICE_NS: u64 = 40_000_000;

/// `<gpu>/policy` values.
pub const FAIR_SHARE: u32 = 0;
pub const PREEMPTIVE: u32 = 1;
pub const WEIGHTED: u32 = 2;
pub const FIXED: u32 = 3;
pub const SOFT: u32 = 4;
pub const NATIVE: u32 = 5;

/// The GPU's knobs as the scheduler reads them (already range-clamped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    pub policy: u32,
    pub max_inst: u32,
    pub prio_ratio: u32,
}

impl Knobs {
    /// Clamp raw ledger values into their documented ranges (a corrupt or
    /// half-written ledger never makes the scheduler divide by zero).
    pub fn sanitized(policy: u32, max_inst: u32, prio_ratio: u32) -> Knobs {
        Knobs {
            policy: if policy > NATIVE { PREEMPTIVE } else { policy },
            max_inst: max_inst.clamp(1, 25),
            prio_ratio: prio_ratio.clamp(20, 99),
        }
    }
    /// Policies that give idle containers' time to busy ones.
    pub fn work_conserving(&self) -> bool {
        matches!(self.policy, PREEMPTIVE | SOFT)
    }
    /// No compute control at all.
    pub fn native(&self) -> bool {
        self.policy == NATIVE
    }
}

/// What the share computation needs to know about one container slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Member {
    /// The slot is live (has processes).
    pub live: bool,
    pub weight: u32,
    pub highprio: bool,
    /// Has GPU work now (a thread waiting to launch, or holding the GPU).
    pub active: bool,
}

impl Member {
    /// May get compute at all (weight 0 = arrived when `free_weight` was 0).
    pub fn eligible(&self) -> bool {
        self.live && self.weight > 0
    }
}

/// Fraction of the GPU's time each container is entitled to right now, into
/// `out` (same length as `ms`). In work-conserving policies the fractions of
/// the active containers sum to 1 (idle ones get 0: their time is given
/// away); otherwise idle containers keep theirs and the rest is wasted.
///
/// High priority: high-priority containers that have work share
/// `prio_ratio`% among themselves (by the policy's rule), the others share
/// the rest by the policy; an idle high-priority container is left out.
pub fn shares(k: &Knobs, ms: &[Member], out: &mut [f64]) {
    debug_assert_eq!(ms.len(), out.len());
    out.iter_mut().for_each(|x| *x = 0.0);
    if k.native() {
        return;
    }
    let hp = |m: &Member| m.eligible() && m.highprio && m.active;
    let normal = |m: &Member| m.eligible() && !m.highprio;
    let any_hp = ms.iter().any(hp);
    let p = if any_hp {
        k.prio_ratio as f64 / 100.0
    } else {
        0.0
    };

    // The policy's rule over one group, scaled to `total`.
    let mut assign = |in_group: &dyn Fn(&Member) -> bool, total: f64| {
        let members = || ms.iter().enumerate().filter(|(_, m)| in_group(m));
        match k.policy {
            FAIR_SHARE => {
                for (i, _) in members() {
                    out[i] = total / k.max_inst as f64;
                }
            }
            PREEMPTIVE | SOFT => {
                let n = members().filter(|(_, m)| m.active).count();
                for (i, m) in members() {
                    if m.active {
                        out[i] = total / n as f64;
                    }
                }
            }
            WEIGHTED => {
                let sum: u64 = members().map(|(_, m)| m.weight as u64).sum();
                for (i, m) in members() {
                    out[i] = total * m.weight as f64 / sum as f64;
                }
            }
            FIXED => {
                for (i, m) in members() {
                    out[i] = total * (m.weight.min(k.max_inst) as f64) / k.max_inst as f64;
                }
            }
            _ => {}
        }
    };
    assign(&normal, 1.0 - p);
    if any_hp {
        // The high-priority group takes `p` whatever the policy; within it,
        // by weight where the policy uses weights, else equally.
        let by_weight = matches!(k.policy, WEIGHTED | FIXED);
        let sum: f64 = ms
            .iter()
            .filter(|m| hp(m))
            .map(|m| if by_weight { m.weight as f64 } else { 1.0 })
            .sum();
        for (i, m) in ms.iter().enumerate() {
            if hp(m) {
                out[i] = p * if by_weight { m.weight as f64 } else { 1.0 } / sum;
            }
        }
    }

    if k.work_conserving() {
        // Idle containers' time goes to those with work: renormalise.
        let sum: f64 = ms
            .iter()
            .zip(out.iter())
            .filter(|(m, _)| m.active)
            .map(|(_, x)| x)
            .sum();
        for (m, x) in ms.iter().zip(out.iter_mut()) {
            *x = if m.active && sum > 0.0 { *x / sum } else { 0.0 };
        }
    }
}

/// The limit (percent of the GPU) container `i` has if every live container
/// had work: what `cgpu-smi` shows as "Limit". Native: 100.
pub fn limit_percent(k: &Knobs, ms: &[Member], i: usize) -> u32 {
    if k.native() {
        return 100;
    }
    let all: Vec<Member> = ms
        .iter()
        .map(|m| Member {
            active: m.live,
            ..*m
        })
        .collect();
    let mut out = vec![0.0; ms.len()];
    shares(k, &all, &mut out);
    (out.get(i).copied().unwrap_or(0.0) * 100.0).round() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(weight: u32, active: bool) -> Member {
        Member {
            live: true,
            weight,
            highprio: false,
            active,
        }
    }
    fn knobs(policy: u32, max_inst: u32) -> Knobs {
        Knobs {
            policy,
            max_inst,
            prio_ratio: 80,
        }
    }
    fn run(k: Knobs, ms: &[Member]) -> Vec<f64> {
        let mut out = vec![0.0; ms.len()];
        shares(&k, ms, &mut out);
        out
    }
    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-9, "{a:?} != {b:?}");
        }
    }

    #[test]
    fn fair_share_is_fixed_one_over_max_inst() {
        close(&run(knobs(0, 4), &[m(1, true)]), &[0.25]);
        close(&run(knobs(0, 4), &[m(1, true), m(1, false)]), &[0.25, 0.25]);
        close(&run(knobs(0, 10), &[m(3, true)]), &[0.1]);
    }

    #[test]
    fn preemptive_divides_among_containers_with_work() {
        close(
            &run(knobs(1, 10), &[m(1, true), m(1, true), m(1, true)]),
            &[1.0 / 3.0; 3],
        );
        close(&run(knobs(1, 10), &[m(1, true), m(1, false)]), &[1.0, 0.0]);
        // Weights do not matter in policy 1.
        close(&run(knobs(1, 10), &[m(1, true), m(4, true)]), &[0.5, 0.5]);
        close(&run(knobs(4, 10), &[m(1, true), m(1, true)]), &[0.5, 0.5]);
    }

    #[test]
    fn weighted_counts_live_idle_containers() {
        close(
            &run(knobs(2, 10), &[m(1, true), m(2, true)]),
            &[1.0 / 3.0, 2.0 / 3.0],
        );
        close(
            &run(
                knobs(2, 10),
                &[m(1, true), m(1, true), m(2, true), m(4, true)],
            ),
            &[0.125, 0.125, 0.25, 0.5],
        );
        // The weight-2 container idle but alive still holds its slices.
        close(
            &run(knobs(2, 10), &[m(1, true), m(2, false)]),
            &[1.0 / 3.0, 2.0 / 3.0],
        );
        // Alone: all of it.
        close(&run(knobs(2, 10), &[m(3, true)]), &[1.0]);
        // A dead slot counts for nothing.
        let dead = Member {
            live: false,
            weight: 5,
            highprio: false,
            active: false,
        };
        close(&run(knobs(2, 10), &[m(1, true), dead]), &[1.0, 0.0]);
    }

    #[test]
    fn fixed_is_weight_over_max_inst() {
        close(&run(knobs(3, 10), &[m(3, true)]), &[0.3]);
        close(&run(knobs(3, 10), &[m(3, true), m(5, true)]), &[0.3, 0.5]);
    }

    #[test]
    fn weight_zero_gets_nothing() {
        for p in 0..5 {
            let out = run(knobs(p, 4), &[m(0, true), m(1, true)]);
            assert_eq!(out[0], 0.0, "policy {p}");
            assert!(out[1] > 0.0, "policy {p}");
        }
    }

    #[test]
    fn native_controls_nothing() {
        close(&run(knobs(5, 4), &[m(1, true), m(1, true)]), &[0.0, 0.0]);
        assert_eq!(limit_percent(&knobs(5, 4), &[m(1, true)], 0), 100);
    }

    #[test]
    fn high_priority_takes_prio_ratio_when_busy_and_nothing_when_idle() {
        let hp = |active| Member {
            live: true,
            weight: 1,
            highprio: true,
            active,
        };
        close(&run(knobs(1, 10), &[hp(true), m(1, true)]), &[0.8, 0.2]);
        close(&run(knobs(1, 10), &[hp(false), m(1, true)]), &[0.0, 1.0]);
        // Alone with work (work-conserving): everything.
        close(&run(knobs(1, 10), &[hp(true), m(1, false)]), &[1.0, 0.0]);
        // Non-work-conserving: the others share the rest by the policy.
        close(&run(knobs(3, 10), &[hp(true), m(5, true)]), &[0.8, 0.1]);
        close(
            &run(knobs(2, 10), &[hp(true), m(1, true), m(3, true)]),
            &[0.8, 0.05, 0.15],
        );
        close(
            &run(knobs(2, 10), &[hp(false), m(1, true), m(3, true)]),
            &[0.0, 0.25, 0.75],
        );
    }

    #[test]
    fn limits_for_tools() {
        let ms = [m(1, false), m(1, false)];
        assert_eq!(limit_percent(&knobs(1, 10), &ms, 0), 50);
        assert_eq!(limit_percent(&knobs(0, 4), &ms, 1), 25);
        let ms = [m(1, false), m(2, false)];
        assert_eq!(limit_percent(&knobs(2, 10), &ms, 1), 67);
        assert_eq!(limit_percent(&knobs(3, 10), &[m(3, false)], 0), 30);
    }

    #[test]
    fn knobs_are_sanitized() {
        assert_eq!(
            Knobs::sanitized(9, 0, 5),
            Knobs {
                policy: 1,
                max_inst: 1,
                prio_ratio: 20
            }
        );
        assert_eq!(
            Knobs::sanitized(2, 99, 100),
            Knobs {
                policy: 2,
                max_inst: 25,
                prio_ratio: 99
            }
        );
    }
}
