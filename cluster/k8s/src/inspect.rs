//! `kubectl inspect cgpu`: GPU memory allocated per node and GPU, from the
//! pods' recorded decisions (ours, ACK's or gpushare's annotations).

use cgpu_cluster_core::decision::{
    node_gpus, node_ip, pod_gpu_use, pod_holds_gpu, pod_key, pod_request, Verify,
};
use serde::Serialize;
use serde_json::Value;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ClusterView {
    pub nodes: Vec<NodeView>,
    pub allocated: u64,
    pub total: u64,
    /// `allocated * 100 / total`, truncated.
    pub percent: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub ip: String,
    pub gpus: Vec<GpuView>,
    pub allocated: u64,
    pub total: u64,
    /// Pods bound here that ask for GPU memory but hold no decision that
    /// counts (scheduled without the extender, or carrying a copied or
    /// forged one): they get no GPU memory, though the kubelet has set
    /// their `aliyun.com/gpu-mem` aside.
    pub undecided: Vec<String>,
    /// The same pods with what they ask for: gpushare's "pending" column.
    /// They hold no GPU memory, so `allocated` leaves them out (gpushare,
    /// whose pending pods get memory later, counts them in).
    pub pending: Vec<PodShare>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub allocated: u64,
    pub total: u64,
    pub pods: Vec<PodShare>,
    /// The device plugin saw the GPU fail: no new pod is placed on it.
    pub unhealthy: bool,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PodShare {
    pub namespace: String,
    pub name: String,
    pub allocated: u64,
}

/// Builds the view from node and pod objects (Kubernetes JSON). Nodes with
/// no shared GPUs are left out; nodes are sorted by name. A decision counts
/// only for the pod it names, on its node, and when `verify` accepts its
/// signature; a pod whose decision does not count is listed as undecided.
pub fn view(nodes: &[Value], pods: &[Value], verify: Verify) -> ClusterView {
    let mut out = Vec::new();
    for node in nodes {
        let gpus = node_gpus(node);
        if gpus.is_empty() {
            continue;
        }
        let name = node["metadata"]["name"].as_str().unwrap_or("").to_string();
        let mut gv: Vec<GpuView> = gpus
            .iter()
            .map(|g| GpuView {
                index: g.index,
                uuid: g.uuid.clone(),
                allocated: 0,
                total: g.gib,
                pods: Vec::new(),
                unhealthy: g.unhealthy,
            })
            .collect();
        let mut undecided = Vec::new();
        let mut pending: Vec<PodShare> = Vec::new();
        for pod in pods
            .iter()
            .filter(|p| p["spec"]["nodeName"].as_str() == Some(name.as_str()))
        {
            let used = pod_gpu_use(pod, verify);
            if used.is_empty() {
                if let Ok(r) = pod_request(pod) {
                    if pod_holds_gpu(pod) && r.wants_gpu_mem() {
                        undecided.push(pod_key(pod));
                        let asked = r
                            .containers
                            .iter()
                            .filter(|c| !c.init)
                            .map(|c| c.mem)
                            .sum::<u64>()
                            .max(
                                r.containers
                                    .iter()
                                    .filter(|c| c.init)
                                    .map(|c| c.mem)
                                    .max()
                                    .unwrap_or(0),
                            );
                        pending.push(PodShare {
                            namespace: pod["metadata"]["namespace"]
                                .as_str()
                                .unwrap_or("")
                                .to_string(),
                            name: pod["metadata"]["name"].as_str().unwrap_or("").to_string(),
                            allocated: asked,
                        });
                    }
                }
                continue;
            }
            for (idx, gib) in used {
                if let Some(g) = gv.iter_mut().find(|g| g.index == idx) {
                    g.allocated += gib;
                    g.pods.push(PodShare {
                        namespace: pod["metadata"]["namespace"]
                            .as_str()
                            .unwrap_or("")
                            .to_string(),
                        name: pod["metadata"]["name"].as_str().unwrap_or("").to_string(),
                        allocated: gib,
                    });
                }
            }
        }
        out.push(NodeView {
            ip: node_ip(node),
            allocated: gv.iter().map(|g| g.allocated).sum(),
            total: gv.iter().map(|g| g.total).sum(),
            gpus: gv,
            name,
            undecided,
            pending,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    let allocated: u64 = out.iter().map(|n| n.allocated).sum();
    let total: u64 = out.iter().map(|n| n.total).sum();
    ClusterView {
        percent: (allocated * 100).checked_div(total).unwrap_or(0),
        nodes: out,
        allocated,
        total,
    }
}

/// Aligns cells like Go's tabwriter (min width 0, padding 2): every cell but
/// the last of a row is padded to its column's widest cell plus 2.
fn table(rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(r.len().saturating_sub(1)) {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut s = String::new();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i + 1 < r.len() {
                s.push_str(&format!("{c:<w$}", w = widths[i] + 2));
            } else {
                s.push_str(c);
            }
        }
        s.push('\n');
    }
    s
}

const RULE: &str = "---------------------------------------------------------------------";
/// The rule under each node of the `-d` layout (gpushare's is longer).
const DETAILS_RULE: &str =
    "------------------------------------------------------------------------";

/// The summary table (one row per node, one column per GPU index up to the
/// largest GPU count, `0/0` where a node has fewer; gpushare's
/// `PENDING(Allocated)` column when some node has pending pods).
pub fn render(v: &ClusterView) -> String {
    let columns = v.nodes.iter().map(|n| n.gpus.len()).max().unwrap_or(0);
    let any_pending = v.nodes.iter().any(|n| !n.pending.is_empty());
    let mut rows = Vec::new();
    let mut head = vec!["NAME".to_string(), "IPADDRESS".to_string()];
    head.extend((0..columns).map(|i| format!("GPU{i}(Allocated/Total)")));
    if any_pending {
        head.push("PENDING(Allocated)".into());
    }
    head.push("GPU Memory(GiB)".into());
    rows.push(head);
    for n in &v.nodes {
        let mut r = vec![n.name.clone(), n.ip.clone()];
        for i in 0..columns {
            r.push(match n.gpus.get(i) {
                Some(g) if g.unhealthy => format!("{}/{}(Unhealthy)", g.allocated, g.total),
                Some(g) => format!("{}/{}", g.allocated, g.total),
                None => "0/0".into(),
            });
        }
        if any_pending {
            r.push(
                n.pending
                    .iter()
                    .map(|p| p.allocated)
                    .sum::<u64>()
                    .to_string(),
            );
        }
        r.push(format!("{}/{}", n.allocated, n.total));
        rows.push(r);
    }
    let mut s = table(&rows);
    s.push_str(RULE);
    s.push('\n');
    s.push_str("Allocated/Total GPU Memory In Cluster:\n");
    s.push_str(&format!("{}/{} ({}%)\n", v.allocated, v.total, v.percent));
    s
}

/// `-d`: per node, the pods on each GPU, in gpushare's layout: a
/// `Pending(Allocated)` column when the node has pending pods, and the
/// node's `Allocated :`/`Total :` rows aligned with the pod names.
pub fn render_details(v: &ClusterView) -> String {
    let mut s = String::new();
    for n in &v.nodes {
        s.push_str(&table(&[
            vec![],
            vec!["NAME:".into(), n.name.clone()],
            vec!["IPADDRESS:".into(), n.ip.clone()],
            vec![],
        ]));
        let with_pending = !n.pending.is_empty();
        let mut rows = Vec::new();
        let mut head = vec!["NAME".to_string(), "NAMESPACE".to_string()];
        head.extend(n.gpus.iter().map(|g| format!("GPU{}(Allocated)", g.index)));
        if with_pending {
            head.push("Pending(Allocated)".into());
        }
        rows.push(head);
        let mut pods: Vec<(String, String)> = n
            .gpus
            .iter()
            .flat_map(|g| g.pods.iter().map(|p| (p.namespace.clone(), p.name.clone())))
            .chain(
                n.pending
                    .iter()
                    .map(|p| (p.namespace.clone(), p.name.clone())),
            )
            .collect();
        pods.sort();
        pods.dedup();
        for (ns, name) in &pods {
            let mut r = vec![name.clone(), ns.clone()];
            let mine = |list: &[PodShare]| -> u64 {
                list.iter()
                    .filter(|p| &p.namespace == ns && &p.name == name)
                    .map(|p| p.allocated)
                    .sum()
            };
            for g in &n.gpus {
                r.push(mine(&g.pods).to_string());
            }
            if with_pending {
                r.push(mine(&n.pending).to_string());
            }
            rows.push(r);
        }
        let pct = (n.allocated * 100).checked_div(n.total).unwrap_or(0);
        rows.push(vec![
            "Allocated :".into(),
            format!("{} ({}%)", n.allocated, pct),
        ]);
        rows.push(vec!["Total :".into(), n.total.to_string()]);
        s.push_str(&table(&rows));
        s.push_str(DETAILS_RULE);
        s.push('\n');
        for g in n.gpus.iter().filter(|g| g.unhealthy) {
            s.push_str(&format!(
                "Unhealthy: GPU{} {}failed; no new pod is placed on it\n",
                g.index,
                if g.uuid.is_empty() {
                    String::new()
                } else {
                    format!("({}) ", g.uuid)
                }
            ));
        }
        for p in &n.undecided {
            s.push_str(&format!(
                "Not allocated: {p} asks for aliyun.com/gpu-mem but holds no valid scheduler decision (no GPU memory)\n"
            ));
        }
    }
    s.push_str(&format!(
        "\nAllocated/Total GPU Memory In Cluster:  {}/{} ({}%)\n",
        v.allocated, v.total, v.percent
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, ip: &str, gpus: u64, mem: u64) -> Value {
        json!({"metadata": {"name": name}, "status": {
            "addresses": [{"type": "InternalIP", "address": ip}],
            "capacity": {"aliyun.com/gpu-count": gpus.to_string(), "aliyun.com/gpu-mem": mem.to_string()}}})
    }

    #[test]
    fn seed_layout_with_a_gpushare_pod() {
        let nodes = vec![
            node("cn-beijing.192.16x.x.xx3", "192.16x.x.xx3", 1, 15),
            node("cn-beijing.192.16x.x.xx1", "192.16x.x.xx1", 1, 15),
            node("cn-beijing.192.16x.x.xx2", "192.16x.x.xx2", 1, 15),
        ];
        let pod = json!({"metadata": {"name": "disable-cgpu-x", "namespace": "default",
            "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "3"}},
            "spec": {"nodeName": "cn-beijing.192.16x.x.xx3"}, "status": {"phase": "Running"}});
        let v = view(&nodes, &[pod], &|_| true);
        assert_eq!(
            render(&v),
            "NAME                      IPADDRESS      GPU0(Allocated/Total)  GPU Memory(GiB)\n\
             cn-beijing.192.16x.x.xx1  192.16x.x.xx1  0/15                   0/15\n\
             cn-beijing.192.16x.x.xx2  192.16x.x.xx2  0/15                   0/15\n\
             cn-beijing.192.16x.x.xx3  192.16x.x.xx3  3/15                   3/15\n\
             ---------------------------------------------------------------------\n\
             Allocated/Total GPU Memory In Cluster:\n\
             3/45 (6%)\n"
        );
    }

    #[test]
    fn fewer_gpus_show_zero_over_zero_and_details_list_pods() {
        let nodes = vec![node("a", "10.0.0.1", 2, 30), node("b", "10.0.0.2", 1, 15)];
        let pod = json!({"metadata": {"name": "p", "namespace": "ml",
            "annotations": {"scheduler.framework.gpushare.allocation": "{\"0\":{\"0\":4,\"1\":4}}"}},
            "spec": {"nodeName": "a"}, "status": {"phase": "Running"}});
        let v = view(&nodes, &[pod], &|_| true);
        let out = render(&v);
        assert!(
            out.contains("b     10.0.0.2   0/15                   0/0                    0/15\n"),
            "{out}"
        );
        assert!(out.ends_with("8/45 (17%)\n"), "{out}");
        let d = render_details(&v);
        assert!(
            d.contains("p            ml         4                4\n"),
            "{d}"
        );
        assert!(d.contains("Allocated :  8 (26%)\nTotal :      30\n"), "{d}");
    }

    /// gpushare's `-d` layout, as printed on a node with a pending pod
    /// (whose 4 GiB gpushare would count in `Allocated`).
    #[test]
    fn details_in_gpushare_layout_with_a_pending_pod() {
        let nodes = vec![node("nlu-framework-worker-1", "192.168.0.53", 1, 47)];
        let placed = json!({"metadata": {"name": "gpu-share-pod3", "namespace": "default",
            "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "11"}},
            "spec": {"nodeName": "nlu-framework-worker-1"}, "status": {"phase": "Running"}});
        let pending = json!({"metadata": {"name": "jupyter-admin888", "namespace": "jupyterhub"},
            "spec": {"nodeName": "nlu-framework-worker-1", "containers": [{"name": "c",
                "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]}, "status": {"phase": "Pending"}});
        let v = view(&nodes, &[placed, pending], &|_| true);
        let d = render_details(&v);
        assert!(
            d.starts_with(
                "\nNAME:       nlu-framework-worker-1\nIPADDRESS:  192.168.0.53\n\n\
                 NAME              NAMESPACE   GPU0(Allocated)  Pending(Allocated)\n\
                 gpu-share-pod3    default     11               0\n\
                 jupyter-admin888  jupyterhub  0                4\n\
                 Allocated :       11 (23%)\n\
                 Total :           47\n\
                 ------------------------------------------------------------------------\n"
            ),
            "{d}"
        );
        let out = render(&v);
        assert!(
            out.starts_with(
                "NAME                    IPADDRESS     GPU0(Allocated/Total)  PENDING(Allocated)  GPU Memory(GiB)\n\
                 nlu-framework-worker-1  192.168.0.53  11/47                  4                   11/47\n"
            ),
            "{out}"
        );
    }
}
