//! The per-process driver: configuration, the shared state and our slot in
//! it, per-device executors, and the registry of every handle we hand out
//! (contexts, streams, events, modules, functions, graphs, pools, ...).
//! Handles are opaque numbers shaped like pointers; they are looked up here
//! and never dereferenced, so a foreign or freed handle is an error code,
//! never a crash.

use crate::config::{arch_of, Config};
use crate::exec::{EventTimes, Executor};
use crate::state::{self, DeviceInit, Shared};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

pub struct DevInfo {
    pub name: String,
    pub uuid: String,
    pub uuid_bytes: [u8; 16],
    pub total: u64,
    pub cc: (i32, i32),
    pub sms: i32,
    pub pci_bus: u32,
}

pub struct Ctx {
    pub dev: usize,
    pub primary: bool,
    pub flags: AtomicU32,
    pub destroyed: AtomicBool,
    /// `cuCtxSetLimit` values and the memory they reserve.
    pub limits: Mutex<crate::cuda::limits::Limits>,
    /// Usage count (deprecated `cuCtxAttach`/`cuCtxDetach`): 1 at creation.
    pub usage: AtomicU32,
    /// The green context this is the `CUcontext` of (0: none).
    pub green: std::sync::atomic::AtomicUsize,
}

pub struct Stream {
    pub ctx: usize,
    pub dev: usize,
    pub flags: u32,
    pub prio: i32,
    pub last_seq: AtomicU64,
    /// Open stream capture (`cuStreamBeginCapture`), if any.
    pub capture: Mutex<Option<Capture>>,
}

/// A stream's part in a capture (`cuStreamBeginCapture`, or joined by
/// waiting on an event recorded in a capturing stream): launches, async
/// copies and memsets are recorded into the capture's graph, not run.
pub struct Capture {
    pub shared: Arc<Mutex<CaptureGraph>>,
    /// The nodes the stream's next captured work depends on.
    pub deps: Vec<usize>,
    /// The stream that began the capture (only it can end it).
    pub origin: bool,
}

impl Capture {
    pub fn id(&self) -> u64 {
        self.shared.lock().id
    }
    pub fn invalidate(&self) {
        self.shared.lock().invalidated = true;
    }
}

/// Where an event was recorded in a capture: the capture and its nodes.
pub type CapturedAt = (Arc<Mutex<CaptureGraph>>, Vec<usize>);

/// A capture, shared by every stream taking part in it.
pub struct CaptureGraph {
    pub id: u64,
    pub mode: u32,
    /// The graph being built (handle).
    pub graph: usize,
    /// Set by an operation illegal during capture (e.g. cuCtxSynchronize).
    pub invalidated: bool,
    /// Streams other than the origin still in the capture.
    pub joined: u32,
    /// The graph is the caller's (`cuStreamBeginCaptureToGraph`): a failed
    /// capture leaves it alone.
    pub user_graph: bool,
    /// `cuStreamBeginRecaptureToGraph`: the graph the capture is checked
    /// against and copied into at its end, the mismatch callback, its data.
    pub recapture: Option<(usize, usize, usize)>,
}

pub struct Event {
    pub dev: AtomicU32,
    pub flags: u32,
    pub times: Arc<EventTimes>,
    /// Last recorded in a capturing stream: that capture and the nodes the
    /// record stood for (a stream waiting on it joins the capture).
    pub captured: Mutex<Option<CapturedAt>>,
}

/// How long a function's launches take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// `cgpu_sim_spin*`: the first parameter (u64) in ns.
    Spin,
    /// Any other kernel: `CGPU_SIM_KERNEL_NS`.
    Fixed,
}

pub struct Module {
    pub ctx: usize,
    /// The kernels and globals its image defines.
    pub image: crate::image::Image,
    pub library: bool,
    /// Globals: name → (device address, size). Zeroed device memory: the
    /// image's globals are laid out in one segment allocated when the module
    /// is loaded (as a driver loads a module's data eagerly); a global of an
    /// image the sim cannot read gets its own allocation at its first look-up.
    pub globals: Mutex<HashMap<String, (u64, u64)>>,
    /// The device allocations holding the globals, freed with the module.
    pub segments: Mutex<Vec<u64>>,
}

pub struct Func {
    pub module: usize,
    pub name: String,
    pub timing: Timing,
    pub attrs: Mutex<HashMap<i32, i32>>,
}

#[derive(Clone)]
pub struct KernelNode {
    pub func: Arc<Func>,
    pub ns: u64,
}

pub use crate::cuda::graph::{Graph, GraphExec, UserObject};

/// A copy or memset recorded in a graph, performed each time it runs. The
/// sim's copies take no device time and need no ordering with kernels
/// (kernels compute nothing); among themselves they run in issue order.
#[derive(Clone, Debug)]
pub enum MemOp {
    /// `len` bytes from `src` to `dst` (device or host addresses).
    Copy { dst: u64, src: u64, len: usize },
    /// `count` elements of `value` (its length is the element size) at `dst`.
    Set {
        dst: u64,
        value: Vec<u8>,
        count: usize,
    },
}

pub struct Pool {
    pub dev: usize,
    pub attrs: Mutex<HashMap<i32, u64>>,
    /// `handleTypes` the pool was created exportable as (`CUmemPoolProps`).
    pub handle_types: i32,
    /// Imported from another process (`cuMemPoolImportFromShareableHandle`):
    /// its pid; 0 for a pool of this process.
    pub imported_from: u32,
    /// A managed memory pool (`CU_MEM_ALLOCATION_TYPE_MANAGED`): its
    /// allocations are managed memory.
    pub managed: bool,
}

pub struct PhysMem {
    pub dev: usize,
    pub size: u64,
    /// Bytes charged to this process's device memory: the size when it was
    /// created here, 0 when imported from another process (which holds it).
    pub charged: u64,
    /// `requestedHandleTypes` of `cuMemCreate` (what it may be exported as).
    pub handle_types: i32,
    pub fd: i32,
    /// Every handle reference released by cuMemRelease (memory returns
    /// when unmapped too).
    pub released: AtomicBool,
    /// Handle references: 1 from cuMemCreate, one more per
    /// cuMemRetainAllocationHandle; each cuMemRelease drops one.
    pub refs: AtomicU32,
    pub maps: AtomicU32,
}

pub struct Array {
    pub dev: usize,
    pub bytes: u64,
    pub ctx: usize,
    pub base: u64,
    /// Width, height, depth (0 for missing dimensions), format, channels:
    /// the backing is rows of `width * element bytes`, `max(height, 1)` rows
    /// per layer.
    pub dims: [usize; 3],
    pub format: u32,
    pub channels: u32,
}

impl Array {
    /// Bytes of one element.
    pub fn elem_bytes(&self) -> u64 {
        crate::cuda::memory::format_bytes(self.format).unwrap_or(1) * self.channels as u64
    }
    pub fn row_bytes(&self) -> u64 {
        self.dims[0] as u64 * self.elem_bytes()
    }
    pub fn rows(&self) -> u64 {
        self.dims[1].max(1) as u64
    }
    pub fn layers(&self) -> u64 {
        self.dims[2].max(1) as u64
    }
}

#[derive(Clone)]
pub enum Obj {
    Ctx(Arc<Ctx>),
    Stream(Arc<Stream>),
    Event(Arc<Event>),
    Module(Arc<Module>),
    Func(Arc<Func>),
    Graph(Arc<Mutex<Graph>>),
    GraphNode(usize),
    GraphExec(Arc<GraphExec>),
    UserObject(Arc<UserObject>),
    Pool(Arc<Pool>),
    Array(Arc<Array>),
    Link(Arc<Mutex<crate::cuda::link::LinkState>>),
    GreenCtx(Arc<crate::cuda::green::GreenCtx>),
    ResourceDesc(Arc<crate::cuda::green::DevResourceDesc>),
}

pub struct Objects {
    next: usize,
    map: HashMap<usize, Obj>,
}

/// Handles look like heap pointers but are only keys of `Objects`.
const HANDLE_BASE: usize = 0x5c00_0000_0000;

impl Objects {
    pub fn insert(&mut self, o: Obj) -> usize {
        self.next += 1;
        let h = HANDLE_BASE + self.next * 0x40;
        self.map.insert(h, o);
        h
    }
    pub fn get(&self, h: usize) -> Option<&Obj> {
        self.map.get(&h)
    }
    /// Puts an object back under its old handle.
    pub fn insert_at(&mut self, h: usize, o: Obj) {
        self.map.insert(h, o);
    }
    pub fn remove(&mut self, h: usize) -> Option<Obj> {
        self.map.remove(&h)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&usize, &Obj)> {
        self.map.iter()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocKind {
    Device,
    Managed,
    Async,
    Host,
    /// A module's global variable (freed with its module).
    Global,
    /// Another process's memory, mapped by `cuIpcOpenMemHandle` (charged to
    /// that process).
    Ipc,
}

#[derive(Clone, Debug)]
pub struct Alloc {
    pub size: u64,
    /// Bytes charged to the device (0 for host memory).
    pub charged: u64,
    pub dev: usize,
    pub ctx: usize,
    pub kind: AllocKind,
    /// mmap'd length (0: not ours to munmap, e.g. registered host memory).
    pub map_len: usize,
    /// Pool handle for stream-ordered allocations (0: none).
    pub pool: usize,
}

#[derive(Default)]
pub struct PrimaryCtx {
    pub handle: usize,
    pub refs: u32,
    pub flags: u32,
}

pub struct Driver {
    pub cfg: Config,
    pub shared: &'static Shared,
    pub slot: usize,
    pub devs: Vec<DevInfo>,
    execs: Vec<OnceLock<Arc<Executor>>>,
    pub objs: Mutex<Objects>,
    pub allocs: Mutex<BTreeMap<u64, Alloc>>,
    /// VMM: mapped ranges (start → (len, phys handle)), reserved ranges.
    pub vmm_maps: Mutex<BTreeMap<u64, (u64, u64)>>,
    pub vmm_reserved: Mutex<BTreeMap<u64, u64>>,
    pub phys: Mutex<HashMap<u64, Arc<PhysMem>>>,
    pub primary: Vec<Mutex<PrimaryCtx>>,
    pub default_pools: Vec<OnceLock<usize>>,
    pub current_pools: Vec<Mutex<usize>>,
    /// Per device: the default managed pool (made on first use) and the
    /// current one (`cuMemSetMemPool` of the managed type; 0: the default).
    pub default_managed_pools: Vec<OnceLock<usize>>,
    pub current_managed_pools: Vec<Mutex<usize>>,
    /// Live contexts per device (NVML lists processes that have one).
    live_ctxs: Vec<AtomicU32>,
}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
static CUDA_INIT: AtomicBool = AtomicBool::new(false);
static FORKED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread's context stack (top = current).
    pub static CTX_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

extern "C" fn at_exit() {
    if let Some(Ok(d)) = DRIVER.get() {
        if !FORKED.load(Relaxed) {
            d.shared.release_own_slot(d.slot);
        }
    }
}

extern "C" fn at_fork_child() {
    // The child shares our state file's open description (and so our
    // liveness lock): it must not keep us "alive" nor use our slot.
    FORKED.store(true, Relaxed);
    if let Some(Ok(d)) = DRIVER.get() {
        // SAFETY: closing our own descriptor in the child; the mapping stays.
        unsafe { libc::close(d.shared.fd()) };
    }
}

fn comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// This process's pid as the host numbers it, as the real driver reports
/// pids (NVML lists host pids, also for a process inside a PID namespace):
/// the pid `/proc/self` names when `/proc` is the host's, else `getpid()`.
fn host_pid() -> u32 {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse().ok())
        .unwrap_or_else(std::process::id)
}

fn build() -> Result<Driver, String> {
    let cfg = Config::from_env();
    let want: Vec<DeviceInit> = cfg
        .gpus
        .iter()
        .map(|g| DeviceInit {
            total_bytes: g.total_bytes,
            name: &g.name,
        })
        .collect();
    let shared = Shared::open(&cfg.state_dir, Some(&want))
        .map_err(|e| format!("cannot open the state in {}: {e}", cfg.state_dir.display()))?;
    let shared: &'static Shared = Box::leak(Box::new(shared));
    let slot = shared
        .claim_slot(host_pid(), &comm())
        .map_err(|e| e.to_string())?;
    state::set_own_slot_hint(slot);
    let n = shared.ndev();
    let mut devs = Vec::with_capacity(n);
    for d in 0..n {
        let name = shared.dev_name(d);
        let uuid = shared.dev_uuid(d);
        let hex: String = uuid
            .trim_start_matches("GPU-")
            .chars()
            .filter(|c| *c != '-')
            .collect();
        let mut ub = [0u8; 16];
        for (i, b) in ub.iter_mut().enumerate() {
            *b = hex
                .get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(0);
        }
        let (maj, min, sms) = arch_of(&name);
        devs.push(DevInfo {
            name,
            uuid,
            uuid_bytes: ub,
            total: shared.dev(d).total_bytes,
            cc: (maj, min),
            sms,
            pci_bus: 0x17 + d as u32 * 0x10,
        });
    }
    // SAFETY: registering plain extern "C" handlers without captured state.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(at_fork_child));
    }
    Ok(Driver {
        cfg,
        shared,
        slot,
        execs: (0..n).map(|_| OnceLock::new()).collect(),
        objs: Mutex::new(Objects {
            next: 0,
            map: HashMap::new(),
        }),
        allocs: Mutex::new(BTreeMap::new()),
        vmm_maps: Mutex::new(BTreeMap::new()),
        vmm_reserved: Mutex::new(BTreeMap::new()),
        phys: Mutex::new(HashMap::new()),
        primary: (0..n).map(|_| Mutex::new(PrimaryCtx::default())).collect(),
        default_pools: (0..n).map(|_| OnceLock::new()).collect(),
        current_pools: (0..n).map(|_| Mutex::new(0)).collect(),
        default_managed_pools: (0..n).map(|_| OnceLock::new()).collect(),
        current_managed_pools: (0..n).map(|_| Mutex::new(0)).collect(),
        live_ctxs: (0..n).map(|_| AtomicU32::new(0)).collect(),
        devs,
    })
}

/// The driver, initialising it on first use (shared by cuInit and nvmlInit).
pub fn core() -> Result<&'static Driver, &'static str> {
    if FORKED.load(Relaxed) {
        return Err("forked child");
    }
    match DRIVER.get_or_init(|| {
        let r = build();
        if let Err(e) = &r {
            eprintln!("cgpu-sim: {e}");
        }
        r
    }) {
        Ok(d) => Ok(d),
        Err(_) => Err("init failed"),
    }
}

/// Waits while a checkpoint tool holds this process locked or checkpointed
/// (`cuCheckpointProcessLock`): every CUDA call but the checkpoint ones
/// passes here first. One load of our slot's state when running.
#[inline]
pub fn checkpoint_gate() {
    let Some(Ok(d)) = DRIVER.get() else { return };
    let w = &d.shared.slot(d.slot).ckpt;
    loop {
        let v = w.load(Acquire);
        if v == 0 || FORKED.load(Relaxed) {
            return;
        }
        state::futex_wait(w, v, 100_000_000);
    }
}

/// `cuInit`.
pub fn cuda_init() -> Result<&'static Driver, CUresult> {
    let d = core().map_err(|_| CUDA_ERROR_NO_DEVICE)?;
    if d.devs.is_empty() {
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    CUDA_INIT.store(true, Release);
    Ok(d)
}

/// The driver for a CUDA call: `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
#[inline]
pub fn cu() -> Result<&'static Driver, CUresult> {
    if !CUDA_INIT.load(Acquire) || FORKED.load(Relaxed) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// The simulated driver version, without initialising anything.
pub fn driver_version() -> i32 {
    match DRIVER.get() {
        Some(Ok(d)) => d.cfg.driver_version,
        _ => std::env::var("CGPU_SIM_DRIVER_VERSION")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|v| (1000..100_000).contains(v))
            .unwrap_or(crate::config::DEFAULT_DRIVER_VERSION),
    }
}

pub fn trace(args: std::fmt::Arguments) {
    if let Some(Ok(d)) = DRIVER.get() {
        if !d.cfg.trace {
            return;
        }
    } else if std::env::var_os("CGPU_SIM_TRACE").is_none_or(|v| v.is_empty() || v == "0") {
        return;
    }
    eprintln!("cgpu-sim: {args}");
}

impl Driver {
    pub fn exec(&self, dev: usize) -> &Arc<Executor> {
        self.execs[dev]
            .get_or_init(|| Executor::new(self.shared, self.slot, dev, self.cfg.timeslice_ns))
    }

    pub fn exec_if_started(&self, dev: usize) -> Option<&Arc<Executor>> {
        self.execs.get(dev).and_then(|e| e.get())
    }

    pub fn check_dev(&self, dev: CUdevice) -> Result<usize, CUresult> {
        if dev < 0 || dev as usize >= self.devs.len() {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        Ok(dev as usize)
    }

    pub fn ctx(&self, h: usize) -> Result<Arc<Ctx>, CUresult> {
        match self.objs.lock().get(h) {
            Some(Obj::Ctx(c)) => {
                if c.destroyed.load(Acquire) {
                    Err(CUDA_ERROR_CONTEXT_IS_DESTROYED)
                } else {
                    Ok(Arc::clone(c))
                }
            }
            _ => Err(CUDA_ERROR_INVALID_CONTEXT),
        }
    }

    /// The calling thread's current context.
    pub fn cur_ctx(&self) -> Result<(usize, Arc<Ctx>), CUresult> {
        let h = CTX_STACK
            .with(|s| s.borrow().last().copied())
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if h == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        Ok((h, self.ctx(h)?))
    }

    /// Resolves a stream handle (NULL, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`
    /// = the current context's default stream) to (device, stream object).
    pub fn stream(&self, h: usize) -> Result<(usize, Option<Arc<Stream>>), CUresult> {
        if h == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
            let (_, c) = self.cur_ctx()?;
            return Ok((c.dev, None));
        }
        let objs = self.objs.lock();
        match objs.get(h) {
            Some(Obj::Stream(s)) => {
                let s = Arc::clone(s);
                drop(objs);
                // A stream of a destroyed context is gone with it.
                self.ctx(s.ctx)
                    .map_err(|_| CUDA_ERROR_CONTEXT_IS_DESTROYED)?;
                Ok((s.dev, Some(s)))
            }
            _ => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// Invalidates every capture open on a stream of context `ctx`; true if
    /// there was one (the caller then fails with STREAM_CAPTURE_UNSUPPORTED).
    pub fn invalidate_captures(&self, ctx: usize) -> bool {
        let streams: Vec<Arc<Stream>> = self
            .objs
            .lock()
            .iter()
            .filter_map(|(_, o)| match o {
                Obj::Stream(s) if s.ctx == ctx => Some(Arc::clone(s)),
                _ => None,
            })
            .collect();
        let mut any = false;
        for s in streams {
            if let Some(c) = s.capture.lock().as_ref() {
                c.invalidate();
                any = true;
            }
        }
        any
    }

    pub fn event(&self, h: usize) -> Result<Arc<Event>, CUresult> {
        match self.objs.lock().get(h) {
            Some(Obj::Event(e)) => Ok(Arc::clone(e)),
            _ => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    pub fn func(&self, h: usize) -> Result<Arc<Func>, CUresult> {
        match self.objs.lock().get(h) {
            Some(Obj::Func(f)) => Ok(Arc::clone(f)),
            _ => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// Charges `bytes` on `dev` to this process or fails with OUT_OF_MEMORY.
    pub fn charge(&self, dev: usize, bytes: u64) -> Result<(), CUresult> {
        if self.shared.try_charge(self.slot, dev, bytes) {
            Ok(())
        } else {
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }

    pub fn uncharge(&self, dev: usize, bytes: u64) {
        self.shared.uncharge(self.slot, dev, bytes);
    }

    /// A context on `dev` came to life (+1) or died (-1).
    pub fn ctx_alive(&self, dev: usize, alive: bool) {
        let mask = &self.shared.slot(self.slot).ctx_mask;
        if alive {
            if self.live_ctxs[dev].fetch_add(1, AcqRel) == 0 {
                mask.fetch_or(1 << dev, AcqRel);
            }
        } else if self.live_ctxs[dev].fetch_sub(1, AcqRel) == 1 {
            mask.fetch_and(!(1 << dev), AcqRel);
        }
    }

    /// Marks that this process uses `dev` (NVML lists it from then on).
    pub fn touch_dev(&self, dev: usize) {
        self.shared
            .slot(self.slot)
            .dev_mask
            .fetch_or(1 << dev, Relaxed);
    }

    /// (free, total) of a device, reaping dead processes first.
    pub fn mem_info(&self, dev: usize) -> (u64, u64) {
        self.shared.reap(Some(self.slot));
        let total = self.devs[dev].total;
        let used = self.shared.used(dev);
        (total.saturating_sub(used), total)
    }
}
