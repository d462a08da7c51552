//! `kubectl inspect cgpu` run by the real kubectl (as a plugin found on
//! PATH) against the test API server.

use cgpu_cluster_testkit::apiserver::ApiServer;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cgpu-inspect-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn kubectl(dir: &PathBuf, args: &[&str]) -> (String, String, bool) {
    let kubectl = which("kubectl").expect(
        "kubectl is not installed: .ci/run installs it (Debian's kubernetes-client); these tests need the real client",
    );
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(kubectl)
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .env("HOME", dir)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|f| f.is_file())
    })
}

fn setup(name: &str) -> (ApiServer, PathBuf) {
    let api = ApiServer::start_in_background();
    let dir = scratch(name);
    api.write_kubeconfig(&dir.join("kubeconfig"));
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_kubectl-inspect-cgpu"),
        dir.join("kubectl-inspect-cgpu"),
    )
    .unwrap();
    for i in 1..=3 {
        api.put(
            "nodes",
            json!({"metadata": {"name": format!("cn-beijing.192.16x.x.xx{i}")},
                   "status": {"addresses": [{"type": "InternalIP", "address": format!("192.16x.x.xx{i}")}],
                              "capacity": {"aliyun.com/gpu-count": "1", "aliyun.com/gpu-mem": "15"}}}),
        );
    }
    // A node without shared GPUs is not listed.
    api.put(
        "nodes",
        json!({"metadata": {"name": "cpu-only"}, "status": {"capacity": {"cpu": "8"}}}),
    );
    (api, dir)
}

#[test]
fn seed_layout_through_kubectl() {
    let (api, dir) = setup("seed");
    let (out, err, ok) = kubectl(&dir, &["inspect", "cgpu"]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "NAME                      IPADDRESS      GPU0(Allocated/Total)  GPU Memory(GiB)\n\
         cn-beijing.192.16x.x.xx1  192.16x.x.xx1  0/15                   0/15\n\
         cn-beijing.192.16x.x.xx2  192.16x.x.xx2  0/15                   0/15\n\
         cn-beijing.192.16x.x.xx3  192.16x.x.xx3  0/15                   0/15\n\
         ---------------------------------------------------------------------\n\
         Allocated/Total GPU Memory In Cluster:\n\
         0/45 (0%)\n"
    );
    // The documented example: a 3 GiB pod with CGPU_DISABLE=true, placed by ACK's
    // scheduler (its annotation), on xx3.
    api.put(
        "pods",
        json!({"metadata": {"name": "disable-cgpu-7x2kq", "namespace": "default",
                            "annotations": {"scheduler.framework.gpushare.allocation": "{\"0\":{\"0\":3}}"}},
               "spec": {"nodeName": "cn-beijing.192.16x.x.xx3", "containers": [{"name": "disable-cgpu",
                        "env": [{"name": "CGPU_DISABLE", "value": "true"}],
                        "resources": {"limits": {"aliyun.com/gpu-mem": "3"}}}]},
               "status": {"phase": "Running"}}),
    );
    let (out, err, ok) = kubectl(&dir, &["inspect", "cgpu"]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "NAME                      IPADDRESS      GPU0(Allocated/Total)  GPU Memory(GiB)\n\
         cn-beijing.192.16x.x.xx1  192.16x.x.xx1  0/15                   0/15\n\
         cn-beijing.192.16x.x.xx2  192.16x.x.xx2  0/15                   0/15\n\
         cn-beijing.192.16x.x.xx3  192.16x.x.xx3  3/15                   3/15\n\
         ---------------------------------------------------------------------\n\
         Allocated/Total GPU Memory In Cluster:\n\
         3/45 (6%)\n"
    );
    // The same cluster as kubectl itself sees it (discovery, list).
    let (out, err, ok) = kubectl(&dir, &["get", "pods", "-o", "name"]);
    assert!(ok, "{err}");
    assert_eq!(out, "pod/disable-cgpu-7x2kq\n");
}

#[test]
fn details_and_json_through_kubectl() {
    let (api, dir) = setup("details");
    api.put(
        "pods",
        json!({"metadata": {"name": "old-gpushare-pod", "namespace": "ml",
                            "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "5"}},
               "spec": {"nodeName": "cn-beijing.192.16x.x.xx1", "containers": [{"name": "c",
                        "resources": {"limits": {"aliyun.com/gpu-mem": "5"}}}]},
               "status": {"phase": "Running"}}),
    );
    api.put(
        "pods",
        json!({"metadata": {"name": "no-extender", "namespace": "ml"},
               "spec": {"nodeName": "cn-beijing.192.16x.x.xx1", "containers": [{"name": "c",
                        "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}}]},
               "status": {"phase": "Running"}}),
    );
    let (out, err, ok) = kubectl(&dir, &["inspect", "cgpu", "-d"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "NAME:       cn-beijing.192.16x.x.xx1\nIPADDRESS:  192.16x.x.xx1\n\n\
                      NAME              NAMESPACE  GPU0(Allocated)  Pending(Allocated)\n\
                      no-extender       ml         0                2\n\
                      old-gpushare-pod  ml         5                0\n\
                      Allocated :       5 (33%)\n\
                      Total :           15\n\
                      ------------------------------------------------------------------------\n"
        ),
        "{out}"
    );
    assert!(out.contains("Not allocated: ml/no-extender"), "{out}");
    assert!(
        out.ends_with("Allocated/Total GPU Memory In Cluster:  5/45 (11%)\n"),
        "{out}"
    );
    let (out, err, ok) = kubectl(&dir, &["inspect", "cgpu", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["allocated"], 5);
    assert_eq!(v["total"], 45);
    assert_eq!(v["percent"], 11);
    assert_eq!(
        v["nodes"][0]["gpus"][0]["pods"][0]["name"],
        "old-gpushare-pod"
    );
    assert_eq!(v["nodes"][0]["undecided"][0], "ml/no-extender");
}

#[test]
fn unreachable_api_server_is_one_clear_error() {
    let dir = scratch("down");
    std::fs::write(
        dir.join("kubeconfig"),
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: http://127.0.0.1:9\n\
         contexts:\n- name: t\n  context:\n    cluster: t\n    user: t\ncurrent-context: t\nusers:\n- name: t\n  user: {}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_kubectl-inspect-cgpu"),
        dir.join("kubectl-inspect-cgpu"),
    )
    .unwrap();
    let (out, err, ok) = kubectl(&dir, &["inspect", "cgpu"]);
    assert!(!ok);
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("kubectl inspect cgpu: cannot list nodes"),
        "{err}"
    );
}

#[test]
fn only_decisions_of_their_own_pod_with_the_extenders_signature_count() {
    use cgpu_cluster::signing::DecisionKey;
    use cgpu_cluster_core::decision::{Decision, DecisionGpu};
    use std::collections::BTreeMap;
    let (api, dir) = setup("signed");
    let key = DecisionKey::from_bytes(b"inspect test key, 32 bytes long!").unwrap();
    api.put(
        "configmaps",
        json!({"metadata": {"name": "cgpu-decision-key", "namespace": "kube-system"},
               "data": {"ed25519.pub": key.verifier().to_hex()}}),
    );
    let node = "cn-beijing.192.16x.x.xx2";
    let pod = |name: &str, ann: serde_json::Value| {
        api.put(
            "pods",
            json!({"metadata": {"name": name, "namespace": "default", "annotations": ann},
                   "spec": {"nodeName": node, "containers": [{"name": "main",
                            "resources": {"limits": {"aliyun.com/gpu-mem": "10"}}}]},
                   "status": {"phase": "Running"}}),
        )
    };
    let owner = pod("owner", json!({}));
    let decide = |uid: &str, key: &DecisionKey| {
        let mut d = Decision {
            node: node.into(),
            pod_uid: uid.into(),
            gpus: vec![DecisionGpu {
                index: 0,
                uuid: String::new(),
            }],
            gpu_gib: 15,
            per_gpu: 10,
            containers: BTreeMap::from([("main".to_string(), 10)]),
            compute: 0,
            mib: false,
            sig: String::new(),
        };
        key.sign(&mut d);
        serde_json::to_string(&d).unwrap()
    };
    let signed = decide(owner["metadata"]["uid"].as_str().unwrap(), &key);
    api.patch(
        "pods",
        "default",
        "owner",
        &json!({"metadata": {"annotations": {"cgpu.io/allocation": signed,
                 "ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "10"}}}),
    );
    // A copy of all of owner's annotations, and a decision signed by
    // another key for the pod itself.
    let ann = api.get("pods", "default", "owner").unwrap()["metadata"]["annotations"].clone();
    pod("copycat", ann);
    let forger = pod("forger", json!({}));
    let other = DecisionKey::from_bytes(b"someone else's key, 16+ bytes").unwrap();
    api.patch(
        "pods",
        "default",
        "forger",
        &json!({"metadata": {"annotations": {"cgpu.io/allocation":
                 decide(forger["metadata"]["uid"].as_str().unwrap(), &other)}}}),
    );
    let (out, err, ok) = kubectl(&dir, &["inspect", "cgpu"]);
    assert!(ok, "{err}");
    assert!(err.is_empty(), "{err}");
    assert!(
        out.contains(
            "cn-beijing.192.16x.x.xx2  192.16x.x.xx2  10/15                  20                  10/15\n"
        ),
        "{out}"
    );
    assert!(out.ends_with("10/45 (22%)\n"), "{out}");
    let (out, _, ok) = kubectl(&dir, &["inspect", "cgpu", "-d"]);
    assert!(ok);
    assert!(out.contains("Not allocated: default/copycat"), "{out}");
    assert!(out.contains("Not allocated: default/forger"), "{out}");
    // Without the public key, decisions are still checked for their pod.
    api.finalize("configmaps", "kube-system", "cgpu-decision-key");
    let (out, err, ok) = kubectl(&dir, &["inspect", "cgpu"]);
    assert!(ok, "{err}");
    assert!(err.contains("signatures not checked"), "{err}");
    assert!(out.ends_with("20/45 (44%)\n"), "{out}");
}
