//! Names that the cluster components, the interposer and the ecosystem's
//! tools share. Where Aliyun's gpushare / ACK already named a thing, the same
//! name is used, so `kubectl inspect cgpu` reads clusters that ran them.

/// Extended resource: GPU memory in whole GiB, the total over the pod's GPUs
/// (`resources.limits`), and on a node the sum over its GPUs (capacity).
pub const RESOURCE_GPU_MEM: &str = "aliyun.com/gpu-mem";
/// Extended resource on a node: how many GPUs it has.
pub const RESOURCE_GPU_COUNT: &str = "aliyun.com/gpu-count";
/// Pod label: over how many GPUs of one node its `gpu-mem` is split (a
/// string, default "1").
pub const LABEL_GPU_COUNT: &str = "aliyun.com/gpu-count";

/// Node label choosing how GPUs are shared (ACK's name). `share`: the
/// scheduler shares GPUs by memory but the containers are not isolated
/// (`CGPU_DISABLE=true`); `cgpu` (or absent): shared and isolated.
pub const LABEL_NODE_SCHEDULE: &str = "ack.node.gpu.schedule";
/// Value of [`LABEL_NODE_SCHEDULE`] for sharing without isolation.
pub const NODE_SCHEDULE_SHARE_ONLY: &str = "share";
/// Node label choosing the GPU policy on that node (`binpack`/`spread`).
pub const LABEL_NODE_POLICY: &str = "cgpu.io/gpu-policy";
/// ACK's node label for the same choice (read when ours is absent).
pub const LABEL_NODE_PLACEMENT_ACK: &str = "ack.node.gpu.placement";
/// gpushare's node label: `"true"` shares the node's GPUs without isolation
/// (as [`NODE_SCHEDULE_SHARE_ONLY`]).
pub const LABEL_NODE_DISABLE_ISOLATION: &str = "cgpu.disable.isolation";
/// Node label stating the size of each of its GPUs in GiB, for GPUs whose
/// MiB do not round down to the size operators count (a T4 has 15109 MiB,
/// which rounds to 14, sold as 15): the scheduler, the device plugin and the
/// interposer (`ALIYUN_COM_GPU_MEM_DEV`) then all use this number.
pub const LABEL_NODE_GPU_MEM_DEV: &str = "cgpu.io/gpu-mem-dev";
/// Node label choosing the unit the node's `aliyun.com/gpu-mem` counts in:
/// `GiB` (the default) or `MiB` (as gpushare's `--memory-unit=MiB`). On a
/// MiB node the plugin offers one device per MiB, pods ask for MiB, and a
/// container's quota is exactly what it asked for, in MiB.
pub const LABEL_NODE_MEM_UNIT: &str = "cgpu.io/gpu-mem-unit";

/// Pod annotation asking for a share of each of the pod's GPUs' compute, in
/// percent (`"30"`): the extender keeps every GPU's shares at or under 100.
pub const ANN_GPU_CORE: &str = "cgpu.io/gpu-core";
/// The time slices of a GPU (`max_inst`, the ledger's default) that a
/// compute share is counted in: a share of p % is a weight of
/// `floor(p * 16 / 100)`, so the smallest share is 7 %.
pub const GPU_CORE_SLICES: u32 = 16;

/// Pod annotations choosing GPUs by model or UUID (HAMi's names):
/// comma-separated model name parts (case-insensitive) or UUIDs.
pub const ANN_USE_GPUTYPE: &str = "nvidia.com/use-gputype";
pub const ANN_NOUSE_GPUTYPE: &str = "nvidia.com/nouse-gputype";
pub const ANN_USE_GPUUUID: &str = "nvidia.com/use-gpuuuid";
pub const ANN_NOUSE_GPUUUID: &str = "nvidia.com/nouse-gpuuuid";
/// Node labels the device plugin sets: its GPUs' model (spaces as `-`;
/// `mixed` when they differ) and the smallest GPU's memory in MiB.
pub const LABEL_NODE_GPU_MODEL: &str = "cgpu.io/gpu-model";
pub const LABEL_NODE_GPU_MEMORY: &str = "cgpu.io/gpu-memory-mib";

/// Node annotation the device plugin writes: the node's GPUs as NVML sees
/// them (JSON list of [`crate::decision::NodeGpu`]).
pub const ANN_NODE_GPUS: &str = "cgpu.io/gpus";

/// Pod annotation the scheduler extender writes at bind, before the Binding:
/// the whole decision ([`crate::decision::Decision`], signed).
pub const ANN_ALLOCATION: &str = "cgpu.io/allocation";
/// Pod annotation in ACK's format: `{"<container index>": {"<GPU index>": GiB}}`.
pub const ANN_ACK_ALLOCATION: &str = "scheduler.framework.gpushare.allocation";
/// gpushare's pod annotations: the GPU index (single-GPU pods), the pod's
/// GiB, whether the device plugin has handed it out, and when it was placed.
pub const ANN_GPUSHARE_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
pub const ANN_GPUSHARE_POD: &str = "ALIYUN_COM_GPU_MEM_POD";
pub const ANN_GPUSHARE_ASSIGNED: &str = "ALIYUN_COM_GPU_MEM_ASSIGNED";
pub const ANN_GPUSHARE_ASSUME_TIME: &str = "ALIYUN_COM_GPU_MEM_ASSUME_TIME";
/// gpushare's pod annotation: the size of the chosen GPU (its unit).
pub const ANN_GPUSHARE_DEV: &str = "ALIYUN_COM_GPU_MEM_DEV";

/// ConfigMap (in the extender's namespace) where the extender publishes the
/// public key its decisions verify with, under [`PUBKEY_DATA_KEY`] (hex).
pub const CONFIGMAP_DECISION_KEY: &str = "cgpu-decision-key";
pub const PUBKEY_DATA_KEY: &str = "ed25519.pub";
/// Namespace of the cluster components (the ConfigMap's), unless
/// `CGPU_NAMESPACE` says otherwise.
pub const DEFAULT_NAMESPACE: &str = "kube-system";

/// Pod annotation `"true"`: its containers run at high priority
/// (`ALIYUN_COM_GPU_HIGH_PRIO=1`).
pub const ANN_HIGH_PRIORITY: &str = "cgpu.io/high-priority";
pub const ENV_HIGH_PRIO: &str = "ALIYUN_COM_GPU_HIGH_PRIO";

/// Container environment (read by `libcgpu.so`).
pub const ENV_MEM_CONTAINER: &str = "ALIYUN_COM_GPU_MEM_CONTAINER";
pub const ENV_MEM_DEV: &str = "ALIYUN_COM_GPU_MEM_DEV";
/// The allocation file's quota per GPU in exact MiB (MiB nodes; the
/// library accepts it only from the allocation file or the host's settings).
pub const ENV_MEM_CONTAINER_MIB: &str = "CGPU_MEM_CONTAINER_MIB";
pub const ENV_VISIBLE_DEVICES: &str = "ALIYUN_COM_GPU_VISIBLE_DEVICES";
pub const ENV_CONTAINER_ID: &str = "CGPU_CONTAINER_ID";
pub const ENV_DISABLE: &str = "CGPU_DISABLE";
/// Path of the read-only file carrying the values known only after the
/// kubelet's `Allocate` (written by the device plugin at `PreStartContainer`).
pub const ENV_ALLOC_FILE: &str = "CGPU_ALLOC_FILE";

/// Name under which the extender's metrics and events appear.
pub const COMPONENT_EXTENDER: &str = "cgpu-scheduler-extender";
pub const COMPONENT_DEVICE_PLUGIN: &str = "cgpu-device-plugin";
