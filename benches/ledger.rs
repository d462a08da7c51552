//! What the ledger's fault handling costs on the allocation path, as ratios
//! against the bare ledger operation measured in the same run:
//! - a refused reservation through `Account::reserve` (which looks for a
//!   dead sibling to reap, `reclaim_for`) vs `Ledger::try_reserve` alone,
//!   with 7 live sibling processes in the container (each one
//!   `F_OFD_GETLK`);
//! - an accepted reserve+release pair through `Account` (health checks of
//!   the mapping, `mine` counter) vs `Ledger::try_reserve`+`release`.
//!
//! `cargo bench --bench ledger` (criterion), then a summary table.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cgpu::ledger::*;
use criterion::Criterion;

const GIB: u64 = 1 << 30;

fn median_ns(mut f: impl FnMut(), n: u32) -> f64 {
    let mut v: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("cgpu-bench-ledger-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let uuid = "GPU-bench-0";
    let req = JoinRequest {
        container_id: "bench",
        key: 0,
        quota: GIB,
        weight: 1,
        highprio: false,
        enforce_off: false,
    };
    // 7 siblings, each through its own open file description (as separate
    // processes: their liveness locks are seen by our probes).
    let siblings: Vec<(Ledger, Membership)> = (0..7)
        .map(|_| {
            let l = Ledger::open_or_create(&dir, uuid, 0, 16 * GIB).unwrap();
            let m = l.join(&req).unwrap();
            (l, m)
        })
        .collect();
    let bare = Ledger::open_or_create(&dir, uuid, 0, 16 * GIB).unwrap();
    let bm = bare.join(&req).unwrap();
    let spec = JoinSpec {
        container_id: "bench".into(),
        key: 0,
        quota: GIB,
        weight: 1,
        highprio: false,
        enforce_off: false,
    };
    let acct = Account::open(&dir, uuid, 0, 16 * GIB, "GPU bench".into(), spec);
    assert!(acct.is_shared());
    // Fill the quota so that 1 MiB more is refused.
    siblings[0]
        .0
        .try_reserve(&siblings[0].1, GIB - (1 << 19))
        .unwrap();
    assert!(bare.try_reserve(&bm, 1 << 20).is_err());
    assert!(!acct.reserve(1 << 20));

    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    c.bench_function("refused: Ledger::try_reserve", |b| {
        b.iter(|| black_box(bare.try_reserve(&bm, black_box(1 << 20)).is_err()))
    });
    c.bench_function("refused: Account::reserve (with reclaim_for)", |b| {
        b.iter(|| black_box(acct.reserve(black_box(1 << 20))))
    });
    c.bench_function("pair: Ledger::try_reserve+release", |b| {
        b.iter(|| {
            bare.try_reserve(&bm, 4096).unwrap();
            bare.release(&bm, 4096);
        })
    });
    c.bench_function("pair: Account::reserve+release", |b| {
        b.iter(|| {
            assert!(acct.reserve(4096));
            acct.release(4096);
        })
    });

    // Summary: interleaved medians in this run.
    let r_bare = median_ns(
        || {
            let _ = black_box(bare.try_reserve(&bm, 1 << 20));
        },
        2000,
    );
    let r_acct = median_ns(
        || {
            black_box(acct.reserve(1 << 20));
        },
        2000,
    );
    let p_bare = median_ns(
        || {
            bare.try_reserve(&bm, 4096).unwrap();
            bare.release(&bm, 4096);
        },
        20000,
    );
    let p_acct = median_ns(
        || {
            acct.reserve(4096);
            acct.release(4096);
        },
        20000,
    );
    println!();
    println!("| path | bare ledger | through Account | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| refused 1 MiB (7 live siblings) | {r_bare:.0} ns | {r_acct:.0} ns | {:.1}× |",
        r_acct / r_bare
    );
    println!(
        "| reserve+release 4 KiB | {p_bare:.0} ns | {p_acct:.0} ns | {:.2}× |",
        p_acct / p_bare
    );
    acct.leave();
    bare.leave(bm);
    for (l, m) in siblings {
        l.leave(m);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
