//! Pure building blocks of cgpu's Kubernetes layer: where a pod's GPU memory
//! goes ([`placement`]), the names shared with the ecosystem ([`names`]),
//! the scheduler-extender wire format ([`wire`]) and how a decision is
//! recorded on a pod and handed to its containers ([`decision`]).

pub mod decision;
pub mod names;
pub mod placement;
pub mod wire;
