//! This process's settings, read once from its container's allocation file,
//! the host's settings file for its container, or its environment (the
//! grammar: [`cgpu_ledger::settings`], re-exported here). [`get`] reads them
//! the first time it is called (lazily, from the first hooked call, never
//! from a library constructor) and logs one clear error per bad value.

pub use cgpu_ledger::settings::*;
use std::sync::OnceLock;

static CONFIG: OnceLock<Config> = OnceLock::new();
/// Install the stderr logger (level from `CGPU_LOG`, default `warn`; see
/// [`crate::log`]). Lazy: called from the first hooked call, never from a
/// constructor.
pub fn init_logging() {
    crate::log::init();
}

/// The process's configuration, parsed (and its errors logged) on first use.
pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| {
        init_logging();
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok();
        let env = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        let alloc = env("CGPU_ALLOC_FILE")
            .filter(|p| !p.is_empty())
            .or_else(|| {
                std::fs::metadata(DEFAULT_ALLOC_FILE)
                    .is_ok_and(|m| m.is_file())
                    .then(|| DEFAULT_ALLOC_FILE.to_string())
            });
        let c = match alloc {
            None => match settings_file_path(&env) {
                None => {
                    let mut c = from_lookup(&env, cgroup.as_deref());
                    c.ignored.extend(file_only_settings_in_env(&env));
                    c
                }
                Some(path) => {
                    let text = read_settings_file(&path);
                    let ignored = ignored_by_settings_file(&env, text.as_deref().unwrap_or(""));
                    let (c, failure) = with_settings_file(&env, cgroup.as_deref(), &path, text);
                    if let Some(msg) = failure {
                        tracing::error!("{msg}");
                        return c;
                    }
                    if !ignored.is_empty() {
                        tracing::warn!(
                            "cgpu: this container's settings come from the host ({path}); ignored from the environment: {}",
                            ignored.join(", ")
                        );
                    }
                    c
                }
            },
            Some(path) => {
                let text = read_settings_file(&path);
                let (c, failure) = with_alloc_file(&env, cgroup.as_deref(), &path, text);
                if let Some(msg) = failure {
                    tracing::error!("{msg}");
                    return c;
                }
                c
            }
        };
        for w in &c.ignored {
            tracing::warn!("cgpu: {w}");
        }
        for e in &c.errors {
            tracing::error!("cgpu: bad environment: {e}");
        }
        if !c.errors.is_empty() {
            tracing::error!(
                "cgpu: no GPU is visible to this container (no GPU memory) until the value above is fixed: cgpu cannot tell what it asked for, and never turns isolation off"
            );
        } else {
            match c.mode {
                Mode::PassThrough => tracing::info!(
                    "cgpu: ALIYUN_COM_GPU_MEM_CONTAINER unset or 0: memory isolation off (pass-through)"
                ),
                Mode::Record => tracing::warn!(
                    "cgpu: CGPU_DISABLE set: memory not enforced, usage recorded (container {})",
                    c.container_id
                ),
                Mode::Enforce => {
                    let list = |v: &[u64]| {
                        v.iter()
                            .map(|g| g.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    match &c.mem_container_mib {
                        Some(mib) => tracing::info!(
                            "cgpu: enforcing GPU memory quotas of {} MiB for container {}",
                            list(mib),
                            c.container_id
                        ),
                        None => tracing::info!(
                            "cgpu: enforcing GPU memory quotas of {} GiB{} for container {}",
                            list(&c.mem_container),
                            c.mem_dev
                                .map(|d| format!(" (of a {d} GiB GPU)"))
                                .unwrap_or_default(),
                            c.container_id
                        ),
                    }
                }
            }
        }
        c
    })
}
