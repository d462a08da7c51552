//! `kubectl inspect cgpu [-d] [--json]`: GPU memory allocated per node and GPU.

use cgpu_cluster::{inspect, kube_io};
use std::process::ExitCode;

const USAGE: &str = "usage: kubectl inspect cgpu [-d|--details] [--json]\n\
  Shows GPU memory (GiB) allocated and total per node and GPU, and for the cluster.\n\
  -d, --details   list the pods on each GPU\n\
  --json          print the same as JSON\n";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut details = false;
    let mut as_json = false;
    // kubectl passes the words after `inspect`: `cgpu` when run as
    // `kubectl inspect cgpu`, nothing when the binary is run directly.
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "cgpu" => {}
            "-d" | "--details" => details = true,
            "--json" | "-o=json" => as_json = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprint!("kubectl inspect cgpu: unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let result = async {
        let client = kube_io::client().await?;
        let nodes = kube_io::list_nodes(&client).await?;
        let pods = kube_io::list_pods(&client, None).await?;
        // Decisions count only with a signature the extender's public key
        // verifies; without the key, they are checked for pod and node only.
        let any = pods.iter().any(|p| {
            !p["metadata"]["annotations"][cgpu_cluster_core::names::ANN_ALLOCATION].is_null()
        });
        let verifier = if !any {
            None
        } else {
            match cgpu_cluster::signing::DecisionVerifier::load(&client).await {
                Ok(v) => Some(v),
                Err(e) => {
                    eprintln!("kubectl inspect cgpu: {e}; signatures not checked");
                    None
                }
            }
        };
        let verify = |d: &cgpu_cluster_core::decision::Decision| {
            verifier.as_ref().is_none_or(|v| v.verify(d))
        };
        Ok::<_, String>(inspect::view(&nodes, &pods, &verify))
    }
    .await;
    match result {
        Ok(v) if as_json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&v).expect("view serialises")
            );
            ExitCode::SUCCESS
        }
        Ok(v) => {
            print!(
                "{}",
                if details {
                    inspect::render_details(&v)
                } else {
                    inspect::render(&v)
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kubectl inspect cgpu: {e}");
            ExitCode::FAILURE
        }
    }
}
