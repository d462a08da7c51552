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
    /// Pods bound here that ask for GPU memory but hold no recorded
    /// decision (scheduled without the extender): they get no GPU memory.
    pub undecided: Vec<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub allocated: u64,
    pub total: u64,
    pub pods: Vec<PodShare>,
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
            })
            .collect();
        let mut undecided = Vec::new();
        for pod in pods
            .iter()
            .filter(|p| p["spec"]["nodeName"].as_str() == Some(name.as_str()))
        {
            let used = pod_gpu_use(pod, verify);
            if used.is_empty() {
                if pod_holds_gpu(pod) && pod_request(pod).is_ok_and(|r| r.wants_gpu_mem()) {
                    undecided.push(pod_key(pod));
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

/// The summary table (one row per node, one column per GPU index up to the
/// largest GPU count, `0/0` where a node has fewer).
pub fn render(v: &ClusterView) -> String {
    let columns = v.nodes.iter().map(|n| n.gpus.len()).max().unwrap_or(0);
    let mut rows = Vec::new();
    let mut head = vec!["NAME".to_string(), "IPADDRESS".to_string()];
    head.extend((0..columns).map(|i| format!("GPU{i}(Allocated/Total)")));
    head.push("GPU Memory(GiB)".into());
    rows.push(head);
    for n in &v.nodes {
        let mut r = vec![n.name.clone(), n.ip.clone()];
        for i in 0..columns {
            r.push(match n.gpus.get(i) {
                Some(g) => format!("{}/{}", g.allocated, g.total),
                None => "0/0".into(),
            });
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

/// `-d`: per node, the pods on each GPU.
pub fn render_details(v: &ClusterView) -> String {
    let mut s = String::new();
    for n in &v.nodes {
        s.push_str(&format!(
            "\nNAME:       {}\nIPADDRESS:  {}\n\n",
            n.name, n.ip
        ));
        let mut rows = Vec::new();
        let mut head = vec!["NAME".to_string(), "NAMESPACE".to_string()];
        head.extend(n.gpus.iter().map(|g| format!("GPU{}(Allocated)", g.index)));
        rows.push(head);
        let mut pods: Vec<(String, String)> = n
            .gpus
            .iter()
            .flat_map(|g| g.pods.iter().map(|p| (p.namespace.clone(), p.name.clone())))
            .collect();
        pods.sort();
        pods.dedup();
        for (ns, name) in &pods {
            let mut r = vec![name.clone(), ns.clone()];
            for g in &n.gpus {
                let a: u64 = g
                    .pods
                    .iter()
                    .filter(|p| &p.namespace == ns && &p.name == name)
                    .map(|p| p.allocated)
                    .sum();
                r.push(a.to_string());
            }
            rows.push(r);
        }
        s.push_str(&table(&rows));
        let pct = (n.allocated * 100).checked_div(n.total).unwrap_or(0);
        s.push_str(&format!(
            "Allocated :  {} ({}%)\nTotal :      {}\n",
            n.allocated, pct, n.total
        ));
        for p in &n.undecided {
            s.push_str(&format!(
                "Not allocated: {p} asks for aliyun.com/gpu-mem but holds no scheduler decision (no GPU memory)\n"
            ));
        }
        s.push_str(RULE);
        s.push('\n');
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
        assert!(d.contains("p     ml         4                4\n"), "{d}");
        assert!(d.contains("Allocated :  8 (26%)"), "{d}");
    }
}
