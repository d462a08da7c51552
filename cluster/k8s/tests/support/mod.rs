pub mod kubelet;
