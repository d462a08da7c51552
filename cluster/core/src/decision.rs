//! What the scheduler decided for a pod, how it is recorded on the pod, how
//! a node's GPU use is rebuilt from its pods, and what a container is handed.
//!
//! Everything here reads and writes Kubernetes JSON as `serde_json::Value`,
//! so the extender, the device plugin and the kubectl plugin (which hold
//! typed objects) and tests (which hold literals) share one implementation.

use crate::names::*;
use crate::placement::{ContainerRequest, Gpu, Placement, Request};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Whole GiB of a GPU as the cluster counts it: the node's stated size if
/// it has one (`cgpu.io/gpu-mem-dev`), else `floor(MiB / 1024)`.
pub fn gpu_gib(mib: u64, stated: Option<u64>) -> u64 {
    stated.unwrap_or(mib / 1024)
}

/// One GPU of a node, as the device plugin publishes it (node annotation
/// `cgpu.io/gpus`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGpu {
    pub index: u32,
    pub uuid: String,
    pub memory_mib: u64,
    /// Size in whole GiB as the cluster counts it (see [`gpu_gib`]).
    pub gib: u64,
    /// The model as NVML names it (`Tesla V100-SXM2-16GB`); empty when unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// The device plugin saw the GPU fail (a critical XID error, or the GPU
    /// lost): no new pod is placed on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unhealthy: bool,
    /// The node counts GPU memory in MiB (label `cgpu.io/gpu-mem-unit`):
    /// `gib` then holds the GPU's size in MiB, and pods' shares are MiB.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mib: bool,
}

fn list(pod: &Value, key: &str) -> Vec<String> {
    pod["metadata"]["annotations"][key]
        .as_str()
        .unwrap_or("")
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Whether the pod may use this GPU, by its annotations (HAMi's names):
/// `nvidia.com/use-gputype` / `nvidia.com/nouse-gputype` (comma-separated
/// parts of the model name, case-insensitive) and `nvidia.com/use-gpuuuid`
/// / `nvidia.com/nouse-gpuuuid` (exact UUIDs).
pub fn gpu_allowed(pod: &Value, gpu: &NodeGpu) -> bool {
    let model = gpu.model.to_ascii_uppercase();
    let has_type = |t: &String| model.contains(&t.to_ascii_uppercase());
    let use_type = list(pod, ANN_USE_GPUTYPE);
    let use_uuid = list(pod, ANN_USE_GPUUUID);
    (use_type.is_empty() || use_type.iter().any(has_type))
        && !list(pod, ANN_NOUSE_GPUTYPE).iter().any(has_type)
        && (use_uuid.is_empty() || use_uuid.contains(&gpu.uuid))
        && !list(pod, ANN_NOUSE_GPUUUID).contains(&gpu.uuid)
}

/// The pod's GPU constraints as one line for a rejection, empty when none.
pub fn gpu_constraints(pod: &Value) -> String {
    [
        ANN_USE_GPUTYPE,
        ANN_NOUSE_GPUTYPE,
        ANN_USE_GPUUUID,
        ANN_NOUSE_GPUUUID,
    ]
    .iter()
    .filter_map(|k| {
        pod["metadata"]["annotations"][*k]
            .as_str()
            .map(|v| format!("{k}={v}"))
    })
    .collect::<Vec<_>>()
    .join(", ")
}

/// The GPUs of a node: from the device plugin's annotation when present,
/// else (a node prepared by gpushare's device plugin) from the capacity,
/// `gpu-mem / gpu-count` GiB each.
pub fn node_gpus(node: &Value) -> Vec<NodeGpu> {
    if let Some(s) = node["metadata"]["annotations"][ANN_NODE_GPUS].as_str() {
        if let Ok(gpus) = serde_json::from_str::<Vec<NodeGpu>>(s) {
            return gpus;
        }
    }
    let cap = &node["status"]["capacity"];
    let count = quantity(&cap[RESOURCE_GPU_COUNT]).unwrap_or(0);
    let mem = quantity(&cap[RESOURCE_GPU_MEM]).unwrap_or(0);
    if count == 0 {
        return Vec::new();
    }
    (0..count as u32)
        .map(|index| NodeGpu {
            index,
            uuid: String::new(),
            memory_mib: 0,
            gib: mem / count,
            model: String::new(),
            unhealthy: false,
            mib: false,
        })
        .collect()
}

/// An integer resource quantity (`"8"` or `8`); extended resources are
/// whole numbers.
pub fn quantity(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.trim().parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// The node's first InternalIP (else any address).
pub fn node_ip(node: &Value) -> String {
    let addrs = node["status"]["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    addrs
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .or_else(|| addrs.first())
        .and_then(|a| a["address"].as_str())
        .unwrap_or("")
        .to_string()
}

/// What a pod asks for, read from its spec: every container's (and init
/// container's) `aliyun.com/gpu-mem` limit (else request), and the pod
/// label `aliyun.com/gpu-count`. `Err` with a reason when the label is not a
/// whole number.
pub fn pod_request(pod: &Value) -> Result<Request, String> {
    let gpu_count = match pod["metadata"]["labels"][LABEL_GPU_COUNT].as_str() {
        None => 1,
        Some(s) => s.trim().parse::<u32>().map_err(|_| {
            format!("pod label {LABEL_GPU_COUNT}={s:?} is not a whole number of GPUs")
        })?,
    };
    let mut containers = Vec::new();
    for (key, init) in [("initContainers", true), ("containers", false)] {
        for c in pod["spec"][key].as_array().into_iter().flatten() {
            let res = &c["resources"];
            let raw = [
                &res["limits"][RESOURCE_GPU_MEM],
                &res["requests"][RESOURCE_GPU_MEM],
            ]
            .into_iter()
            .find(|v| !v.is_null());
            let mem = match raw {
                None => 0,
                Some(v) => quantity(v).ok_or_else(|| {
                    format!(
                        "container {:?} asks for {RESOURCE_GPU_MEM}={v}: not a whole number of GiB \
                         (write e.g. 8, not 8Gi)",
                        c["name"].as_str().unwrap_or("")
                    )
                })?,
            };
            containers.push(ContainerRequest {
                name: c["name"].as_str().unwrap_or("").to_string(),
                mem,
                init,
            });
        }
    }
    Ok(Request {
        containers,
        gpu_count,
    })
}

/// `namespace/name`.
pub fn pod_key(pod: &Value) -> String {
    format!(
        "{}/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or("default"),
        pod["metadata"]["name"].as_str().unwrap_or("")
    )
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// The pod's compute share (annotation `cgpu.io/gpu-core`, percent of each
/// of its GPUs; 0 when absent) and the weight each of its containers that
/// asks for GPU memory gets: the share's [`GPU_CORE_SLICES`] time slices
/// split evenly among its app containers. Refused when it is not a whole
/// number 1..=100, or too small to give each app container a slice.
pub fn pod_compute(pod: &Value, req: &Request) -> Result<(u32, u32), String> {
    let Some(v) = pod["metadata"]["annotations"][ANN_GPU_CORE].as_str() else {
        return Ok((0, 0));
    };
    let p: u32 = v
        .trim()
        .trim_end_matches('%')
        .parse()
        .ok()
        .filter(|p| (1..=100).contains(p))
        .ok_or_else(|| format!("{ANN_GPU_CORE}={v:?} is not a whole percent 1..100"))?;
    Ok((p, compute_weight(p, req)?))
}

/// The weight each container of a pod with a compute share of `p` percent
/// gets: the share's [`GPU_CORE_SLICES`] time slices split evenly among its
/// app containers that ask for GPU memory (an init container, which runs
/// before them, gets the same).
pub fn compute_weight(p: u32, req: &Request) -> Result<u32, String> {
    let apps = req
        .containers
        .iter()
        .filter(|c| !c.init && c.mem > 0)
        .count()
        .max(1) as u32;
    let weight = p.min(100) * GPU_CORE_SLICES / 100 / apps;
    if weight == 0 {
        return Err(format!(
            "{ANN_GPU_CORE}={p} gives each of the pod's {apps} GPU containers less than one of a \
             GPU's {GPU_CORE_SLICES} time slices; ask for at least {}",
            (100 * apps).div_ceil(GPU_CORE_SLICES)
        ));
    }
    Ok(weight)
}

/// The scheduler's decision for one pod, recorded on it as the annotation
/// `cgpu.io/allocation` at bind, before the Binding is created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub node: String,
    /// The pod this decision was made for (a decision copied onto another
    /// pod is refused).
    pub pod_uid: String,
    /// The chosen GPUs: index and UUID at the time of the decision.
    pub gpus: Vec<DecisionGpu>,
    /// Size in GiB of each chosen GPU.
    pub gpu_gib: u64,
    /// What the pod holds on each chosen GPU.
    pub per_gpu: u64,
    /// Per container name: its GiB on each chosen GPU.
    pub containers: BTreeMap<String, u64>,
    /// The pod's share of each chosen GPU's compute, in percent (annotation
    /// `cgpu.io/gpu-core`); 0 when it asked for none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compute: u32,
    /// The node counts in MiB: `gpu_gib`, `per_gpu` and the containers'
    /// shares are MiB. Absent (false) for GiB, so a GiB decision signs the
    /// same bytes as before the field existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mib: bool,
    /// Ed25519 signature (hex) of [`Decision::signed_bytes`] by the
    /// extender's private key: only the extender can write a decision that
    /// device plugins and `kubectl inspect cgpu` accept; they hold the
    /// public key only.
    #[serde(default)]
    pub sig: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionGpu {
    pub index: u32,
    pub uuid: String,
}

impl Decision {
    pub fn new(node: &str, pod_uid: &str, p: &Placement, gpus: &[NodeGpu]) -> Decision {
        Decision {
            node: node.to_string(),
            pod_uid: pod_uid.to_string(),
            gpus: p
                .gpus
                .iter()
                .map(|&i| DecisionGpu {
                    index: i,
                    uuid: gpus
                        .iter()
                        .find(|g| g.index == i)
                        .map(|g| g.uuid.clone())
                        .unwrap_or_default(),
                })
                .collect(),
            gpu_gib: p.gpu_total,
            per_gpu: p.per_gpu,
            containers: p.containers.iter().cloned().collect(),
            compute: 0,
            mib: gpus.iter().any(|g| g.mib),
            sig: String::new(),
        }
    }

    /// The bytes the signature covers: the decision's JSON without `sig`
    /// (field order is fixed and container names sorted, so it is canonical).
    pub fn signed_bytes(&self) -> Vec<u8> {
        let unsigned = Decision {
            sig: String::new(),
            ..self.clone()
        };
        serde_json::to_vec(&unsigned).expect("a Decision always serialises")
    }

    /// The decision recorded on a pod, if any (unparsable counts as none).
    pub fn from_pod(pod: &Value) -> Option<Decision> {
        let s = pod["metadata"]["annotations"][ANN_ALLOCATION].as_str()?;
        serde_json::from_str(s).ok()
    }

    /// ACK's annotation for the same decision:
    /// `{"<container index>": {"<GPU index>": GiB}}`, containers in spec order.
    pub fn ack_allocation(&self, pod: &Value) -> String {
        let mut out = BTreeMap::new();
        let names = pod["spec"]["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for (i, c) in names.iter().enumerate() {
            let name = c["name"].as_str().unwrap_or("");
            let gib = self.containers.get(name).copied().unwrap_or(0);
            if gib == 0 {
                continue;
            }
            let per: BTreeMap<String, u64> = self
                .gpus
                .iter()
                .map(|g| (g.index.to_string(), gib))
                .collect();
            out.insert(i.to_string(), per);
        }
        serde_json::to_string(&out).expect("a map always serialises")
    }
}

/// Whether a pod still holds what it was given: bound to a node and not
/// finished. A terminating pod (deletion requested) still holds its memory
/// until it is gone from the API server.
pub fn pod_holds_gpu(pod: &Value) -> bool {
    let phase = pod["status"]["phase"].as_str().unwrap_or("");
    pod["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty())
        && phase != "Succeeded"
        && phase != "Failed"
}

/// Checks a decision's signature (the extender's public key); the cluster
/// components pass their verifier, tests a closure.
pub type Verify<'a> = &'a dyn Fn(&Decision) -> bool;

/// The pod's decision if it counts: it names this pod (uid) and the node
/// the pod is bound to, and its signature verifies. A decision copied from
/// another pod, written by hand or altered counts for nothing.
pub fn valid_decision(pod: &Value, verify: Verify) -> Option<Decision> {
    let d = Decision::from_pod(pod)?;
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    let node = pod["spec"]["nodeName"].as_str().unwrap_or("");
    (!uid.is_empty() && d.pod_uid == uid && d.node == node && verify(&d)).then_some(d)
}

/// A pod's share of each GPU of its node: from our decision, else ACK's
/// annotation, else gpushare's (`ALIYUN_COM_GPU_MEM_IDX` + `_POD`). Empty
/// when it holds nothing or nothing valid was decided for it. A pod that
/// carries `cgpu.io/allocation` is judged by it alone: when it does not
/// count (see [`valid_decision`]), the gpushare annotations copied beside
/// it do not count either.
pub fn pod_gpu_use(pod: &Value, verify: Verify) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    if !pod_holds_gpu(pod) {
        return out;
    }
    let ann = &pod["metadata"]["annotations"];
    if !ann[ANN_ALLOCATION].is_null() {
        if let Some(d) = valid_decision(pod, verify) {
            for g in &d.gpus {
                out.insert(g.index, d.per_gpu);
            }
        }
        return out;
    }
    if let Some(s) = ann[ANN_ACK_ALLOCATION].as_str() {
        if let Ok(m) = serde_json::from_str::<BTreeMap<String, BTreeMap<String, u64>>>(s) {
            for per in m.values() {
                for (gpu, gib) in per {
                    if let Ok(i) = gpu.parse::<u32>() {
                        *out.entry(i).or_insert(0) += gib;
                    }
                }
            }
            return out;
        }
    }
    if let (Some(idx), Some(gib)) = (
        ann[ANN_GPUSHARE_IDX]
            .as_str()
            .and_then(|s| s.parse::<u32>().ok()),
        ann[ANN_GPUSHARE_POD]
            .as_str()
            .and_then(|s| s.parse::<u64>().ok()),
    ) {
        out.insert(idx, gib);
    }
    out
}

/// The compute share (percent) a pod holds on each GPU of its node, by its
/// decision when that counts.
pub fn pod_compute_use(pod: &Value, verify: Verify) -> BTreeMap<u32, u32> {
    match valid_decision(pod, verify) {
        Some(d) if d.compute > 0 && pod_holds_gpu(pod) => {
            d.gpus.iter().map(|g| (g.index, d.compute)).collect()
        }
        _ => BTreeMap::new(),
    }
}

/// A node's GPUs with what its pods hold (the input to placement).
pub fn node_usage<'a>(
    gpus: &[NodeGpu],
    pods: impl IntoIterator<Item = &'a Value>,
    verify: Verify,
) -> Vec<Gpu> {
    let mut out: Vec<Gpu> = gpus
        .iter()
        .map(|g| Gpu {
            index: g.index,
            total: g.gib,
            used: 0,
            pods: 0,
        })
        .collect();
    for pod in pods {
        for (idx, gib) in pod_gpu_use(pod, verify) {
            if let Some(g) = out.iter_mut().find(|g| g.index == idx) {
                g.used += gib;
                g.pods += 1;
            }
        }
    }
    out
}

/// The values one container is handed, as `KEY=VALUE` lines: the file
/// named by `CGPU_ALLOC_FILE` that `libcgpu.so` reads at load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerAlloc {
    pub container_id: String,
    /// GiB on each visible GPU, in visible order.
    pub mem_per_gpu: Vec<u64>,
    /// Size in GiB of each GPU as the cluster counts it.
    pub mem_dev: u64,
    pub visible_uuids: Vec<String>,
    pub disable: bool,
    /// Indices of the GPUs, in visible order.
    pub gpu_indices: Vec<u32>,
    /// What the whole pod holds, summed over its GPUs.
    pub pod_total: u64,
    /// The pod asked for high priority (annotation `cgpu.io/high-priority`).
    pub high_prio: bool,
    /// `mem_per_gpu`, `mem_dev` and `pod_total` are MiB (a MiB node): the
    /// file carries the exact MiB (`CGPU_MEM_CONTAINER_MIB`) besides the
    /// GiB keys, which round up (quotas) and down (the GPU's size).
    pub mib: bool,
    /// Compute weight on each GPU (`ALIYUN_COM_GPU_SCHD_WEIGHT`), from the
    /// pod's compute share; `None` when it asked for none.
    pub weight: Option<u32>,
}

impl ContainerAlloc {
    /// The file's text. `CGPU_DISABLE=true` is written only for nodes
    /// labelled for sharing without isolation; otherwise the key is left
    /// out, so a pod may still opt out of isolation with its own
    /// `CGPU_DISABLE=true` (its memory is then still counted).
    pub fn to_file(&self) -> String {
        let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let mut s = format!(
            "{ENV_CONTAINER_ID}={}\n{ENV_MEM_CONTAINER}={}\n{ENV_MEM_DEV}={}\n{ENV_VISIBLE_DEVICES}={}\n",
            self.container_id,
            join(&self.gib_per_gpu()),
            self.gpu_gib(),
            self.visible_uuids.join(","),
        );
        if self.mib {
            s.push_str(&format!(
                "{ENV_MEM_CONTAINER_MIB}={}\n",
                join(&self.mem_per_gpu)
            ));
        }
        if self.disable {
            s.push_str(&format!("{ENV_DISABLE}=true\n"));
        }
        if let Some(w) = self.weight {
            s.push_str(&format!("ALIYUN_COM_GPU_SCHD_WEIGHT={w}\n"));
        }
        // The file's keys are the container's whole settings (its
        // environment cannot add one), so high priority must be in it.
        if self.high_prio {
            s.push_str(&format!("{ENV_HIGH_PRIO}=1\n"));
        }
        s
    }

    /// The quota on each GPU in whole GiB (a MiB share rounded up, as the
    /// library checks it against the exact MiB).
    pub fn gib_per_gpu(&self) -> Vec<u64> {
        if self.mib {
            self.mem_per_gpu.iter().map(|m| m.div_ceil(1024)).collect()
        } else {
            self.mem_per_gpu.clone()
        }
    }

    /// The GPU's size in whole GiB (a MiB size rounded down, at least 1).
    pub fn gpu_gib(&self) -> u64 {
        if self.mib {
            (self.mem_dev / 1024).max(1)
        } else {
            self.mem_dev
        }
    }

    /// The environment gpushare's device plugin gives a container
    /// (`ALIYUN_COM_GPU_MEM_IDX/_POD/_CONTAINER/_DEV`), as `KEY=VALUE`, for
    /// programs that read it; `_CONTAINER` per GPU as in the file.
    pub fn gpushare_env(&self) -> Vec<String> {
        let join = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>().join(",");
        vec![
            format!(
                "{ANN_GPUSHARE_IDX}={}",
                join(&mut self.gpu_indices.iter().map(u32::to_string))
            ),
            format!("{ANN_GPUSHARE_POD}={}", self.pod_total),
            format!(
                "{ENV_MEM_CONTAINER}={}",
                join(&mut self.gib_per_gpu().iter().map(u64::to_string))
            ),
            format!("{ENV_MEM_DEV}={}", self.gpu_gib()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{place, Policy};
    use serde_json::json;

    fn node_json() -> Value {
        let gpus = vec![
            NodeGpu {
                index: 0,
                uuid: "GPU-a".into(),
                memory_mib: 16160,
                gib: 15,
                model: String::new(),
                unhealthy: false,
                mib: false,
            },
            NodeGpu {
                index: 1,
                uuid: "GPU-b".into(),
                memory_mib: 16160,
                gib: 15,
                model: String::new(),
                unhealthy: false,
                mib: false,
            },
        ];
        json!({"metadata": {"name": "n1", "annotations": {ANN_NODE_GPUS: serde_json::to_string(&gpus).unwrap()}},
               "status": {"addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.3"}]}})
    }

    #[test]
    fn compute_shares_become_weights_of_16_slices() {
        let pod = |core: &str| json!({"metadata": {"annotations": {ANN_GPU_CORE: core}}});
        let one = Request::single(4, 1);
        assert_eq!(pod_compute(&json!({}), &one), Ok((0, 0)));
        assert_eq!(pod_compute(&pod("60"), &one), Ok((60, 9)));
        assert_eq!(pod_compute(&pod("100%"), &one), Ok((100, 16)));
        assert_eq!(pod_compute(&pod("7"), &one), Ok((7, 1)));
        assert!(pod_compute(&pod("6"), &one)
            .unwrap_err()
            .contains("at least 7"));
        for bad in ["0", "101", "x", "-5", "1.5"] {
            assert!(pod_compute(&pod(bad), &one).is_err(), "{bad}");
        }
        // Two app containers split the slices; an init container adds none.
        let mut two = Request::single(4, 1);
        two.containers.push(ContainerRequest {
            name: "b".into(),
            mem: 2,
            init: false,
        });
        two.containers.push(ContainerRequest {
            name: "i".into(),
            mem: 4,
            init: true,
        });
        assert_eq!(pod_compute(&pod("50"), &two), Ok((50, 4)));
        assert!(pod_compute(&pod("12"), &two)
            .unwrap_err()
            .contains("at least 13"));
        // A decision without a share signs the same bytes as before shares
        // existed; one with a share signs it too.
        let p = Placement {
            gpus: vec![0],
            per_gpu: 4,
            gpu_total: 15,
            containers: vec![("main".into(), 4)],
            free_after: 11,
        };
        let mut d = Decision::new("n", "u", &p, &[]);
        let bytes = String::from_utf8(d.signed_bytes()).unwrap();
        assert!(!bytes.contains("compute"), "{bytes}");
        d.compute = 60;
        let bytes = String::from_utf8(d.signed_bytes()).unwrap();
        assert!(bytes.contains(r#""compute":60"#), "{bytes}");
    }

    #[test]
    fn gib_rounds_down_unless_stated() {
        assert_eq!(gpu_gib(16130, None), 15);
        assert_eq!(gpu_gib(15109, None), 14);
        assert_eq!(gpu_gib(15109, Some(15)), 15);
    }

    #[test]
    fn node_gpus_from_annotation_or_capacity() {
        let n = node_json();
        assert_eq!(node_gpus(&n).len(), 2);
        assert_eq!(node_ip(&n), "10.0.0.3");
        let legacy = json!({"status": {"capacity": {"aliyun.com/gpu-mem": "45", "aliyun.com/gpu-count": "3"}}});
        let g = node_gpus(&legacy);
        assert_eq!(
            g.iter().map(|g| g.gib).collect::<Vec<_>>(),
            vec![15, 15, 15]
        );
    }

    #[test]
    fn request_from_pod_spec() {
        let pod = json!({"metadata": {"labels": {"aliyun.com/gpu-count": "2"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "8"}}}]}});
        let r = pod_request(&pod).unwrap();
        assert_eq!(r, Request::single(8, 2).renamed("c"));
        let bad = json!({"metadata": {"labels": {"aliyun.com/gpu-count": "two"}}, "spec": {}});
        assert!(pod_request(&bad).unwrap_err().contains("\"two\""));
        let gi = json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "8Gi"}}}]}});
        assert!(pod_request(&gi)
            .unwrap_err()
            .contains("not a whole number of GiB"));
    }

    #[test]
    fn use_from_our_decision_ack_and_gpushare_annotations() {
        let node = node_json();
        let gpus = node_gpus(&node);
        let req = Request::single(8, 2);
        let p = place(&node_usage(&gpus, [], &|_| true), &req, Policy::Binpack).unwrap();
        let d = Decision::new("n1", "uid-1", &p, &gpus);
        assert_eq!(d.gpus[1].uuid, "GPU-b");
        let spec = json!({"nodeName": "n1", "containers": [{"name": "main"}]});
        let ours = json!({"metadata": {"uid": "uid-1", "annotations": {ANN_ALLOCATION: serde_json::to_string(&d).unwrap()}},
                          "spec": spec, "status": {"phase": "Running"}});
        assert_eq!(d.ack_allocation(&ours), r#"{"0":{"0":4,"1":4}}"#);
        let ack = json!({"metadata": {"annotations": {ANN_ACK_ALLOCATION: r#"{"0":{"1":3}}"#}},
                         "spec": spec, "status": {"phase": "Pending"}});
        let gpushare = json!({"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "2"}},
                              "spec": spec, "status": {"phase": "Running"}});
        let done = json!({"metadata": {"annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "9"}},
                          "spec": spec, "status": {"phase": "Succeeded"}});
        let terminating = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z",
                                 "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "1"}},
                                 "spec": spec, "status": {"phase": "Running"}});
        let u = node_usage(
            &gpus,
            [&ours, &ack, &gpushare, &done, &terminating],
            &|_| true,
        );
        assert_eq!((u[0].used, u[0].pods), (4 + 2, 2));
        assert_eq!((u[1].used, u[1].pods), (4 + 3 + 1, 3));
        // The same decision copied onto another pod (with the gpushare
        // annotations beside it), or failing its signature, counts nothing.
        let mut copy = ours.clone();
        copy["metadata"]["uid"] = json!("uid-2");
        copy["metadata"]["annotations"][ANN_GPUSHARE_IDX] = json!("0");
        copy["metadata"]["annotations"][ANN_GPUSHARE_POD] = json!("8");
        assert!(pod_gpu_use(&copy, &|_| true).is_empty());
        assert!(pod_gpu_use(&ours, &|_| false).is_empty());
        let mut elsewhere = ours.clone();
        elsewhere["spec"]["nodeName"] = json!("n2");
        assert!(pod_gpu_use(&elsewhere, &|_| true).is_empty());
        assert_eq!(pod_gpu_use(&ours, &|_| true).len(), 2);
    }

    #[test]
    fn signed_bytes_ignore_the_signature() {
        let gpus = node_gpus(&node_json());
        let p = place(
            &node_usage(&gpus, [], &|_| true),
            &Request::single(3, 1),
            Policy::Binpack,
        )
        .unwrap();
        let mut d = Decision::new("n1", "u", &p, &gpus);
        let before = d.signed_bytes();
        d.sig = "00ff".into();
        assert_eq!(d.signed_bytes(), before);
        d.per_gpu = 15;
        assert_ne!(d.signed_bytes(), before);
    }

    #[test]
    fn alloc_file_lines() {
        let a = ContainerAlloc {
            container_id: "default/p/main".into(),
            mem_per_gpu: vec![4, 4],
            mem_dev: 15,
            visible_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            disable: false,
            gpu_indices: vec![0, 1],
            pod_total: 8,
            high_prio: false,
            weight: None,
            mib: false,
        };
        assert_eq!(
            a.to_file(),
            "CGPU_CONTAINER_ID=default/p/main\nALIYUN_COM_GPU_MEM_CONTAINER=4,4\nALIYUN_COM_GPU_MEM_DEV=15\n\
             ALIYUN_COM_GPU_VISIBLE_DEVICES=GPU-a,GPU-b\n"
        );
        assert_eq!(
            a.gpushare_env(),
            [
                "ALIYUN_COM_GPU_MEM_IDX=0,1",
                "ALIYUN_COM_GPU_MEM_POD=8",
                "ALIYUN_COM_GPU_MEM_CONTAINER=4,4",
                "ALIYUN_COM_GPU_MEM_DEV=15"
            ]
        );
        // A MiB node: the exact MiB, the GiB keys rounded (quota up, the
        // GPU's size down).
        let m = ContainerAlloc {
            mem_per_gpu: vec![3000, 1024],
            mem_dev: 15109,
            pod_total: 4024,
            mib: true,
            ..a.clone()
        };
        assert_eq!(
            m.to_file(),
            "CGPU_CONTAINER_ID=default/p/main\nALIYUN_COM_GPU_MEM_CONTAINER=3,1\nALIYUN_COM_GPU_MEM_DEV=14\n\
             ALIYUN_COM_GPU_VISIBLE_DEVICES=GPU-a,GPU-b\nCGPU_MEM_CONTAINER_MIB=3000,1024\n"
        );
        assert_eq!(
            m.gpushare_env()[1..],
            [
                "ALIYUN_COM_GPU_MEM_POD=4024",
                "ALIYUN_COM_GPU_MEM_CONTAINER=3,1",
                "ALIYUN_COM_GPU_MEM_DEV=14"
            ]
        );
        let shared = ContainerAlloc { disable: true, ..a };
        assert!(shared.to_file().ends_with("\nCGPU_DISABLE=true\n"));
    }
}
