//! Decisions are signed by the scheduler extender with an Ed25519 key only
//! it holds, and checked everywhere they are counted (the extender's own
//! view, the device plugins, `kubectl inspect cgpu`) with the public key.
//! A device plugin therefore cannot mint a decision (a compromised node
//! cannot hand its pods more than the extender gave them), and a pod that
//! carries a decision written by hand, altered, or copied from another pod
//! gets no GPU memory and counts for nothing.
//!
//! The private key is derived from the Secret `cgpu-decision-key` (any 16
//! or more random bytes; the Ed25519 seed is their SHA-256). The extender
//! publishes the public key in the ConfigMap `cgpu-decision-key` of its
//! namespace, where plugins and `kubectl inspect cgpu` read it.

use cgpu_cluster_core::decision::Decision;
use cgpu_cluster_core::names::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use ring::signature::{self, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

/// The extender's signing key, read from the file named by
/// `CGPU_DECISION_KEY_FILE` (default `/etc/cgpu/decision-key/key`).
pub struct DecisionKey {
    pair: Ed25519KeyPair,
}

pub const ENV_KEY_FILE: &str = "CGPU_DECISION_KEY_FILE";
pub const DEFAULT_KEY_FILE: &str = "/etc/cgpu/decision-key/key";
/// A file holding the public key (hex) instead of reading the ConfigMap.
pub const ENV_PUBKEY_FILE: &str = "CGPU_DECISION_PUBKEY_FILE";

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The namespace of the cluster components (`CGPU_NAMESPACE`, else
/// `kube-system`).
pub fn namespace() -> String {
    std::env::var("CGPU_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string())
}

impl DecisionKey {
    pub fn from_bytes(secret: &[u8]) -> Result<DecisionKey, String> {
        if secret.len() < 16 {
            return Err(format!(
                "the decision key has {} bytes; it needs at least 16 (e.g. `head -c 32 /dev/urandom`)",
                secret.len()
            ));
        }
        let seed = ring::digest::digest(&ring::digest::SHA256, secret);
        let pair = Ed25519KeyPair::from_seed_unchecked(seed.as_ref())
            .map_err(|e| format!("cannot derive the signing key: {e}"))?;
        Ok(DecisionKey { pair })
    }

    /// Loads the key from `CGPU_DECISION_KEY_FILE` or the default path.
    pub fn load() -> Result<DecisionKey, String> {
        let path = std::env::var(ENV_KEY_FILE).unwrap_or_else(|_| DEFAULT_KEY_FILE.to_string());
        let bytes = std::fs::read(&path).map_err(|e| {
            format!("cannot read the decision key {path} ({e}); set {ENV_KEY_FILE} or mount the cgpu-decision-key Secret there")
        })?;
        DecisionKey::from_bytes(bytes.trim_ascii())
    }

    pub fn sign(&self, d: &mut Decision) {
        d.sig = hex(self.pair.sign(&d.signed_bytes()).as_ref());
    }

    /// The verifier for this key's signatures.
    pub fn verifier(&self) -> DecisionVerifier {
        DecisionVerifier {
            public: self.pair.public_key().as_ref().to_vec(),
        }
    }

    pub fn verify(&self, d: &Decision) -> bool {
        self.verifier().verify(d)
    }

    /// Writes the public key into the ConfigMap `cgpu-decision-key` of
    /// `namespace` (created if missing, updated if another key is there).
    pub async fn publish(&self, client: &Client, namespace: &str) -> Result<(), String> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let public = self.verifier().to_hex();
        let data = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP_DECISION_KEY, "namespace": namespace},
            "data": {PUBKEY_DATA_KEY: public},
        });
        let cm: ConfigMap = serde_json::from_value(data.clone()).expect("a ConfigMap");
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => api
                .patch(
                    CONFIGMAP_DECISION_KEY,
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({"data": {PUBKEY_DATA_KEY: public}})),
                )
                .await
                .map(|_| ())
                .map_err(|e| {
                    format!("cannot update ConfigMap {namespace}/{CONFIGMAP_DECISION_KEY}: {e}")
                }),
            Err(e) => Err(format!(
                "cannot create ConfigMap {namespace}/{CONFIGMAP_DECISION_KEY}: {e}"
            )),
        }
    }
}

/// Checks the extender's signatures with its public key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionVerifier {
    public: Vec<u8>,
}

impl DecisionVerifier {
    pub fn from_hex(s: &str) -> Result<DecisionVerifier, String> {
        match unhex(s) {
            Some(public) if public.len() == 32 => Ok(DecisionVerifier { public }),
            _ => Err(format!(
                "{s:?} is not an Ed25519 public key (64 hex digits)"
            )),
        }
    }

    pub fn to_hex(&self) -> String {
        hex(&self.public)
    }

    pub fn verify(&self, d: &Decision) -> bool {
        let Some(sig) = unhex(&d.sig) else {
            return false;
        };
        UnparsedPublicKey::new(&signature::ED25519, &self.public)
            .verify(&d.signed_bytes(), &sig)
            .is_ok()
    }

    /// The public key from `CGPU_DECISION_PUBKEY_FILE` when set, else from
    /// the ConfigMap the extender publishes.
    pub async fn load(client: &Client) -> Result<DecisionVerifier, String> {
        if let Some(path) = std::env::var_os(ENV_PUBKEY_FILE).filter(|p| !p.is_empty()) {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.to_string_lossy()))?;
            return DecisionVerifier::from_hex(&text);
        }
        let ns = namespace();
        let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get(CONFIGMAP_DECISION_KEY)
            .await
            .map_err(|e| {
                format!(
                    "cannot read the extender's public key (ConfigMap {ns}/{CONFIGMAP_DECISION_KEY}): {e}"
                )
            })?;
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(PUBKEY_DATA_KEY))
            .ok_or_else(|| {
                format!("ConfigMap {ns}/{CONFIGMAP_DECISION_KEY} has no {PUBKEY_DATA_KEY}")
            })?;
        DecisionVerifier::from_hex(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn signed_decisions_verify_with_the_public_key_only() {
        let key = DecisionKey::from_bytes(b"0123456789abcdef0123").unwrap();
        let public = DecisionVerifier::from_hex(&key.verifier().to_hex()).unwrap();
        let mut d = Decision {
            node: "n1".into(),
            pod_uid: "u1".into(),
            gpus: vec![],
            gpu_gib: 15,
            per_gpu: 4,
            containers: BTreeMap::from([("main".to_string(), 4)]),
            compute: 0,
            mib: false,
            sig: String::new(),
        };
        assert!(!public.verify(&d));
        key.sign(&mut d);
        assert_eq!(d.sig.len(), 128);
        assert!(public.verify(&d));
        let mut other_pod = d.clone();
        other_pod.pod_uid = "u2".into();
        assert!(!public.verify(&other_pod));
        let mut bigger = d.clone();
        bigger.containers.insert("main".into(), 15);
        assert!(!public.verify(&bigger));
        let other_key = DecisionKey::from_bytes(b"another key, 16+ bytes").unwrap();
        assert!(!other_key.verify(&d));
        assert!(DecisionKey::from_bytes(b"short").is_err());
        assert!(DecisionVerifier::from_hex("abcd").is_err());
    }
}
