//! NVIDIA's CUDA runtime under `LD_PRELOAD=libcgpu.so`, on the simulated
//! driver: the same unmodified `libcudart.so.12`/`.13` program as the sim's
//! own test sees the container's quota, gets `cudaErrorMemoryAllocation`
//! past it, still runs kernels and graphs, and the runtime's private driver
//! tables reach it untouched (same tables, same functions, as without
//! cgpu: the runtime's integrity check hashes their addresses).

mod interpose_common;

use cgpu_testkit::{compile_cudart_client, cudart_rows, field, line, num, CudartRow};
use interpose_common::*;

const T4: &str = "15109:Tesla T4";
const CTX: u64 = 300 * MIB;
/// floor(15109 MiB × 6 / 15): a 6-of-15 GiB quota on a T4.
const QUOTA: u64 = 15109 * MIB * 6 / 15;
const VARS: &[(&str, &str)] = &[
    ("ALIYUN_COM_GPU_MEM_CONTAINER", "6"),
    ("ALIYUN_COM_GPU_MEM_DEV", "15"),
    ("CGPU_CONTAINER_ID", "cudart-a"),
];

fn client(row: &CudartRow) -> std::path::PathBuf {
    compile_cudart_client(&repo().join("tests/c/cudart_client.c"), row)
}

fn val<'a>(out: &'a str, cmd: &str, key: &str) -> &'a str {
    let l = line(out, cmd);
    field(l, key).unwrap_or_else(|| panic!("no {key} in `{l}`"))
}

#[test]
fn cudart_sees_the_quota_and_is_refused_past_it() {
    for row in cudart_rows() {
        let m = Machine::new("cudart", T4);
        let exe = client(&row);
        let out = run_ok(m.preloaded(&exe, VARS).args([
            "info",
            "meminfo",
            "malloc",
            "1048576",
            "malloc",
            "3000000000",
            "meminfo",
            "malloc",
            "7000000000",
            "roundtrip",
            "1000003",
            "launch",
            "1000000",
            "2",
            "graph",
            "500000",
            "2",
            "2",
            "symbol",
        ]));
        let v = row.major;
        assert_eq!(num(&out, "info", "runtime") / 1000, v as u64);
        // The quota is what the runtime sees as the device's memory.
        assert_eq!(num(&out, "info", "total"), QUOTA, "CUDA {v}: {out}");
        let totals: Vec<u64> = out
            .lines()
            .filter(|l| l.starts_with("meminfo "))
            .map(|l| field(l, "total").unwrap().parse().unwrap())
            .collect();
        assert_eq!(totals, [QUOTA, QUOTA], "CUDA {v}");
        let free = num(&out, "meminfo", "free");
        assert!(
            free <= QUOTA - CTX && free >= QUOTA - CTX - 512,
            "CUDA {v}: free {free} of {QUOTA}"
        );
        // 1 MiB and 3 GB fit; 7 GB is past the quota (not the device).
        let rcs: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("malloc "))
            .map(|l| field(l, "rc").unwrap())
            .collect();
        assert_eq!(rcs, ["0", "0", "2"], "CUDA {v}: {out}");
        assert_eq!(num(&out, "roundtrip", "same"), 1);
        assert_eq!(num(&out, "graph", "after"), 0x5a);
        assert_eq!(num(&out, "symbol", "same"), 1);
        assert!(val(&out, "launch", "ms").parse::<f64>().unwrap() >= 1.0);
    }
}

#[test]
fn cudart_private_tables_pass_through_untouched() {
    for row in cudart_rows() {
        let m = Machine::new("cudart-tables", T4);
        let exe = client(&row);
        let bare = run_ok(m.bare(&exe).arg("tables"));
        let pre = run_ok(m.preloaded(&exe, VARS).arg("tables"));
        let v = row.major;
        for out in [&bare, &pre] {
            assert_eq!(val(out, "tables", "rc"), "0,0", "CUDA {v}: {out}");
            // cuGetExportTable as the runtime resolves it is the driver's own,
            // and so are the tables and the integrity function it returns.
            for k in ["resolver_lib", "cudart_table_lib", "integrity_fn_lib"] {
                assert_eq!(
                    val(out, "tables", k),
                    "libcuda.so.1",
                    "CUDA {v}: {k} in {out}"
                );
            }
        }
        for k in [
            "resolver_offset",
            "cudart_table_offset",
            "integrity_fn_offset",
        ] {
            assert_eq!(
                val(&bare, "tables", k),
                val(&pre, "tables", k),
                "CUDA {v}: {k} differs under libcgpu.so"
            );
        }
    }
}
