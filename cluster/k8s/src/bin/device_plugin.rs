//! `cgpu-device-plugin`: the kubelet device plugin for `aliyun.com/gpu-mem`
//! (runs on every GPU node, as a DaemonSet).

use cgpu_cluster::device_plugin::{self, Plugin, PluginConfig};
use cgpu_cluster::{kube_io, nvml::Nvml};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

const USAGE: &str = "usage: cgpu-device-plugin\n\
  Configured by environment:\n\
  NODE_NAME                  this node (from the downward API; required)\n\
  CGPU_NAMESPACE             where the extender publishes its public key (default kube-system)\n\
  CGPU_DECISION_PUBKEY_FILE  the extender's public key (hex), instead of its ConfigMap\n\
  CGPU_NVML_LIB              NVML to load (default libnvidia-ml.so.1)\n\
  CGPU_KUBELET_DIR           the kubelet's device-plugin directory (default /var/lib/kubelet/device-plugins)\n\
  CGPU_POD_RESOURCES_SOCKET  default /var/lib/kubelet/pod-resources/kubelet.sock\n\
  CGPU_LIBRARY               libcgpu.so on the node and in containers (default /opt/cgpu/libcgpu.so)\n\
  CGPU_LEDGER_DIR            the ledger directory on the node and in containers (default /run/cgpu)\n\
  CGPU_MODE                  secure: containers get the ledger directory read-only and the node agent\n\
                             (cgpu-agent --secure) their settings; cooperative (default): the library\n\
                             in each container writes the ledger itself\n\
  CGPU_SETTINGS_DIR          secure mode: where the agent reads each container's settings\n\
                             (default /etc/cgpu/containers; the plugin writes k8s-<key>.env there)\n\
  CGPU_ALLOC_DIR             allocation files (default /run/cgpu-alloc; outside the ledger directory)\n\
  CGPU_CDI_DIR               where the runtime reads CDI specs (default /var/run/cdi)\n\
  CGPU_EXPOSE_ALL_GPUS       true: NVIDIA_VISIBLE_DEVICES=all instead of each container's GPUs\n\
                             through CDI (runtimes without CDI)\n\
  CGPU_XID_HOLD              how long a GPU stays unhealthy after its last critical XID error\n\
                             before it takes pods again, if NVML still answers for it: seconds\n\
                             (300, 300s), minutes (5m) or never (until the plugin restarts);\n\
                             default 5m. A lost GPU is healthy again as soon as it answers.\n";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CGPU_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if std::env::args().nth(1).is_some() {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    }
    let Some(node) = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()) else {
        eprint!("cgpu-device-plugin: NODE_NAME is not set\n{USAGE}");
        return ExitCode::from(2);
    };
    let mut cfg = PluginConfig::standard(&node);
    let env_path = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env_path("CGPU_KUBELET_DIR") {
        cfg.plugin_dir = d;
    }
    if let Some(s) = env_path("CGPU_POD_RESOURCES_SOCKET") {
        cfg.pod_resources_socket = s;
    }
    if let Some(l) = env_path("CGPU_LIBRARY") {
        cfg.library_on_host = l.clone();
        cfg.library_in_container = l;
    }
    if let Some(l) = env_path("CGPU_LEDGER_DIR") {
        cfg.ledger_on_host = l.clone();
        cfg.ledger_in_container = l;
    }
    if let Some(d) = env_path("CGPU_CDI_DIR") {
        cfg.cdi_dir = d;
    }
    cfg.expose_all_gpus =
        std::env::var("CGPU_EXPOSE_ALL_GPUS").is_ok_and(|v| v == "true" || v == "1");
    match std::env::var("CGPU_MODE").unwrap_or_default().as_str() {
        "" | "cooperative" => cfg.secure = false,
        "secure" => cfg.secure = true,
        other => {
            eprint!("cgpu-device-plugin: CGPU_MODE={other:?}: secure or cooperative\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    if let Some(d) = env_path("CGPU_SETTINGS_DIR") {
        cfg.settings_dir = d;
    }
    if let Some(a) = env_path("CGPU_ALLOC_DIR") {
        cfg.alloc_dir = a.clone();
        cfg.alloc_dir_on_host = a;
    }
    let fail = |e: String| {
        eprintln!("cgpu-device-plugin: {e}");
        ExitCode::FAILURE
    };
    let mut recovery = device_plugin::Recovery::default();
    if let Some(v) = std::env::var("CGPU_XID_HOLD")
        .ok()
        .filter(|v| !v.is_empty())
    {
        match device_plugin::Recovery::parse_xid_hold(&v) {
            Ok(h) => recovery.xid_hold = h,
            Err(e) => return fail(format!("CGPU_XID_HOLD: {e}")),
        }
    }
    let nvml = match Nvml::load() {
        Ok(n) => n,
        Err(e) => return fail(e),
    };
    let client = match kube_io::client().await {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let nvml = Arc::new(nvml);
    let plugin = match Plugin::new(cfg, client, nvml.as_ref()).await {
        Ok(p) => Arc::new(p),
        Err(e) => return fail(e),
    };
    device_plugin::spawn_health_watch(plugin.clone(), nvml, recovery);
    if let Some(e) = plugin.device_list_too_large() {
        tracing::error!("{e}");
    }
    tracing::info!(
        "node {node}: {} GPUs, {} {} of {}",
        plugin.node.gpus.read().len(),
        plugin.node.gpus.read().iter().map(|g| g.gib).sum::<u64>(),
        if plugin.node.mib { "MiB" } else { "GiB" },
        cgpu_cluster_core::names::RESOURCE_GPU_MEM
    );
    match plugin.clean_alloc_dir().await {
        Ok(0) => {}
        Ok(n) => tracing::info!("removed {n} allocation files of containers that are gone"),
        Err(e) => tracing::warn!("allocation files not cleaned: {e}"),
    }
    // Secure mode: the host settings of pods that are gone are removed at
    // start and then every minute.
    plugin.spawn_settings_cleaner(std::time::Duration::from_secs(60));
    device_plugin::run(plugin, async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    })
    .await;
    ExitCode::SUCCESS
}
