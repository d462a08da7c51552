//! The scheduling decision: token buckets of GPU time, refilled at each
//! container's share, charged with the time the GPU was held; the next
//! holder is the waiting container with the most credit. Pure: the caller
//! gathers the ledger words, holds the DECIDING state, and writes back
//! (a process of the holder's container in cooperative mode, the node
//! agent in secure mode).

use crate::policy::{shares, Knobs, Member, SOFT};
use crate::MAX_CONTAINERS;

/// Slice length and bucket bounds for a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Time a holder keeps the GPU when others wait (or when its policy
    /// does not give idle time away).
    pub slice_ns: u64,
    /// Most credit a bucket holds (bounds the burst after an idle period).
    pub cap_ns: i64,
    /// Most debt a bucket carries (bounds the wait after a huge kernel).
    pub floor_ns: i64,
}

pub use crate::policy::SLICE_NS;

impl Params {
    pub fn for_knobs(k: &Knobs) -> Params {
        let slice_ns = if k.policy == SOFT {
            4 * SLICE_NS
        } else {
            SLICE_NS
        };
        Params {
            slice_ns,
            cap_ns: 2 * slice_ns as i64,
            floor_ns: -1_000_000_000,
        }
    }
}

/// One container slot as the decision sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Entry {
    pub live: bool,
    pub weight: u32,
    pub highprio: bool,
    /// A thread of it waits to launch.
    pub wants: bool,
    /// It ran work beside the holder since the last decision (it has GPU
    /// work now, though no thread of it waits).
    pub guest: bool,
    /// Its bucket, ns.
    pub tokens: i64,
    /// Estimated GPU ns per launch (0 = unknown).
    pub ns_per_launch: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Give the GPU to container `c` for `budget_ns`, at most `allow` launches.
    Run {
        c: usize,
        budget_ns: u64,
        allow: u64,
    },
    /// Nobody may run now; look again at `until` (or when someone arrives).
    Idle { until: u64 },
}

/// Refill every bucket for the time since `last_refill`, charge `charge`
/// (holder, ns held), and choose the next holder.
pub fn decide(
    k: &Knobs,
    now: u64,
    last_refill: u64,
    charge: Option<(usize, u64)>,
    es: &mut [Entry],
) -> Decision {
    decide_with(k, &Params::for_knobs(k), now, last_refill, charge, es)
}

/// [`decide`] with bucket bounds of the caller's (the node agent carries
/// more debt: a drain it gave up on is charged in full).
pub fn decide_with(
    k: &Knobs,
    p: &Params,
    now: u64,
    last_refill: u64,
    charge: Option<(usize, u64)>,
    es: &mut [Entry],
) -> Decision {
    assert!(es.len() <= MAX_CONTAINERS);
    let p = *p;
    let holder = charge.map(|(c, _)| c);
    let mut ms = [Member::default(); MAX_CONTAINERS];
    for (i, e) in es.iter().enumerate() {
        ms[i] = Member {
            live: e.live,
            weight: e.weight,
            highprio: e.highprio,
            active: e.wants || e.guest || holder == Some(i),
        };
    }
    let ms = &ms[..es.len()];
    let mut rate = [0.0f64; MAX_CONTAINERS];
    let rate = &mut rate[..es.len()];
    shares(k, ms, rate);

    let dt = now.saturating_sub(last_refill).min(10_000_000_000) as f64;
    for (i, e) in es.iter_mut().enumerate() {
        if !e.live {
            e.tokens = 0;
            continue;
        }
        let mut t = e.tokens as f64 + rate[i] * dt;
        if let Some((h, ns)) = charge {
            if h == i {
                t -= ns as f64;
            }
        }
        e.tokens = (t as i64).clamp(p.floor_ns, p.cap_ns);
    }

    // Who may run: waiting, eligible, entitled to something now.
    let wc = k.work_conserving();
    let mut best: Option<usize> = None;
    let mut until = u64::MAX;
    for (i, e) in es.iter().enumerate() {
        if !(e.wants && ms[i].eligible() && rate[i] > 0.0) {
            continue;
        }
        if !wc && e.tokens <= 0 {
            // Eligible again once the bucket is back above zero.
            let wait = ((1 - e.tokens) as f64 / rate[i]).ceil() as u64 + 1;
            until = until.min(now.saturating_add(wait));
            continue;
        }
        // Most credit first; on a tie, not the one that just held it.
        let better = match best {
            None => true,
            Some(b) => e.tokens > es[b].tokens || e.tokens == es[b].tokens && holder == Some(b),
        };
        if better {
            best = Some(i);
        }
    }
    match best {
        Some(c) => Decision::Run {
            c,
            budget_ns: p.slice_ns,
            allow: allowance(p.slice_ns, es[c].ns_per_launch),
        },
        None => Decision::Idle { until },
    }
}

/// Launches a holder may make in one slice: enough for 1.5 slices of work
/// at its measured ns per launch, so the queue it leaves at the slice's end
/// (which the next holder waits for) stays under about half a slice.
pub fn allowance(budget_ns: u64, ns_per_launch: u64) -> u64 {
    if ns_per_launch == 0 {
        return 8;
    }
    // Both come from ledger words any process may write: computed in u128,
    // never an overflow (a panic here would cross the C boundary).
    let n = 3 * u128::from(budget_ns) / (2 * u128::from(ns_per_launch)) + 1;
    n.clamp(1, 1 << 20) as u64
}

/// New ns-per-launch estimate after a slice that held the GPU `held_ns`
/// and made `launches` launches (EWMA, 1/4 weight to the new sample).
pub fn update_estimate(old: u64, held_ns: u64, launches: u64) -> u64 {
    if launches == 0 {
        return old;
    }
    let sample = held_ns / launches;
    if old == 0 {
        sample.max(1)
    } else {
        // `old` comes from the ledger: saturating, never an overflow.
        (old.saturating_mul(3).saturating_add(sample) / 4).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowance_never_overflows_on_ledger_garbage() {
        assert_eq!(allowance(u64::MAX, 1), 1 << 20);
        assert_eq!(allowance(u64::MAX, u64::MAX), 2);
        assert_eq!(allowance(1, u64::MAX), 1);
        assert_eq!(allowance(40_000_000, 1_000_000), 61);
    }
    use crate::policy::{FAIR_SHARE, FIXED, PREEMPTIVE, WEIGHTED};

    fn busy(weight: u32) -> Entry {
        Entry {
            live: true,
            weight,
            highprio: false,
            wants: true,
            guest: false,
            tokens: 0,
            ns_per_launch: 0,
        }
    }

    /// Drive `decide` as the runtime does, with an ideal device: the holder
    /// holds each slice for `hold(budget)` ns (its kernels may overrun), a
    /// handover costs `gap` ns; returns each container's GPU time.
    fn simulate(
        k: Knobs,
        es: &mut [Entry],
        total: u64,
        hold: impl Fn(u64) -> u64,
        gap: u64,
    ) -> (Vec<u64>, u64) {
        let mut got = vec![0u64; es.len()];
        let mut now = 0u64;
        let mut last = 0u64;
        let mut charge = None;
        let mut steps = 0;
        while now < total {
            steps += 1;
            assert!(steps < 1_000_000, "no progress at {now}");
            let d = decide(&k, now, last, charge, es);
            last = now;
            match d {
                Decision::Run { c, budget_ns, .. } => {
                    let h = hold(budget_ns);
                    got[c] += h;
                    now += h;
                    charge = Some((c, h + gap));
                    now += gap;
                }
                Decision::Idle { until } => {
                    assert!(until > now && until != u64::MAX, "stuck idle at {now}");
                    now = until;
                    charge = None;
                }
            }
        }
        (got, now)
    }

    fn ratio_close(got: &[u64], want: &[f64], tol: f64) {
        let sum: u64 = got.iter().sum();
        for (g, w) in got.iter().zip(want) {
            let share = *g as f64 / sum as f64;
            assert!(
                (share - w).abs() <= tol * w,
                "got {got:?} shares, want {want:?}"
            );
        }
    }

    fn knobs(policy: u32, max_inst: u32) -> Knobs {
        Knobs {
            policy,
            max_inst,
            prio_ratio: 80,
        }
    }

    #[test]
    fn weighted_one_to_two_exact_for_short_and_long_kernels() {
        for kernel in [50_000u64, 20_000_000, 35_000_000] {
            let mut es = [busy(1), busy(2)];
            // The holder overruns its budget to the end of its last kernel.
            let hold = |b: u64| b.div_ceil(kernel) * kernel;
            let (got, _) = simulate(knobs(WEIGHTED, 10), &mut es, 30_000_000_000, hold, 100_000);
            ratio_close(&got, &[1.0 / 3.0, 2.0 / 3.0], 0.01);
        }
    }

    #[test]
    fn weighted_one_one_two_four() {
        let mut es = [busy(1), busy(1), busy(2), busy(4)];
        let (got, _) = simulate(knobs(WEIGHTED, 10), &mut es, 20_000_000_000, |b| b, 50_000);
        ratio_close(&got, &[0.125, 0.125, 0.25, 0.5], 0.01);
    }

    #[test]
    fn preemptive_three_busy_and_work_conserving() {
        let mut es = [busy(1), busy(1), busy(1)];
        let (got, now) = simulate(knobs(PREEMPTIVE, 10), &mut es, 10_000_000_000, |b| b, 0);
        ratio_close(&got, &[1.0 / 3.0; 3], 0.01);
        assert_eq!(got.iter().sum::<u64>(), now);

        let mut es = [
            busy(1),
            Entry {
                wants: false,
                ..busy(1)
            },
        ];
        let (got, now) = simulate(knobs(PREEMPTIVE, 10), &mut es, 10_000_000_000, |b| b, 0);
        assert_eq!(got[1], 0);
        assert_eq!(got[0], now);
    }

    #[test]
    fn fixed_shares_waste_the_rest() {
        let mut es = [busy(1)];
        let (got, now) = simulate(knobs(FAIR_SHARE, 4), &mut es, 10_000_000_000, |b| b, 0);
        let s = got[0] as f64 / now as f64;
        assert!((s - 0.25).abs() < 0.01, "{s}");

        let mut es = [busy(3)];
        let (got, now) = simulate(knobs(FIXED, 10), &mut es, 10_000_000_000, |b| b, 0);
        let s = got[0] as f64 / now as f64;
        assert!((s - 0.30).abs() < 0.01, "{s}");

        // Weight-2 container alive but idle: the weight-1 one keeps to 1/3.
        let mut es = [
            busy(1),
            Entry {
                wants: false,
                ..busy(2)
            },
        ];
        let (got, now) = simulate(knobs(WEIGHTED, 10), &mut es, 10_000_000_000, |b| b, 0);
        let s = got[0] as f64 / now as f64;
        assert!(s <= 1.0 / 3.0 + 0.005 && s > 0.32, "{s}");
    }

    #[test]
    fn high_priority_gets_prio_ratio() {
        let mut es = [
            Entry {
                highprio: true,
                ..busy(1)
            },
            busy(1),
        ];
        let (got, _) = simulate(
            knobs(PREEMPTIVE, 10),
            &mut es,
            20_000_000_000,
            |b| b,
            30_000,
        );
        ratio_close(&got, &[0.8, 0.2], 0.01);
    }

    #[test]
    fn weight_zero_and_dead_never_run() {
        let mut es = [
            Entry {
                weight: 0,
                ..busy(0)
            },
            Entry {
                live: false,
                ..busy(1)
            },
        ];
        for p in 0..5 {
            let d = decide(&knobs(p, 4), 1_000_000_000, 0, None, &mut es);
            assert_eq!(d, Decision::Idle { until: u64::MAX }, "policy {p}");
        }
    }

    #[test]
    fn idle_until_is_when_credit_returns() {
        let mut es = [Entry {
            tokens: -30_000_000,
            ..busy(1)
        }];
        // Fair share 1/4: 30 ms of debt takes 120 ms to repay.
        let d = decide(&knobs(FAIR_SHARE, 4), 1_000, 1_000, None, &mut es);
        assert_eq!(
            d,
            Decision::Idle {
                until: 1_000 + 120_000_004 + 1
            }
        );
        // And then it runs.
        let d = decide(
            &knobs(FAIR_SHARE, 4),
            1_000 + 120_000_005,
            1_000,
            None,
            &mut es,
        );
        assert!(matches!(d, Decision::Run { c: 0, .. }), "{d:?}");
    }

    #[test]
    fn buckets_are_bounded() {
        let mut es = [
            Entry {
                wants: false,
                ..busy(1)
            },
            busy(1),
        ];
        decide(
            &knobs(WEIGHTED, 10),
            100_000_000_000,
            0,
            Some((1, 100_000_000_000)),
            &mut es,
        );
        let p = Params::for_knobs(&knobs(WEIGHTED, 10));
        assert_eq!(es[0].tokens, p.cap_ns);
        assert_eq!(es[1].tokens, p.floor_ns);
    }

    #[test]
    fn allowance_and_estimate() {
        assert_eq!(allowance(SLICE_NS, 0), 8);
        assert_eq!(allowance(SLICE_NS, 40_000_000), 2);
        assert_eq!(allowance(SLICE_NS, 100_000), 601);
        assert_eq!(update_estimate(0, 1000, 10), 100);
        assert_eq!(update_estimate(100, 2000, 10), 125);
        assert_eq!(update_estimate(100, 2000, 0), 100);
    }
}
