//! `cgpu-scheduler-extender`: the kube-scheduler extender for
//! `aliyun.com/gpu-mem` (filter, prioritize, bind; healthz, readyz, metrics).

use cgpu_cluster::extender::Extender;
use cgpu_cluster::{kube_io, signing::DecisionKey};
use cgpu_cluster_core::placement::Policy;
use std::process::ExitCode;

const USAGE: &str =
    "usage: cgpu-scheduler-extender [--listen ADDR:PORT] [--policy binpack|spread]\n\
  --listen   where to serve (default 0.0.0.0:32766; env CGPU_EXTENDER_LISTEN)\n\
  --policy   GPU choice on a node unless its label cgpu.io/gpu-policy says otherwise\n\
             (default binpack; env CGPU_GPU_POLICY)\n\
  The decision key is read from $CGPU_DECISION_KEY_FILE (default /etc/cgpu/decision-key/key);\n\
  its public key is published in the ConfigMap cgpu-decision-key of $CGPU_NAMESPACE (default kube-system).\n";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CGPU_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut listen =
        std::env::var("CGPU_EXTENDER_LISTEN").unwrap_or_else(|_| "0.0.0.0:32766".into());
    let mut policy = std::env::var("CGPU_GPU_POLICY").unwrap_or_else(|_| "binpack".into());
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().unwrap_or_default(),
            "--policy" => policy = args.next().unwrap_or_default(),
            "-h" | "--help" => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprint!("cgpu-scheduler-extender: unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(policy) = Policy::parse(&policy) else {
        eprintln!("cgpu-scheduler-extender: policy {policy:?} is neither binpack nor spread");
        return ExitCode::from(2);
    };
    let key = match DecisionKey::load() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("cgpu-scheduler-extender: {e}");
            return ExitCode::FAILURE;
        }
    };
    let client = match kube_io::client().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cgpu-scheduler-extender: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ext = Extender::new(client, key, policy);
    let ns = cgpu_cluster::signing::namespace();
    // Plugins verify decisions with the public key published here.
    if let Err(e) = ext.publish_public_key(&ns).await {
        eprintln!("cgpu-scheduler-extender: {e}");
        return ExitCode::FAILURE;
    }
    ext.spawn_watches();
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cgpu-scheduler-extender: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!("serving on {listen} (policy {})", policy.as_str());
    // Kubernetes stops a pod with SIGTERM.
    let shutdown = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    if let Err(e) = axum::serve(listener, ext.router())
        .with_graceful_shutdown(shutdown)
        .await
    {
        eprintln!("cgpu-scheduler-extender: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
