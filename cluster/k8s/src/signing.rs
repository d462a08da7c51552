//! Decisions are signed by the scheduler extender and checked by the device
//! plugins with one cluster-wide key (a Secret mounted into both), so a pod
//! that writes its own `cgpu.io/allocation` annotation, or copies another
//! pod's, gets no GPU memory.

use cgpu_cluster_core::decision::Decision;
use ring::hmac;

/// The decision key, read from the file named by `CGPU_DECISION_KEY_FILE`
/// (default `/etc/cgpu/decision-key/key`).
pub struct DecisionKey(hmac::Key);

pub const ENV_KEY_FILE: &str = "CGPU_DECISION_KEY_FILE";
pub const DEFAULT_KEY_FILE: &str = "/etc/cgpu/decision-key/key";

impl DecisionKey {
    pub fn from_bytes(secret: &[u8]) -> Result<DecisionKey, String> {
        if secret.len() < 16 {
            return Err(format!(
                "the decision key has {} bytes; it needs at least 16 (e.g. `head -c 32 /dev/urandom`)",
                secret.len()
            ));
        }
        Ok(DecisionKey(hmac::Key::new(hmac::HMAC_SHA256, secret)))
    }

    /// Loads the key from `CGPU_DECISION_KEY_FILE` or the default path.
    pub fn load() -> Result<DecisionKey, String> {
        let path = std::env::var(ENV_KEY_FILE).unwrap_or_else(|_| DEFAULT_KEY_FILE.to_string());
        let bytes = std::fs::read(&path).map_err(|e| {
            format!("cannot read the decision key {path} ({e}); set {ENV_KEY_FILE} or mount the cgpu-decision-key Secret there")
        })?;
        let trimmed: &[u8] = bytes.trim_ascii();
        DecisionKey::from_bytes(trimmed)
    }

    pub fn sign(&self, d: &mut Decision) {
        let tag = hmac::sign(&self.0, &d.signed_bytes());
        d.sig = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    }

    pub fn verify(&self, d: &Decision) -> bool {
        let Some(tag) = unhex(&d.sig) else {
            return false;
        };
        hmac::verify(&self.0, &d.signed_bytes(), &tag).is_ok()
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn signed_decisions_verify_and_altered_ones_do_not() {
        let key = DecisionKey::from_bytes(b"0123456789abcdef0123").unwrap();
        let mut d = Decision {
            node: "n1".into(),
            pod_uid: "u1".into(),
            gpus: vec![],
            gpu_gib: 15,
            per_gpu: 4,
            containers: BTreeMap::from([("main".to_string(), 4)]),
            sig: String::new(),
        };
        assert!(!key.verify(&d));
        key.sign(&mut d);
        assert!(key.verify(&d));
        let mut other_pod = d.clone();
        other_pod.pod_uid = "u2".into();
        assert!(!key.verify(&other_pod));
        let mut bigger = d.clone();
        bigger.containers.insert("main".into(), 15);
        assert!(!key.verify(&bigger));
        let other_key = DecisionKey::from_bytes(b"another key, 16+ bytes").unwrap();
        assert!(!other_key.verify(&d));
        assert!(DecisionKey::from_bytes(b"short").is_err());
    }
}
