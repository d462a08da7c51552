//! The kubelet device plugin for `aliyun.com/gpu-mem` (and, for capacity,
//! `aliyun.com/gpu-count`).
//!
//! The kubelet's `Allocate` names device ids but no pod, so nothing about
//! the pod is decided there: each container gets the same environment and
//! mounts (the interposer, the ledger directory, and `CGPU_ALLOC_FILE`
//! naming a file keyed by its device ids). The pod is identified at
//! `PreStartContainer`, which the kubelet calls before each start of the
//! container, after it has recorded the allocation: the kubelet's own
//! PodResources API maps the device ids to namespace, pod and container.
//! The plugin then reads the pod, checks the scheduler extender's signed
//! decision (made for this pod, this node, GPUs that exist here with the
//! size it assumed, the container's share matching what the kubelet
//! allocated, the node not over-committed), and only then writes the
//! container's file. Any failure fails `PreStartContainer`, so the kubelet
//! does not start the container and reports why on the pod; a container
//! whose file is missing anyway sees no GPU (the interposer's rule).

use crate::kube_io::to_value;
use crate::kubelet_api::deviceplugin as dp;
use crate::kubelet_api::podresources as pr;
use crate::nvml::{Fault, GpuSource};
use crate::signing::DecisionVerifier;
use cgpu_cluster_core::decision::{
    compute_weight, pod_gpu_use, pod_request, valid_decision, ContainerAlloc, Decision, NodeGpu,
};
use cgpu_cluster_core::names::*;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Where things are, on the node and in the containers.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    pub node_name: String,
    /// The kubelet's device-plugin directory (holds `kubelet.sock`).
    pub plugin_dir: PathBuf,
    /// The kubelet's PodResources socket.
    pub pod_resources_socket: PathBuf,
    /// Directory for the per-container allocation files, as the plugin
    /// sees it and as the node sees it (the host path mounted into
    /// containers; the same unless the plugin runs with another mount).
    pub alloc_dir: PathBuf,
    pub alloc_dir_on_host: PathBuf,
    /// `libcgpu.so` on the node, and where containers see it.
    pub library_on_host: PathBuf,
    pub library_in_container: PathBuf,
    /// The ledger directory on the node, and where containers see it.
    pub ledger_on_host: PathBuf,
    pub ledger_in_container: PathBuf,
    /// Where a container sees its allocation file.
    pub alloc_file_in_container: PathBuf,
    /// Where the container runtime reads CDI specs written at run time
    /// (containerd's and CRI-O's default includes `/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Give containers `NVIDIA_VISIBLE_DEVICES=all` instead of naming their
    /// GPUs through CDI (for runtimes without CDI; the library still shows
    /// a container only its own GPUs).
    pub expose_all_gpus: bool,
    /// Secure mode (`cgpu-agent --secure` on the node): containers get the
    /// ledger directory read-only (the agent alone writes it; they ask it
    /// over the socket in it), and each container's settings are written
    /// for the agent into [`PluginConfig::settings_dir`].
    pub secure: bool,
    /// The host's per-container settings directory the agent reads (as the
    /// plugin sees it); written only in secure mode.
    pub settings_dir: PathBuf,
}

impl PluginConfig {
    /// The usual layout on a node.
    pub fn standard(node_name: &str) -> PluginConfig {
        PluginConfig {
            node_name: node_name.to_string(),
            plugin_dir: "/var/lib/kubelet/device-plugins".into(),
            pod_resources_socket: "/var/lib/kubelet/pod-resources/kubelet.sock".into(),
            alloc_dir: "/run/cgpu-alloc".into(),
            alloc_dir_on_host: "/run/cgpu-alloc".into(),
            library_on_host: "/opt/cgpu/libcgpu.so".into(),
            library_in_container: "/opt/cgpu/libcgpu.so".into(),
            ledger_on_host: "/run/cgpu".into(),
            ledger_in_container: "/run/cgpu".into(),
            alloc_file_in_container: "/etc/cgpu/alloc.env".into(),
            cdi_dir: "/var/run/cdi".into(),
            expose_all_gpus: false,
            secure: false,
            settings_dir: cgpu_ledger::settings::DEFAULT_SETTINGS_DIR.into(),
        }
    }
}

pub const MEM_SOCKET: &str = "cgpu-gpu-mem.sock";
/// CDI kind of the per-container devices (`cgpu.io/container=<name>`).
pub const CDI_KIND: &str = "cgpu.io/container";

/// The CDI device name of a container's device ids (the allocation file's
/// name without `.env`), and the file its spec is written to.
pub fn cdi_name(device_ids: &[String]) -> (String, String) {
    let file = alloc_file_name(device_ids);
    let stem = file.trim_end_matches(".env").to_string();
    (format!("{CDI_KIND}={stem}"), format!("cgpu-{stem}.json"))
}

/// The CDI spec of a container: its GPUs for the NVIDIA runtime, and the
/// environment gpushare's device plugin gives.
pub fn cdi_spec(device_ids: &[String], alloc: &ContainerAlloc) -> String {
    let (_, file) = cdi_name(device_ids);
    let stem = file.trim_start_matches("cgpu-").trim_end_matches(".json");
    let mut env = vec![format!(
        "NVIDIA_VISIBLE_DEVICES={}",
        alloc.visible_uuids.join(",")
    )];
    env.extend(alloc.gpushare_env());
    if alloc.high_prio {
        env.push(format!("{ENV_HIGH_PRIO}=1"));
    }
    serde_json::json!({
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": [{"name": stem, "containerEdits": {"env": env}}],
    })
    .to_string()
}
pub const COUNT_SOCKET: &str = "cgpu-gpu-count.sock";

/// The file name (in the allocation directory) for a container's device ids.
pub fn alloc_file_name(device_ids: &[String]) -> String {
    let mut ids: Vec<&str> = device_ids.iter().map(String::as_str).collect();
    ids.sort_unstable();
    let digest = ring::digest::digest(&ring::digest::SHA256, ids.join(",").as_bytes());
    let hex: String = digest.as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{hex}.env")
}

/// The name of the host settings file of container `container` of the pod
/// with uid `pod_uid`, in the settings directory: named by the container's
/// ledger key, which the node agent computes from the kubelet's bind in the
/// container (the pod's uid and the container's name), so the file can be
/// written before the container exists.
pub fn settings_file_name(pod_uid: &str, container: &str) -> String {
    let key = cgpu_ledger::identity::key_of("k8s", &format!("{pod_uid}/{container}"));
    format!("{SETTINGS_PREFIX}{key:016x}.env")
}

/// What every settings file the plugin writes is named by (others in the
/// directory are the operator's and never touched).
pub const SETTINGS_PREFIX: &str = "k8s-";

/// `namespace/pod/container`, shortened to the ledger's 63 bytes when
/// longer (a prefix and a hash of the whole, so it stays unique and stable).
pub fn container_id(ns: &str, pod: &str, container: &str) -> String {
    let full = format!("{ns}/{pod}/{container}");
    if full.len() <= 63 {
        return full;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, full.as_bytes());
    let hex: String = digest.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut cut = 50;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hex}", &full[..cut])
}

/// What the plugin knows about its node.
pub struct NodeState {
    /// The GPUs as read at start (a GPU lost then is read again when it
    /// answers again).
    pub gpus: parking_lot::RwLock<Vec<NodeGpu>>,
    /// The size in GiB the node's label states for each GPU, if any.
    pub stated_gib: Option<u64>,
    /// The node counts `aliyun.com/gpu-mem` in MiB (label
    /// `cgpu.io/gpu-mem-unit=MiB`): one device per MiB.
    pub mib: bool,
    /// The node is labelled for sharing without isolation.
    pub share_only: bool,
}

/// A model name as a label value: `[A-Za-z0-9._-]`, others as `-`, at most
/// 63 characters, starting and ending alphanumeric.
pub fn label_value(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The node's unit for `aliyun.com/gpu-mem` from its label: MiB or GiB.
pub fn unit_is_mib(label: Option<&str>) -> Result<bool, String> {
    match label.map(str::trim) {
        None => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("GiB") => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("MiB") => Ok(true),
        Some(v) => Err(format!(
            "node label {LABEL_NODE_MEM_UNIT}={v:?} is neither GiB nor MiB"
        )),
    }
}

/// The GPUs counted in the node's unit: on a MiB node each GPU's size is
/// its memory in MiB as NVML reports it (the GiB label does not apply).
pub fn in_unit(gpus: Vec<NodeGpu>, mib: bool) -> Vec<NodeGpu> {
    if !mib {
        return gpus;
    }
    gpus.into_iter()
        .map(|g| NodeGpu {
            gib: g.memory_mib,
            mib: true,
            ..g
        })
        .collect()
}

/// A device's health as the kubelet reads it.
fn health(g: &NodeGpu) -> &'static str {
    if g.unhealthy {
        "Unhealthy"
    } else {
        "Healthy"
    }
}

/// How GPUs that failed become healthy again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// How long a GPU stays unhealthy after its last critical XID error
    /// before it is trusted again (if it still answers); `None`: until the
    /// plugin restarts.
    pub xid_hold: Option<Duration>,
}

impl Default for Recovery {
    fn default() -> Recovery {
        Recovery {
            xid_hold: Some(DEFAULT_XID_HOLD),
        }
    }
}

/// A GPU failed by a critical XID error is trusted again this long after
/// its last one.
pub const DEFAULT_XID_HOLD: Duration = Duration::from_secs(300);

impl Recovery {
    /// Parses the XID hold: whole seconds (`300`, `300s`), minutes (`5m`),
    /// or `never`.
    pub fn parse_xid_hold(v: &str) -> Result<Option<Duration>, String> {
        let v = v.trim();
        if v == "never" {
            return Ok(None);
        }
        let (num, unit) = match v.strip_suffix('m') {
            Some(n) => (n, 60),
            None => (v.strip_suffix('s').unwrap_or(v), 1),
        };
        num.parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(unit))
            .map(|secs| Some(Duration::from_secs(secs)))
            .ok_or_else(|| {
                format!("{v:?} is not a hold time (whole seconds such as 300 or 300s, minutes such as 5m, or never)")
            })
    }
}

/// Reasons of the events on the node when a GPU fails and when it is back.
pub const EVENT_REASON_GPU_UNHEALTHY: &str = "CgpuGpuUnhealthy";
pub const EVENT_REASON_GPU_HEALTHY: &str = "CgpuGpuHealthy";

/// Watches the GPUs' health through `source` on a thread of its own (NVML's
/// event wait blocks): a GPU that fails gets its devices marked unhealthy
/// in every `ListAndWatch` stream and is published as unhealthy on the
/// node, so neither the kubelet nor the scheduler extender places a new
/// pod on it. A lost GPU is healthy again as soon as it answers; one that
/// had a critical XID error once `recovery.xid_hold` passed without
/// another and it answers. Each change is an event on the node. Must be
/// called inside the Tokio runtime.
pub fn spawn_health_watch(plugin: Arc<Plugin>, source: Arc<dyn GpuSource>, recovery: Recovery) {
    let rt = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("gpu-health".into())
        .spawn(move || {
            let mut published = plugin.failed.borrow().clone();
            // When each GPU had its last critical XID error (not one that
            // means it fell off the bus).
            let mut last_xid: BTreeMap<u32, Instant> = BTreeMap::new();
            loop {
                let mut changes = Vec::new();
                for (index, fault) in source.check_health(&plugin.gpus_now(), 1000) {
                    if !fault.is_lost() {
                        last_xid.insert(index, Instant::now());
                    }
                    if plugin.mark_failed(index, &fault.to_string()) {
                        changes.push((index, Some(fault)));
                    }
                }
                let failed: Vec<u32> = plugin.failed.borrow().keys().copied().collect();
                for index in failed {
                    let held = last_xid
                        .get(&index)
                        .is_some_and(|t| recovery.xid_hold.is_none_or(|h| t.elapsed() < h));
                    if held || !source.answers(index) || !plugin.reread(source.as_ref(), index) {
                        continue;
                    }
                    if plugin.mark_recovered(index) {
                        last_xid.remove(&index);
                        changes.push((index, None));
                    }
                }
                let now = plugin.failed.borrow().clone();
                if now != published {
                    match rt.block_on(plugin.publish_health()) {
                        Ok(()) => published = now,
                        Err(e) => tracing::warn!("{e}; retrying"),
                    }
                }
                for (index, fault) in changes {
                    rt.block_on(plugin.gpu_event(index, fault));
                }
            }
        })
        .expect("spawn the GPU health thread");
}

/// One device per unit (GiB, or MiB on a MiB node) of the GPUs, numbered
/// GPU after GPU: the devices in a failed GPU's range are unhealthy, so the
/// kubelet offers that much less `aliyun.com/gpu-mem`.
pub fn mem_device_list(gpus: &[NodeGpu]) -> Vec<dp::Device> {
    let mut out = Vec::new();
    for g in gpus {
        for _ in 0..g.gib {
            out.push(dp::Device {
                id: format!("cgpu-mem-{}", out.len()),
                health: health(g).into(),
                topology: None,
            });
        }
    }
    out
}

/// The size of the `ListAndWatch` message listing `gpus`' memory devices.
pub fn list_message_len(gpus: &[NodeGpu]) -> usize {
    use prost::Message;
    dp::ListAndWatchResponse {
        devices: mem_device_list(gpus),
    }
    .encoded_len()
}

/// The largest gRPC message the kubelet's device-plugin client reads
/// (grpc-go's default receive limit).
pub const KUBELET_MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Name, in the allocation directory, of the file mounted on every GPU
/// container's `/etc/ld.so.preload`.
pub const LD_SO_PRELOAD: &str = "ld.so.preload";

/// Shared by the two plugin services.
pub struct Plugin {
    pub cfg: PluginConfig,
    pub client: Client,
    /// The extender's public key, once read.
    verifier: parking_lot::Mutex<Option<DecisionVerifier>>,
    pub node: NodeState,
    /// The GPUs unhealthy now (lost, or a critical XID error), with why.
    failed: tokio::sync::watch::Sender<BTreeMap<u32, String>>,
}

impl Plugin {
    /// Reads the node (labels), the GPUs (NVML), and publishes them on the
    /// node (annotation `cgpu.io/gpus`) for the scheduler extender.
    pub async fn new(
        cfg: PluginConfig,
        client: Client,
        gpus: &dyn GpuSource,
    ) -> Result<Plugin, String> {
        let nodes: Api<Node> = Api::all(client.clone());
        let node = nodes
            .get(&cfg.node_name)
            .await
            .map_err(|e| format!("cannot read node {}: {e}", cfg.node_name))?;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let stated = match labels.get(LABEL_NODE_GPU_MEM_DEV) {
            None => None,
            Some(v) => Some(v.trim().parse::<u64>().ok().filter(|&g| g > 0).ok_or_else(|| {
                format!("node label {LABEL_NODE_GPU_MEM_DEV}={v:?} is not a whole number of GiB")
            })?),
        };
        let share_only = labels.get(LABEL_NODE_SCHEDULE).map(String::as_str)
            == Some(NODE_SCHEDULE_SHARE_ONLY)
            || labels
                .get(LABEL_NODE_DISABLE_ISOLATION)
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let mib = unit_is_mib(labels.get(LABEL_NODE_MEM_UNIT).map(String::as_str))?;
        if mib && stated.is_some() {
            tracing::warn!(
                "node {}: {LABEL_NODE_GPU_MEM_DEV} does not apply on a node counting in MiB: each GPU offers its memory in MiB as NVML reports it",
                cfg.node_name
            );
        }
        let gpus = in_unit(gpus.gpus(stated)?, mib);
        // The GPUs for the extender, and model and memory as labels for
        // node selectors and affinities.
        let mut models: Vec<String> = gpus
            .iter()
            .map(|g| label_value(&g.model))
            .filter(|m| !m.is_empty())
            .collect();
        models.dedup();
        let model = match models.as_slice() {
            [] => Value::Null,
            [one] => Value::String(one.clone()),
            _ => Value::String("mixed".into()),
        };
        let memory = gpus
            .iter()
            .map(|g| g.memory_mib)
            .min()
            .map_or(Value::Null, |m| Value::String(m.to_string()));
        let patch = serde_json::json!({"metadata": {
            "annotations": {ANN_NODE_GPUS: serde_json::to_string(&gpus).expect("GPUs serialise")},
            "labels": {LABEL_NODE_GPU_MODEL: model, LABEL_NODE_GPU_MEMORY: memory}}});
        nodes
            .patch(
                &cfg.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| format!("cannot publish the GPUs on node {}: {e}", cfg.node_name))?;
        // Every GPU container gets the library through /etc/ld.so.preload
        // too, so a program that clears LD_PRELOAD still loads it.
        write_file_atomically(
            &cfg.alloc_dir.join(LD_SO_PRELOAD),
            format!("{}\n", cfg.library_in_container.display()).as_bytes(),
        )
        .map_err(|e| {
            format!(
                "cannot write {}: {e}",
                cfg.alloc_dir.join(LD_SO_PRELOAD).display()
            )
        })?;
        let verifier = match DecisionVerifier::load(&client).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!("{e}; read again at the next container start");
                None
            }
        };
        let failed = gpus
            .iter()
            .filter(|g| g.unhealthy)
            .map(|g| (g.index, Fault::Lost.to_string()))
            .collect();
        Ok(Plugin {
            cfg,
            client,
            verifier: parking_lot::Mutex::new(verifier),
            node: NodeState {
                gpus: parking_lot::RwLock::new(gpus),
                stated_gib: stated,
                mib,
                share_only,
            },
            failed: tokio::sync::watch::channel(failed).0,
        })
    }

    /// The node's GPUs, each marked unhealthy once it failed.
    pub fn gpus_now(&self) -> Vec<NodeGpu> {
        let failed = self.failed.borrow();
        self.node
            .gpus
            .read()
            .iter()
            .map(|g| NodeGpu {
                unhealthy: g.unhealthy || failed.contains_key(&g.index),
                ..g.clone()
            })
            .collect()
    }

    /// Records GPU `index` as failed; true when it was healthy until now.
    pub fn mark_failed(&self, index: u32, why: &str) -> bool {
        self.failed.send_if_modified(|f| {
            if f.contains_key(&index) || !self.node.gpus.read().iter().any(|g| g.index == index) {
                return false;
            }
            tracing::error!(
                "GPU{index} failed ({why}): its devices are unhealthy, no new pod is placed on it"
            );
            f.insert(index, why.to_string());
            true
        })
    }

    /// Records GPU `index` as healthy again; true when it was failed.
    pub fn mark_recovered(&self, index: u32) -> bool {
        self.failed.send_if_modified(|f| {
            let Some(why) = f.remove(&index) else {
                return false;
            };
            tracing::warn!(
                "GPU{index} is healthy again (it had failed: {why}): its devices take pods again"
            );
            true
        })
    }

    /// Reads GPU `index` again when the plugin started without knowing it
    /// (it was lost then); true when it is known now.
    pub fn reread(&self, source: &dyn GpuSource, index: u32) -> bool {
        let known = |gpus: &[NodeGpu]| gpus.iter().any(|g| g.index == index && !g.uuid.is_empty());
        if known(&self.node.gpus.read()) {
            return true;
        }
        let fresh = match source.gpus(self.node.stated_gib) {
            Ok(all) => in_unit(all, self.node.mib)
                .into_iter()
                .find(|g| g.index == index && !g.unhealthy),
            Err(e) => {
                tracing::warn!("GPU{index} answers again but cannot be read: {e}");
                None
            }
        };
        let Some(fresh) = fresh else {
            return false;
        };
        let mut gpus = self.node.gpus.write();
        if let Some(g) = gpus.iter_mut().find(|g| g.index == index) {
            *g = fresh;
        }
        known(&gpus)
    }

    /// An event on the node: GPU `index` failed (`Some(fault)`, a Warning)
    /// or is healthy again (`None`, Normal).
    pub async fn gpu_event(&self, index: u32, fault: Option<Fault>) {
        let uuid = self
            .node
            .gpus
            .read()
            .iter()
            .find(|g| g.index == index)
            .map(|g| g.uuid.clone())
            .filter(|u| !u.is_empty())
            .map(|u| format!(" ({u})"))
            .unwrap_or_default();
        let (reason, type_, message) = match fault {
            Some(f) => (
                EVENT_REASON_GPU_UNHEALTHY,
                "Warning",
                format!("GPU{index}{uuid} failed: {f}; no new pod is placed on it"),
            ),
            None => (
                EVENT_REASON_GPU_HEALTHY,
                "Normal",
                format!("GPU{index}{uuid} is healthy again; it takes new pods"),
            ),
        };
        let uid = Api::<Node>::all(self.client.clone())
            .get(&self.cfg.node_name)
            .await
            .ok()
            .and_then(|n| n.metadata.uid);
        let obj = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.cfg.node_name.clone()),
            uid,
            ..Default::default()
        };
        // Node events live in the default namespace, as the kubelet's do.
        self.record_event("default", obj, reason, type_, &message, "GpuHealth")
            .await;
    }

    /// Publishes the GPUs with their health on the node (annotation
    /// `cgpu.io/gpus`), for the scheduler extender and `kubectl inspect`.
    pub async fn publish_health(&self) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let gpus = serde_json::to_string(&self.gpus_now()).expect("GPUs serialise");
        let patch = serde_json::json!({"metadata": {"annotations": {ANN_NODE_GPUS: gpus}}});
        nodes
            .patch(
                &self.cfg.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "cannot publish the GPUs' health on node {}: {e}",
                    self.cfg.node_name
                )
            })
    }

    /// The extender's public key: the one read before, or read now (also
    /// again when `reload`, after a signature failed: the key may have
    /// been rotated).
    async fn verifier(&self, reload: bool) -> Result<DecisionVerifier, String> {
        if !reload {
            if let Some(v) = self.verifier.lock().clone() {
                return Ok(v);
            }
        }
        let v = DecisionVerifier::load(&self.client).await?;
        *self.verifier.lock() = Some(v.clone());
        Ok(v)
    }

    /// The node's `aliyun.com/gpu-mem` devices now (see [`mem_device_list`]).
    fn mem_devices(&self) -> Vec<dp::Device> {
        mem_device_list(&self.gpus_now())
    }

    /// Why the kubelet cannot read this node's `aliyun.com/gpu-mem` device
    /// list, if it cannot: the kubelet's gRPC client takes messages of at
    /// most 4 MiB, and a node counting in MiB lists one device per MiB.
    pub fn device_list_too_large(&self) -> Option<String> {
        let n = list_message_len(&self.gpus_now());
        (n > KUBELET_MAX_MESSAGE).then(|| {
            format!(
                "the {RESOURCE_GPU_MEM} device list is {n} bytes, more than the {KUBELET_MAX_MESSAGE} \
                 the kubelet reads in one message: it will not see this node's devices. Count this \
                 node in GiB (remove the label {LABEL_NODE_MEM_UNIT})"
            )
        })
    }

    fn count_devices(&self) -> Vec<dp::Device> {
        self.gpus_now()
            .iter()
            .map(|g| dp::Device {
                id: format!("cgpu-gpu-{}", g.index),
                health: health(g).into(),
                topology: None,
            })
            .collect()
    }

    fn container_response(&self, ids: &[String]) -> dp::ContainerAllocateResponse {
        let c = &self.cfg;
        let file = alloc_file_name(ids);
        let envs = BTreeMap::from([
            (
                "LD_PRELOAD".to_string(),
                c.library_in_container.display().to_string(),
            ),
            (
                ENV_ALLOC_FILE.to_string(),
                c.alloc_file_in_container.display().to_string(),
            ),
            (
                "CGPU_LEDGER_DIR".to_string(),
                c.ledger_in_container.display().to_string(),
            ),
            // The pod, and so its GPUs, is known only at PreStartContainer.
            // The GPUs reach the runtime through the CDI device named below,
            // whose spec is written then and read by the runtime when it
            // creates the container (after PreStartContainer); its
            // NVIDIA_VISIBLE_DEVICES replaces this `none`, which is what a
            // container gets if no spec was written: no GPU.
            (
                "NVIDIA_VISIBLE_DEVICES".to_string(),
                if c.expose_all_gpus { "all" } else { "none" }.to_string(),
            ),
        ]);
        let mounts = vec![
            dp::Mount {
                container_path: c.library_in_container.display().to_string(),
                host_path: c.library_on_host.display().to_string(),
                read_only: true,
            },
            // Secure mode: read-only (the agent's socket in it can still
            // be connected to; a read-only mount forbids writing files).
            dp::Mount {
                container_path: c.ledger_in_container.display().to_string(),
                host_path: c.ledger_on_host.display().to_string(),
                read_only: c.secure,
            },
            dp::Mount {
                container_path: c.alloc_file_in_container.display().to_string(),
                host_path: c.alloc_dir_on_host.join(&file).display().to_string(),
                read_only: true,
            },
            dp::Mount {
                container_path: "/etc/ld.so.preload".into(),
                host_path: c
                    .alloc_dir_on_host
                    .join(LD_SO_PRELOAD)
                    .display()
                    .to_string(),
                read_only: true,
            },
        ];
        let cdi_devices = if c.expose_all_gpus {
            Vec::new()
        } else {
            vec![dp::CdiDevice {
                name: cdi_name(ids).0,
            }]
        };
        dp::ContainerAllocateResponse {
            envs: envs.into_iter().collect(),
            mounts,
            devices: Vec::new(),
            annotations: Default::default(),
            cdi_devices,
        }
    }

    /// Who owns these device ids, by the kubelet's records.
    ///
    /// PodResources lists app containers (and sidecars) with their device
    /// ids; an exact match names the container. Plain init containers are
    /// not listed, but the kubelet hands their devices on to the pod's later
    /// containers, and device ids belong to one pod at a time: ids shared
    /// with a listed container name the pod, and the pod's init container
    /// asking for exactly that many GiB names the container.
    async fn owner(&self, ids: &[String]) -> Result<(String, String, String), String> {
        let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
        want.sort_unstable();
        let channel = uds_channel(&self.cfg.pod_resources_socket)
            .await
            .map_err(|e| format!("cannot reach the kubelet's PodResources API: {e}"))?;
        let mut client = pr::pod_resources_lister_client::PodResourcesListerClient::new(channel);
        let list = client
            .list(pr::ListPodResourcesRequest {})
            .await
            .map_err(|e| format!("PodResources List failed: {e}"))?
            .into_inner();
        let mut sharing: Option<(String, String)> = None;
        for pod in &list.pod_resources {
            for c in &pod.containers {
                for d in c
                    .devices
                    .iter()
                    .filter(|d| d.resource_name == RESOURCE_GPU_MEM)
                {
                    let mut have: Vec<&str> = d.device_ids.iter().map(String::as_str).collect();
                    have.sort_unstable();
                    if have == want {
                        return Ok((pod.namespace.clone(), pod.name.clone(), c.name.clone()));
                    }
                    if have.iter().any(|h| want.binary_search(h).is_ok()) {
                        sharing = Some((pod.namespace.clone(), pod.name.clone()));
                    }
                }
            }
        }
        let not_listed = || {
            format!(
                "the kubelet lists no container holding {RESOURCE_GPU_MEM} devices {}",
                ids.join(",")
            )
        };
        let (ns, name) = sharing.ok_or_else(not_listed)?;
        let pod = Api::<Pod>::namespaced(self.client.clone(), &ns)
            .get(&name)
            .await
            .map_err(|e| format!("cannot read pod {ns}/{name}: {e}"))?;
        let pod = to_value(&pod);
        let req = cgpu_cluster_core::decision::pod_request(&pod)?;
        let init = req
            .containers
            .iter()
            .find(|c| c.init && c.mem == ids.len() as u64)
            .ok_or_else(not_listed)?;
        Ok((ns, name, init.name.clone()))
    }

    /// Checks the pod's decision and returns what the container gets.
    pub async fn resolve(&self, ids: &[String]) -> Result<(String, ContainerAlloc), String> {
        let owner = self.owner(ids).await?;
        self.resolve_for(&owner, ids)
            .await
            .map(|(pod, _, alloc)| (pod, alloc))
    }

    /// As [`Plugin::resolve`] for a known owner; also gives the pod's uid.
    async fn resolve_for(
        &self,
        (ns, name, container): &(String, String, String),
        ids: &[String],
    ) -> Result<(String, String, ContainerAlloc), String> {
        let (ns, name, container) = (ns.as_str(), name.as_str(), container.as_str());
        let who = format!("{ns}/{name} container {container}");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let pod = pods
            .get(name)
            .await
            .map_err(|e| format!("cannot read pod {ns}/{name}: {e}"))?;
        let pod = to_value(&pod);
        let d = Decision::from_pod(&pod).ok_or_else(|| {
            format!(
                "{who}: the pod holds no decision from cgpu-scheduler-extender ({ANN_ALLOCATION}); \
                 it was scheduled without it, so it gets no GPU memory. Check that the scheduler \
                 configuration names the extender for {RESOURCE_GPU_MEM}"
            )
        })?;
        let mut verifier = self.verifier(false).await?;
        if !verifier.verify(&d) {
            verifier = self.verifier(true).await?;
        }
        if !verifier.verify(&d) {
            return Err(format!(
                "{who}: the decision in {ANN_ALLOCATION} is not signed by cgpu-scheduler-extender \
                 (written by hand or altered); it gets no GPU memory"
            ));
        }
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
        if d.pod_uid != uid {
            return Err(format!(
                "{who}: the decision was made for pod uid {}, not this pod ({uid})",
                d.pod_uid
            ));
        }
        if d.node != self.cfg.node_name {
            return Err(format!(
                "{who}: the decision is for node {}, not {}",
                d.node, self.cfg.node_name
            ));
        }
        if d.mib != self.node.mib {
            let unit = |m: bool| if m { "MiB" } else { "GiB" };
            return Err(format!(
                "{who}: the decision counts GPU memory in {}, but node {} counts it in {} now \
                 ({LABEL_NODE_MEM_UNIT}); delete the pod to have it scheduled again",
                unit(d.mib),
                self.cfg.node_name,
                unit(self.node.mib)
            ));
        }
        let gpus_now = self.gpus_now();
        let mut uuids = Vec::new();
        for g in &d.gpus {
            let here = gpus_now
                .iter()
                .find(|n| n.index == g.index)
                .ok_or_else(|| {
                    format!(
                        "{who}: the decision names GPU{} but this node has {} GPUs",
                        g.index,
                        gpus_now.len()
                    )
                })?;
            if here.unhealthy {
                let why = self
                    .failed
                    .borrow()
                    .get(&g.index)
                    .cloned()
                    .unwrap_or_else(|| "it failed".into());
                return Err(format!(
                    "{who}: the decision places it on GPU{}, which is unhealthy now ({why}); \
                     the container is not started. Delete the pod to have it scheduled onto a \
                     healthy GPU, or wait until the GPU is healthy again",
                    g.index
                ));
            }
            if here.gib != d.gpu_gib {
                return Err(format!(
                    "{who}: the decision assumed GPU{} holds {} GiB; it holds {} GiB here",
                    g.index, d.gpu_gib, here.gib
                ));
            }
            if !g.uuid.is_empty() && g.uuid != here.uuid {
                // UUIDs change when a cloud instance is stopped and started;
                // the index and size are what the decision rests on.
                tracing::warn!(
                    "{who}: GPU{} was {} at scheduling, is {} now",
                    g.index,
                    g.uuid,
                    here.uuid
                );
            }
            uuids.push(here.uuid.clone());
        }
        let share = d.containers.get(container).copied().unwrap_or(0);
        let m = d.gpus.len() as u64;
        if share == 0 || share * m != ids.len() as u64 {
            return Err(format!(
                "{who}: the decision gives it {share} GiB on each of {m} GPUs, but the kubelet \
                 allocated {} GiB of {RESOURCE_GPU_MEM}",
                ids.len()
            ));
        }
        // Defence in depth: the node's signed decisions must fit its GPUs.
        let all = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.cfg.node_name)))
            .await
            .map_err(|e| format!("cannot list the pods of node {}: {e}", self.cfg.node_name))?;
        // Only decisions that count: each names its own pod and this node
        // and verifies; a copy on another pod or a forged one adds nothing.
        let verify = |pd: &Decision| verifier.verify(pd);
        let mut used: BTreeMap<u32, u64> = BTreeMap::new();
        for p in all.items.iter().map(to_value) {
            if valid_decision(&p, &verify).is_some() {
                for (i, g) in pod_gpu_use(&p, &verify) {
                    *used.entry(i).or_default() += g;
                }
            }
        }
        for g in &gpus_now {
            let u = used.get(&g.index).copied().unwrap_or(0);
            if u > g.gib {
                return Err(format!(
                    "{who}: GPU{} of node {} is over-committed ({u}/{} GiB by signed decisions); refusing",
                    g.index, self.cfg.node_name, g.gib
                ));
            }
        }
        let alloc = ContainerAlloc {
            container_id: container_id(ns, name, container),
            mem_per_gpu: vec![share; d.gpus.len()],
            mem_dev: d.gpu_gib,
            visible_uuids: uuids,
            disable: self.node.share_only,
            gpu_indices: d.gpus.iter().map(|g| g.index).collect(),
            pod_total: d.per_gpu * m,
            high_prio: pod["metadata"]["annotations"][ANN_HIGH_PRIORITY]
                .as_str()
                .is_some_and(|v| v.trim() == "true" || v.trim() == "1"),
            weight: self.weight(&d, &pod, &who)?,
            mib: d.mib,
        };
        Ok((format!("{ns}/{name}"), uid.to_string(), alloc))
    }

    /// The weight each GPU container of the pod gets from the compute
    /// share in its signed decision (see [`compute_weight`]).
    fn weight(&self, d: &Decision, pod: &Value, who: &str) -> Result<Option<u32>, String> {
        if d.compute == 0 {
            return Ok(None);
        }
        let req = pod_request(pod).map_err(|e| format!("{who}: {e}"))?;
        compute_weight(d.compute, &req)
            .map(Some)
            .map_err(|e| format!("{who}: {e}"))
    }

    /// `PreStartContainer`: resolve, check, write the container's file.
    pub async fn pre_start(&self, ids: &[String]) -> Result<(), String> {
        let path = self.cfg.alloc_dir.join(alloc_file_name(ids));
        // The kubelet gives PreStartContainer 30 s; answer within them,
        // with a reason, even when the API server or kubelet is slow.
        let limit = Duration::from_secs(25);
        let slow = || format!("no answer from the kubelet or the API server within {limit:?}");
        let owner = tokio::time::timeout(limit, self.owner(ids))
            .await
            .unwrap_or_else(|_| Err(slow()));
        let result = match &owner {
            Ok(o) => tokio::time::timeout(limit, self.resolve_for(o, ids))
                .await
                .unwrap_or_else(|_| Err(slow())),
            Err(e) => Err(e.clone()),
        };
        match result {
            Ok((pod, uid, alloc)) => {
                write_file_atomically(&path, alloc.to_file().as_bytes())
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                if self.cfg.secure {
                    // The same settings, for the agent, under the name it
                    // finds from the container's own bind.
                    let container = owner.as_ref().map(|o| o.2.as_str()).unwrap_or("");
                    let host = self
                        .cfg
                        .settings_dir
                        .join(settings_file_name(&uid, container));
                    write_file_atomically(&host, alloc.to_file().as_bytes())
                        .map_err(|e| format!("cannot write {}: {e}", host.display()))?;
                }
                if !self.cfg.expose_all_gpus {
                    let spec = self.cfg.cdi_dir.join(cdi_name(ids).1);
                    write_file_atomically(&spec, cdi_spec(ids, &alloc).as_bytes())
                        .map_err(|e| format!("cannot write {}: {e}", spec.display()))?;
                }
                tracing::info!(
                    "{pod}: {} gets {:?} GiB on {:?}",
                    alloc.container_id,
                    alloc.mem_per_gpu,
                    alloc.visible_uuids
                );
                if let Some((ns, name)) = pod.split_once('/') {
                    let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                    let patch = serde_json::json!({"metadata": {"annotations": {ANN_GPUSHARE_ASSIGNED: "true"}}});
                    if let Err(e) = pods
                        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        tracing::warn!("{pod}: cannot mark it assigned: {e}");
                    }
                }
                Ok(())
            }
            Err(e) => {
                // A stale file from an earlier start must not hand out memory
                // (nor GPUs: without its CDI spec the container is not created).
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(self.cfg.cdi_dir.join(cdi_name(ids).1));
                // A host settings file from an earlier start stays until the
                // pod is gone: it gives nothing to a container that is not
                // started.
                tracing::error!("{e}");
                if let Ok((ns, name, _)) = &owner {
                    self.event(ns, name, &e).await;
                }
                Err(e)
            }
        }
    }
}

impl Plugin {
    /// A Warning event on the pod saying why its container got no GPU
    /// memory (besides the kubelet's own report of the failed start).
    async fn event(&self, ns: &str, pod: &str, message: &str) {
        let uid = Api::<Pod>::namespaced(self.client.clone(), ns)
            .get(pod)
            .await
            .ok()
            .and_then(|p| p.metadata.uid);
        let obj = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.to_string()),
            namespace: Some(ns.to_string()),
            uid,
            ..Default::default()
        };
        self.record_event(
            ns,
            obj,
            EVENT_REASON_REFUSED,
            "Warning",
            message,
            "PreStartContainer",
        )
        .await;
    }

    async fn record_event(
        &self,
        ns: &str,
        obj: ObjectReference,
        reason: &str,
        type_: &str,
        message: &str,
        action: &str,
    ) {
        let events: Api<Event> = Api::namespaced(self.client.clone(), ns);
        let now = k8s_openapi::jiff::Timestamp::now();
        let nanos = now.as_nanosecond();
        let about = obj.name.clone().unwrap_or_default();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!("{about}.cgpu.{nanos:x}")),
                namespace: Some(ns.to_string()),
                ..Default::default()
            },
            involved_object: obj,
            reason: Some(reason.into()),
            message: Some(message.to_string()),
            type_: Some(type_.into()),
            source: Some(EventSource {
                component: Some(COMPONENT_DEVICE_PLUGIN.into()),
                host: Some(self.cfg.node_name.clone()),
            }),
            reporting_component: Some(COMPONENT_DEVICE_PLUGIN.into()),
            reporting_instance: Some(self.cfg.node_name.clone()),
            count: Some(1),
            // `kubectl describe` shows the age from these.
            event_time: Some(MicroTime(now)),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            action: Some(action.into()),
            ..Default::default()
        };
        if let Err(e) = events.create(&PostParams::default(), &ev).await {
            tracing::warn!("cannot record an event on {ns}/{about}: {e}");
        }
    }
}

impl Plugin {
    /// Removes allocation files no container listed by the kubelet holds
    /// (pods gone while the plugin was down). A running container keeps
    /// the file it has mounted; a container started again gets its file
    /// written again at `PreStartContainer`. Returns how many were removed.
    pub async fn clean_alloc_dir(&self) -> Result<usize, String> {
        let channel = uds_channel(&self.cfg.pod_resources_socket)
            .await
            .map_err(|e| format!("cannot reach the kubelet's PodResources API: {e}"))?;
        let list = pr::pod_resources_lister_client::PodResourcesListerClient::new(channel)
            .list(pr::ListPodResourcesRequest {})
            .await
            .map_err(|e| format!("PodResources List failed: {e}"))?
            .into_inner();
        let held: Vec<&Vec<String>> = list
            .pod_resources
            .iter()
            .flat_map(|p| p.containers.iter())
            .flat_map(|c| c.devices.iter())
            .filter(|d| d.resource_name == RESOURCE_GPU_MEM)
            .map(|d| &d.device_ids)
            .collect();
        let keep: Vec<String> = held
            .iter()
            .flat_map(|ids| [alloc_file_name(ids), cdi_name(ids).1])
            .collect();
        let mut removed = 0;
        for (dir, ours) in [
            (
                &self.cfg.alloc_dir,
                (|n: &str| n.ends_with(".env")) as fn(&str) -> bool,
            ),
            (&self.cfg.cdi_dir, |n: &str| {
                n.starts_with("cgpu-") && n.ends_with(".json")
            }),
        ] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if ours(&name) && !keep.contains(&name) && std::fs::remove_file(e.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

impl Plugin {
    /// Secure mode: removes the host settings files this plugin wrote for
    /// containers of pods that are gone (no longer on this node by the API
    /// server, or finished). Files the operator wrote (not named
    /// `k8s-…`) are never touched. Returns how many were removed.
    pub async fn clean_settings_dir(&self) -> Result<usize, String> {
        if !self.cfg.secure {
            return Ok(0);
        }
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.cfg.node_name)))
            .await
            .map_err(|e| format!("cannot list the pods of node {}: {e}", self.cfg.node_name))?;
        let mut keep = std::collections::BTreeSet::new();
        for p in pods.items.iter().map(to_value) {
            let phase = p["status"]["phase"].as_str().unwrap_or("");
            if phase == "Succeeded" || phase == "Failed" {
                continue;
            }
            let uid = p["metadata"]["uid"].as_str().unwrap_or("");
            for list in ["containers", "initContainers"] {
                for c in p["spec"][list].as_array().into_iter().flatten() {
                    if let Some(name) = c["name"].as_str() {
                        keep.insert(settings_file_name(uid, name));
                    }
                }
            }
        }
        let Ok(entries) = std::fs::read_dir(&self.cfg.settings_dir) else {
            return Ok(0);
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(SETTINGS_PREFIX)
                && name.ends_with(".env")
                && !keep.contains(&name)
                && std::fs::remove_file(e.path()).is_ok()
            {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Cleans the settings directory now and then every `every`.
    pub fn spawn_settings_cleaner(self: &Arc<Self>, every: Duration) {
        if !self.cfg.secure {
            return;
        }
        let plugin = self.clone();
        tokio::spawn(async move {
            loop {
                match plugin.clean_settings_dir().await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!("removed {n} host settings files of pods that are gone")
                    }
                    Err(e) => tracing::warn!("host settings files not cleaned: {e}"),
                }
                tokio::time::sleep(every).await;
            }
        });
    }
}

/// Reason of the Warning event on a pod whose container was refused GPU memory.
pub const EVENT_REASON_REFUSED: &str = "CgpuAllocationRefused";

fn write_file_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o444))?;
    std::fs::rename(&tmp, path)
}

/// A gRPC channel over a Unix socket.
pub async fn uds_channel(
    path: &Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://[::1]:1")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}

/// One registered resource: `aliyun.com/gpu-mem` or `aliyun.com/gpu-count`.
#[derive(Clone)]
pub struct Service {
    plugin: Arc<Plugin>,
    mem: bool,
    /// Becomes true when this server stops (the kubelet restarted): the
    /// device stream then ends, so the server's graceful stop completes.
    stopping: tokio::sync::watch::Receiver<bool>,
}

type DeviceStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(dp::DevicePluginOptions {
            pre_start_required: self.mem,
            get_preferred_allocation_available: false,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<DeviceStream>, Status> {
        // The list now, then again whenever a GPU fails; the stream stays
        // open (the kubelet treats its end as the plugin going away) until
        // this server stops.
        let plugin = self.plugin.clone();
        let mem = self.mem;
        let failed = self.plugin.failed.subscribe();
        let stopping = self.stopping.clone();
        let stream = futures::stream::unfold(
            (plugin, failed, stopping, true),
            move |(plugin, mut failed, mut stopping, first)| async move {
                if !first {
                    tokio::select! {
                        r = failed.changed() => r.ok()?,
                        _ = stopping.wait_for(|s| *s) => return None,
                    }
                }
                failed.borrow_and_update();
                let devices = if mem {
                    plugin.mem_devices()
                } else {
                    plugin.count_devices()
                };
                Some((
                    Ok(dp::ListAndWatchResponse { devices }),
                    (plugin, failed, stopping, false),
                ))
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        Ok(Response::new(dp::PreferredAllocationResponse::default()))
    }

    async fn allocate(
        &self,
        req: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let req = req.into_inner();
        let container_responses = req
            .container_requests
            .iter()
            .map(|c| {
                if self.mem {
                    self.plugin.container_response(&c.devices_ids)
                } else {
                    dp::ContainerAllocateResponse::default()
                }
            })
            .collect();
        Ok(Response::new(dp::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        req: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        if !self.mem {
            return Ok(Response::new(dp::PreStartContainerResponse {}));
        }
        let ids = req.into_inner().devices_ids;
        self.plugin
            .pre_start(&ids)
            .await
            .map(|()| Response::new(dp::PreStartContainerResponse {}))
            .map_err(Status::failed_precondition)
    }
}

fn inode(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| m.ino())
}

/// Serves both resources and registers them with the kubelet; serves and
/// registers again whenever the kubelet restarts (its socket is recreated,
/// or it removed ours). Returns only if `stop` resolves.
pub async fn run(plugin: Arc<Plugin>, stop: impl std::future::Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let kubelet_sock = plugin.cfg.plugin_dir.join("kubelet.sock");
    loop {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut servers = Vec::new();
        for (mem, sock) in [(true, MEM_SOCKET), (false, COUNT_SOCKET)] {
            let path = plugin.cfg.plugin_dir.join(sock);
            let _ = std::fs::remove_file(&path);
            let listener = match tokio::net::UnixListener::bind(&path) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!("cannot listen on {}: {e}; retrying", path.display());
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let svc = Service {
                plugin: plugin.clone(),
                mem,
                stopping: rx.clone(),
            };
            // Each connection passes through the relay that accepts any
            // :authority (see crate::h2_authority).
            let incoming = futures::StreamExt::map(UnixListenerStream::new(listener), |conn| {
                conn.map(|unix| {
                    let (ours, theirs) = tokio::io::duplex(64 * 1024);
                    tokio::spawn(crate::h2_authority::relay(
                        unix,
                        theirs,
                        crate::h2_authority::accept_any_authority,
                    ));
                    ours
                })
            });
            let mut rx = rx.clone();
            servers.push(tokio::spawn(async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(dp::device_plugin_server::DevicePluginServer::new(svc))
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = rx.changed().await;
                    })
                    .await;
            }));
        }
        let registered = register_all(&plugin.cfg.plugin_dir).await;
        if let Err(e) = &registered {
            tracing::warn!("registration with the kubelet failed: {e}; retrying");
        }
        let kubelet_ino = inode(&kubelet_sock);
        // Watch for a kubelet restart (or a failed registration to retry).
        let restart = async {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let ours_gone = [MEM_SOCKET, COUNT_SOCKET]
                    .iter()
                    .any(|s| !plugin.cfg.plugin_dir.join(s).exists());
                let kubelet_new = inode(&kubelet_sock) != kubelet_ino;
                if ours_gone || kubelet_new || registered.is_err() {
                    if registered.is_err() {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    return;
                }
            }
        };
        let stopped = tokio::select! {
            _ = restart => false,
            _ = &mut stop => true,
        };
        let _ = tx.send(true);
        for s in servers {
            // A client that keeps a connection open must not hold us up.
            let abort = s.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), s)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        if stopped {
            return;
        }
        tracing::info!(
            "the kubelet restarted (or registration failed): serving and registering again"
        );
    }
}

async fn register_all(dir: &Path) -> Result<(), String> {
    let channel = uds_channel(&dir.join("kubelet.sock")).await.map_err(|e| {
        format!(
            "cannot reach the kubelet at {}: {e}",
            dir.join("kubelet.sock").display()
        )
    })?;
    let mut client = dp::registration_client::RegistrationClient::new(channel);
    for (mem, sock, resource) in [
        (true, MEM_SOCKET, RESOURCE_GPU_MEM),
        (false, COUNT_SOCKET, RESOURCE_GPU_COUNT),
    ] {
        client
            .register(dp::RegisterRequest {
                version: "v1beta1".into(),
                endpoint: sock.into(),
                resource_name: resource.into(),
                options: Some(dp::DevicePluginOptions {
                    pre_start_required: mem,
                    get_preferred_allocation_available: false,
                }),
            })
            .await
            .map_err(|e| format!("Register {resource}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings file's name is the ledger key the agent computes from
    /// what the kernel shows of the container's process: the kubelet's
    /// per-container bind, with or without a container id in its cgroup.
    #[test]
    fn settings_file_names_are_the_agents_keys() {
        use cgpu_ledger::identity::{resolve, Facts, Source};
        let uid = "0f6c1b7e-5a1d-4c1e-9b57-3c2f8a1d9e10";
        let mountinfo = format!(
            "2391 2382 259:1 /var/lib/kubelet/pods/{uid}/containers/cuda/4a7b9c2e \
             /dev/termination-log rw,relatime - ext4 /dev/nvme0n1p1 rw\n"
        );
        for cgroup in [
            "0::/\n".to_string(),
            format!(
                "0::/kubepods/pod{uid}/cri-containerd-{}.scope\n",
                "ab".repeat(32)
            ),
        ] {
            let id = resolve(&Facts {
                cgroup: Some(&cgroup),
                mountinfo: Some(&mountinfo),
                pidns: 4026532999,
                hostname: "pod-a",
                name: None,
            });
            assert_eq!(id.source, Source::Kubelet);
            assert_eq!(
                settings_file_name(uid, "cuda"),
                format!("k8s-{:016x}.env", id.key)
            );
        }
        assert_ne!(
            settings_file_name(uid, "cuda"),
            settings_file_name(uid, "cud")
        );
    }

    #[test]
    fn alloc_file_name_ignores_order() {
        let a = alloc_file_name(&["cgpu-mem-3".into(), "cgpu-mem-1".into()]);
        let b = alloc_file_name(&["cgpu-mem-1".into(), "cgpu-mem-3".into()]);
        assert_eq!(a, b);
        assert_ne!(a, alloc_file_name(&["cgpu-mem-1".into()]));
        assert!(a.ends_with(".env") && a.len() == 24 + 4);
    }

    #[test]
    fn node_units() {
        assert_eq!(unit_is_mib(None), Ok(false));
        assert_eq!(unit_is_mib(Some("GiB")), Ok(false));
        assert_eq!(unit_is_mib(Some(" mib ")), Ok(true));
        let e = unit_is_mib(Some("MB")).unwrap_err();
        assert!(
            e.contains("cgpu.io/gpu-mem-unit=\"MB\" is neither GiB nor MiB"),
            "{e}"
        );
        let g = NodeGpu {
            index: 0,
            uuid: "GPU-a".into(),
            memory_mib: 15109,
            gib: 15,
            model: String::new(),
            unhealthy: false,
            mib: false,
        };
        assert_eq!(in_unit(vec![g.clone()], false), vec![g.clone()]);
        let m = in_unit(vec![g.clone()], true);
        assert_eq!((m[0].gib, m[0].mib), (15109, true));
        // Two T4s in MiB fit the kubelet's message; two 80 GiB GPUs do not.
        assert!(list_message_len(&[m[0].clone(), m[0].clone()]) < KUBELET_MAX_MESSAGE);
        let big = in_unit(
            vec![NodeGpu {
                memory_mib: 81920,
                ..g
            }],
            true,
        );
        assert!(list_message_len(&[big[0].clone(), big[0].clone()]) > KUBELET_MAX_MESSAGE);
    }

    #[test]
    fn xid_hold_values() {
        let secs = |n| Ok(Some(Duration::from_secs(n)));
        assert_eq!(Recovery::parse_xid_hold("300"), secs(300));
        assert_eq!(Recovery::parse_xid_hold(" 45s "), secs(45));
        assert_eq!(Recovery::parse_xid_hold("5m"), secs(300));
        assert_eq!(Recovery::parse_xid_hold("0"), secs(0));
        assert_eq!(Recovery::parse_xid_hold("never"), Ok(None));
        for bad in ["", "5h", "-1", "1.5m", "forever", "m"] {
            let e = Recovery::parse_xid_hold(bad).unwrap_err();
            assert!(e.contains("is not a hold time"), "{e}");
        }
        assert_eq!(Recovery::default().xid_hold, Some(DEFAULT_XID_HOLD));
    }

    #[test]
    fn container_ids_fit_the_ledger() {
        assert_eq!(container_id("default", "tf", "main"), "default/tf/main");
        let long = container_id("a-very-long-namespace-name", &"p".repeat(60), "main");
        assert_eq!(long.len(), 63);
        assert_ne!(
            long,
            container_id("a-very-long-namespace-name", &"p".repeat(60), "side")
        );
    }
}
