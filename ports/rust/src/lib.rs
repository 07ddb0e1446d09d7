//! Safe Rust bindings to kvprune, an arena-backed, pruning KV cache behind a C ABI.
//!
//! ```no_run
//! use kvprune::{Cache, Model, Rope};
//! let model = Model::new(2, 4, 2, 64).rope(Rope::Neox, 0, 10000.0);
//! let mut cache = Cache::from_spec(&model, "policy=streaming sinks=4 window=252").unwrap();
//! let (q, k, v) = (vec![0.1f32; 4 * 64], vec![0.2f32; 2 * 64], vec![0.3f32; 2 * 64]);
//! let mut out = vec![0f32; 4 * 64];
//! for layer in 0..2 {
//!     cache.decode(layer, &q, &k, &v, &mut out).unwrap();
//! }
//! println!("{:?}", cache.stats().unwrap());
//! ```
//!
//! Everything here is safe to call: slice lengths are checked against the model geometry
//! before the C library sees them, and every failure is an [`Error`] carrying the library's
//! [`Status`] and message. A [`Cache`] owns its 64-byte aligned arena (allocated once, in
//! [`Cache::new`]), or lives in memory the caller lends it ([`Cache::in_memory`], borrowed for
//! the cache's lifetime); no later call allocates on the library side.
//!
//! Linking: see `build.rs` (`pkg-config kvprune`, or `KVPRUNE_LIB_DIR`).

pub mod ffi;

use std::alloc::{self, Layout};
use std::any::Any;
use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};

/// Library version `(major, minor, patch)` of the linked libkvprune.a.
pub fn version() -> (u32, u32, u32) {
    let v = unsafe { ffi::kvp_version() };
    (v >> 16, (v >> 8) & 0xff, v & 0xff)
}

/// Failure kinds: the library's `kvp_status` values other than `KVP_OK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Arg,
    Config,
    Arena,
    Layer,
    Full,
    NonFinite,
    State,
    Unsupported,
    /// An output buffer too small (the call reports the size it needs).
    Buffer,
    /// A status this binding does not know (a newer library).
    Unknown(u32),
}

impl Status {
    fn from_raw(s: ffi::kvp_status) -> Option<Status> {
        Some(match s {
            ffi::KVP_OK => return None,
            ffi::KVP_ERR_ARG => Status::Arg,
            ffi::KVP_ERR_CONFIG => Status::Config,
            ffi::KVP_ERR_ARENA => Status::Arena,
            ffi::KVP_ERR_LAYER => Status::Layer,
            ffi::KVP_ERR_FULL => Status::Full,
            ffi::KVP_ERR_NONFINITE => Status::NonFinite,
            ffi::KVP_ERR_STATE => Status::State,
            ffi::KVP_ERR_UNSUPPORTED => Status::Unsupported,
            ffi::KVP_ERR_BUFFER => Status::Buffer,
            other => Status::Unknown(other),
        })
    }

    /// The pinned C value.
    pub fn raw(self) -> u32 {
        match self {
            Status::Arg => ffi::KVP_ERR_ARG,
            Status::Config => ffi::KVP_ERR_CONFIG,
            Status::Arena => ffi::KVP_ERR_ARENA,
            Status::Layer => ffi::KVP_ERR_LAYER,
            Status::Full => ffi::KVP_ERR_FULL,
            Status::NonFinite => ffi::KVP_ERR_NONFINITE,
            Status::State => ffi::KVP_ERR_STATE,
            Status::Unsupported => ffi::KVP_ERR_UNSUPPORTED,
            Status::Buffer => ffi::KVP_ERR_BUFFER,
            Status::Unknown(v) => v,
        }
    }

    /// The library's name and meaning of the status (`kvp_status_str`).
    pub fn describe(self) -> String {
        unsafe { cstr(ffi::kvp_status_str(self.raw())) }
    }
}

/// Error of a failed call: the status and the library's message (`kvp_last_error` or the
/// `err` buffer of the config functions and `kvp_create_ex`), or the binding's own message for
/// bad slice sizes. Every message has the library's one format, `"<status>: <detail>"` (e.g.
/// `"KVP_ERR_LAYER: layer or head out of range: layer 7 ..."`), so `Display` prints it as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    /// An error of this binding in the library's format: `"<status>: <detail>"`.
    pub fn new(status: Status, detail: &str) -> Error {
        Error { status, message: format!("{}: {}", status.describe(), detail) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status.describe())
        } else {
            write!(f, "{}", self.message)
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

fn arg_error(message: String) -> Error {
    Error::new(Status::Arg, &message)
}

const ERR_LEN: usize = 512;

fn check_with_buf(status: ffi::kvp_status, buf: &[u8]) -> Result<()> {
    match Status::from_raw(status) {
        None => Ok(()),
        Some(status) => {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            Err(Error { status, message: String::from_utf8_lossy(&buf[..end]).into_owned() })
        }
    }
}

/// Element type of the `*_half` calls' rows (`kvp_io_dtype`; the numbers are pinned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Half {
    /// IEEE binary16 bits.
    F16 = 1,
    /// bfloat16 bits (the high half of an f32).
    BF16 = 2,
}

/// RoPE style.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rope {
    None,
    /// Rotates pairs (i, i + rope_dim/2).
    Neox,
    /// Rotates pairs (2i, 2i+1), as llama2.c.
    Gptj,
}

/// Model geometry (`kvp_model`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    pub n_layers: u32,
    pub n_q_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub rope: Rope,
    /// 0 means head_dim.
    pub rope_dim: u32,
    pub rope_theta: f32,
}

impl Model {
    /// Geometry without RoPE; add it with [`Model::rope`].
    pub fn new(n_layers: u32, n_q_heads: u32, n_kv_heads: u32, head_dim: u32) -> Model {
        Model { n_layers, n_q_heads, n_kv_heads, head_dim, rope: Rope::None, rope_dim: 0, rope_theta: 10000.0 }
    }

    pub fn rope(mut self, rope: Rope, rope_dim: u32, rope_theta: f32) -> Model {
        self.rope = rope;
        self.rope_dim = rope_dim;
        self.rope_theta = rope_theta;
        self
    }

    fn to_raw(self) -> ffi::kvp_model {
        ffi::kvp_model {
            n_layers: self.n_layers,
            n_q_heads: self.n_q_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            rope: match self.rope {
                Rope::None => ffi::KVP_ROPE_NONE,
                Rope::Neox => ffi::KVP_ROPE_NEOX,
                Rope::Gptj => ffi::KVP_ROPE_GPTJ,
            },
            rope_dim: self.rope_dim,
            rope_theta: self.rope_theta,
        }
    }

    fn from_raw(m: &ffi::kvp_model) -> Model {
        Model {
            n_layers: m.n_layers,
            n_q_heads: m.n_q_heads,
            n_kv_heads: m.n_kv_heads,
            head_dim: m.head_dim,
            rope: match m.rope {
                ffi::KVP_ROPE_NEOX => Rope::Neox,
                ffi::KVP_ROPE_GPTJ => Rope::Gptj,
                _ => Rope::None,
            },
            rope_dim: m.rope_dim,
            rope_theta: m.rope_theta,
        }
    }
}

/// A cache configuration (`kvp_config`): defaults for a model, changed by spec strings
/// ("policy=streaming sinks=4 window=1020"; keys are the C field names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    raw: ffi::kvp_config,
}

impl Config {
    /// `kvp_config_init_ex` with this binding's `sizeof(kvp_config)`: the defaults for `model`
    /// (policy full). A newer library accepts the (smaller) struct of this binding's version. A
    /// bad geometry is a [`Status::Config`] error whose message names the field, e.g.
    /// "model.n_kv_heads=4 must divide model.n_q_heads=6".
    pub fn new(model: &Model) -> Result<Config> {
        let m = model.to_raw();
        let mut raw = ffi::kvp_config::default();
        let size = std::mem::size_of::<ffi::kvp_config>() as u32;
        let mut buf = [0u8; ERR_LEN];
        let s = unsafe { ffi::kvp_config_init_ex(&mut raw, size, &m, buf.as_mut_ptr() as *mut c_char, ERR_LEN) };
        check_with_buf(s, &buf)?;
        Ok(Config { raw })
    }

    /// Defaults for `model`, then `spec` applied.
    pub fn from_spec(model: &Model, spec: &str) -> Result<Config> {
        let mut c = Config::new(model)?;
        c.apply(spec)?;
        Ok(c)
    }

    /// `kvp_config_apply`: all-or-nothing; on error `self` is unchanged.
    pub fn apply(&mut self, spec: &str) -> Result<()> {
        let spec = CString::new(spec).map_err(|_| arg_error("spec contains a NUL byte".to_string()))?;
        let mut buf = [0u8; ERR_LEN];
        let s = unsafe { ffi::kvp_config_apply(&mut self.raw, spec.as_ptr(), buf.as_mut_ptr() as *mut c_char, ERR_LEN) };
        check_with_buf(s, &buf)
    }

    /// `kvp_config_check`: the whole configuration is consistent.
    pub fn check(&self) -> Result<()> {
        let mut buf = [0u8; ERR_LEN];
        let s = unsafe { ffi::kvp_config_check(&self.raw, buf.as_mut_ptr() as *mut c_char, ERR_LEN) };
        check_with_buf(s, &buf)
    }

    /// kvp_rope_check: whether a RoPE table (rope_dim/2 inverse frequencies, each finite and > 0)
    /// fits this configuration; creates nothing. An empty slice means no table.
    pub fn rope_check(&self, inv_freq: &[f64]) -> Result<()> {
        if inv_freq.len() > u32::MAX as usize {
            return Err(Error::new(Status::Arg, "the RoPE table has more than 2^32-1 entries"));
        }
        let tab = if inv_freq.is_empty() { ptr::null() } else { inv_freq.as_ptr() };
        let mut buf = [0u8; ERR_LEN];
        let s = unsafe {
            ffi::kvp_rope_check(&self.raw, tab, inv_freq.len() as u32, buf.as_mut_ptr() as *mut c_char, ERR_LEN)
        };
        check_with_buf(s, &buf)
    }

    /// Bytes [`Cache::in_memory`] needs from memory of any alignment: `arena_size() + 63`
    /// (0 if the configuration is invalid).
    pub fn arena_size_unaligned(&self) -> usize {
        match self.arena_size() {
            0 => 0,
            n => n + 63,
        }
    }

    /// Exact arena bytes a cache of this configuration needs; 0 when it is invalid.
    pub fn arena_size(&self) -> usize {
        unsafe { ffi::kvp_arena_size(&self.raw) }
    }

    /// `kvp_arena_size_heads`: the exact arena bytes with a DuoAttention role table (one
    /// [`HEAD_RETRIEVAL`] / [`HEAD_STREAMING`] per layer and KV head, layer-major); 0 if the
    /// config or the table is invalid or unsupported.
    pub fn arena_size_heads(&self, roles: &[u8]) -> usize {
        if roles.len() > u32::MAX as usize {
            return 0;
        }
        let p = if roles.is_empty() { ptr::null() } else { roles.as_ptr() };
        unsafe { ffi::kvp_arena_size_heads(&self.raw, p, roles.len() as u32) }
    }

    pub fn model(&self) -> Model {
        Model::from_raw(&self.raw.model)
    }

    /// `kvp_config_key_used`: whether key `name` affects a cache of this configuration. An
    /// unknown key is a [`Status::Config`] error.
    pub fn key_used(&self, name: &str) -> Result<bool> {
        let unknown = || Error::new(Status::Config, &format!("unknown key {:?}", name));
        let cname = CString::new(name).map_err(|_| unknown())?;
        match unsafe { ffi::kvp_config_key_used(&self.raw, cname.as_ptr()) } {
            r if r < 0 => Err(unknown()),
            r => Ok(r != 0),
        }
    }

    /// The key table row of `name` and the byte offset of its field in this binding's kvp_config
    /// (every field after `model` is 32 bits, in key table order: the field ends at config_size).
    fn field(&self, name: &str) -> Result<(ffi::kvp_key_info, usize)> {
        let n = unsafe { ffi::kvp_config_key_count() };
        for i in 0..n {
            let info = raw_key(i)?;
            if unsafe { CStr::from_ptr(info.name) }.to_bytes() != name.as_bytes() {
                continue;
            }
            if info.config_size == 0 {
                return Err(Error::new(
                    Status::Config,
                    &format!(
                        "{} is an apply-only key (kvp_config_apply resolves it into other fields; nothing is stored): use apply(\"{}=...\")",
                        name, name
                    ),
                ));
            }
            let size = info.config_size as usize;
            let first = std::mem::size_of::<u32>() + std::mem::size_of::<ffi::kvp_model>();
            if size > std::mem::size_of::<ffi::kvp_config>() || size < first + 4 {
                break; // a key of a newer library than this binding's struct
            }
            return Ok((info, size - 4));
        }
        Err(Error::new(Status::Config, &format!("unknown key {:?}", name)))
    }

    /// The field of spec key `name` (uint and enum keys as whole numbers).
    pub fn get(&self, name: &str) -> Result<f64> {
        let (info, off) = self.field(name)?;
        let p = unsafe { (&self.raw as *const ffi::kvp_config as *const u8).add(off) };
        Ok(if info.type_ == ffi::KVP_KEY_FLOAT {
            unsafe { *(p as *const f32) as f64 }
        } else {
            unsafe { *(p as *const u32) as f64 }
        })
    }

    /// Sets the field of spec key `name` directly (no cross-field check: [`Cache::new`] or
    /// [`Config::check`] does that). The value must be in the key's range from the key table
    /// (uint: a whole number in min..=max; float: min..=max; enum: a whole number 0..=max, e.g.
    /// `ffi::KVP_POLICY_H2O as f64`), else a [`Status::Config`] error and the field is unchanged.
    pub fn set(&mut self, name: &str, value: f64) -> Result<()> {
        let (info, off) = self.field(name)?;
        let p = unsafe { (&mut self.raw as *mut ffi::kvp_config as *mut u8).add(off) };
        if info.type_ == ffi::KVP_KEY_FLOAT {
            if !(info.min <= value && value <= info.max) {
                return Err(Error::new(
                    Status::Config,
                    &format!("{}={} is out of range ({}..{})", name, value, info.min, info.max),
                ));
            }
            unsafe { *(p as *mut f32) = value as f32 };
        } else {
            if value.fract() != 0.0 || !value.is_finite() {
                return Err(Error::new(Status::Config, &format!("{}={} is not an integer", name, value)));
            }
            let lo = if info.type_ == ffi::KVP_KEY_ENUM { 0.0 } else { info.min };
            if !(lo <= value && value <= info.max) {
                return Err(Error::new(
                    Status::Config,
                    &format!("{}={} is out of range ({}..{})", name, value, lo, info.max),
                ));
            }
            unsafe { *(p as *mut u32) = value as u32 };
        }
        Ok(())
    }

    /// The plain C struct (read its fields directly).
    pub fn raw(&self) -> &ffi::kvp_config {
        &self.raw
    }

    /// The plain C struct for direct edits; the library validates it at [`Cache::new`].
    pub fn raw_mut(&mut self) -> &mut ffi::kvp_config {
        &mut self.raw
    }
}

/// Value type of a configuration key (`kvp_key_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    Uint,
    Float,
    Enum,
}

/// One row of the library's key table (`kvp_config_key`); `key_type` is the C field `type`.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyInfo {
    pub name: String,
    pub key_type: KeyType,
    pub min: f64,
    pub max: f64,
    pub default_value: f64,
    /// Enum keys: the accepted names, `|`-separated ("avg|max"); None for numbers.
    pub values: Option<String>,
    /// Enum keys: the name of the default; None for numbers.
    pub default_name: Option<String>,
    /// Bit `1 << policy` set for each policy that uses the key.
    pub policies: u32,
    /// Smallest kvp_config struct_size that holds the field.
    pub config_size: u32,
    pub help: String,
}

fn raw_key(index: u32) -> Result<ffi::kvp_key_info> {
    let mut k = ffi::kvp_key_info {
        struct_size: std::mem::size_of::<ffi::kvp_key_info>() as u32,
        name: ptr::null(),
        type_: 0,
        min: 0.0,
        max: 0.0,
        default_value: 0.0,
        values: ptr::null(),
        default_name: ptr::null(),
        policies: 0,
        config_size: 0,
        help: ptr::null(),
    };
    match Status::from_raw(unsafe { ffi::kvp_config_key(index, &mut k) }) {
        None => Ok(k),
        Some(status) => Err(Error::new(status, &format!("kvp_config_key({}) failed", index))),
    }
}

/// The library's configuration keys (`kvp_config_key_count` / `kvp_config_key`), in field order.
pub fn config_keys() -> Result<Vec<KeyInfo>> {
    let n = unsafe { ffi::kvp_config_key_count() };
    let opt = |p: *const c_char| if p.is_null() { None } else { Some(unsafe { cstr(p) }) };
    (0..n)
        .map(|i| {
            let k = raw_key(i)?;
            Ok(KeyInfo {
                name: unsafe { cstr(k.name) },
                key_type: match k.type_ {
                    ffi::KVP_KEY_FLOAT => KeyType::Float,
                    ffi::KVP_KEY_ENUM => KeyType::Enum,
                    _ => KeyType::Uint,
                },
                min: k.min,
                max: k.max,
                default_value: k.default_value,
                values: opt(k.values),
                default_name: opt(k.default_name),
                policies: k.policies,
                config_size: k.config_size,
                help: unsafe { cstr(k.help) },
            })
        })
        .collect()
}

/// Figures of one layer (`kvp_layer_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerStats {
    pub capacity: u32,
    pub len: u32,
    pub live_bytes: u64,
    pub prune_events: u64,
    pub tokens_evicted: u64,
    pub evict_threshold: u32,
    pub sparsity: f32,
    /// SimLayerKV: 1 lazy (trimmed to sinks + window), 0 not lazy; -1 undecided or another policy.
    pub lazy: i32,
    /// `max_prompt`: selections made before a prompt ended (it outgrew capacity + max_prompt).
    pub prompt_early: u32,
}

/// Counters of a cache (`kvp_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub arena_bytes: u64,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub tokens_seen: u64,
    pub prune_events: u64,
    pub tokens_evicted: u64,
}

/// Result of [`Cache::prefill_select`] (ASL selection).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Selection {
    /// This call determined the selection layer.
    pub selected: bool,
    /// Entries written to the caller's index slice.
    pub n: usize,
}

/// Arena memory owned by a [`Cache`]: 64-byte aligned (from 2 MiB on, whole 2 MiB pages advised
/// for huge pages: `kvp_arena_advise`), freed after `kvp_destroy`.
struct Arena {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Arena {
    /// A failed allocation of a valid but huge arena is `Status::Arena`, not an abort
    /// (`handle_alloc_error` would end the process).
    fn new(len: usize) -> Result<Arena> {
        let too_big = || Error::new(Status::Arena, &format!("cannot allocate an arena of {} bytes", len));
        const HUGE: usize = 2 << 20;
        let align = if len >= HUGE { HUGE } else { 64 };
        let size = len.max(64).checked_add(align - 1).ok_or_else(too_big)? / align * align;
        let layout = Layout::from_size_align(size, align).map_err(|_| too_big())?;
        let p = unsafe { alloc::alloc(layout) };
        match NonNull::new(p) {
            Some(ptr) => {
                if align == HUGE {
                    // a hint: where it is refused the arena works with small pages
                    unsafe { ffi::kvp_arena_advise(ptr.as_ptr(), size) };
                }
                Ok(Arena { ptr, layout })
            }
            None => Err(too_big()),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A KV cache in its own arena (`Cache<'static>`, from [`Cache::new`]) or in memory the caller
/// lends it for `'a` ([`Cache::in_memory`]). Not `Sync` (calls mutate it); may move between threads.
pub struct Cache<'a> {
    handle: NonNull<ffi::kvp_cache>,
    // Declared after `handle`, dropped after Drop::drop destroyed the handle; None: caller memory.
    #[allow(dead_code)]
    arena: Option<Arena>,
    arena_len: usize,
    model: Model,
    config: Config,
    // The caller's memory stays borrowed (unusable by the caller) while the cache lives.
    _mem: PhantomData<&'a mut [u8]>,
    // The closure of Cache::set_parallel_fn (Box::into_raw; the library holds the pointer as
    // `user`), freed once the library no longer holds it: replaced, cleared, or after kvp_destroy.
    parallel: Option<NonNull<HostParallel>>,
}

// The cache is plain memory plus worker threads the library manages; one caller at a time.
// A host parallel-for it holds (set_parallel_fn) is `Send`, and is only called from the thread
// that is making a call on the cache.
unsafe impl<'a> Send for Cache<'a> {}

// ---- the host's parallel-for (issue 30; kvp_set_parallel) ----

/// A host parallel-for as [`Cache::set_parallel_fn`] takes it: `f(n, run)` must see `run(t)`
/// called for every t in 0..n (from any threads that finish before `f` returns).
type ParallelFn = dyn Fn(u32, &(dyn Fn(u32) + Sync)) + Send;

/// What `kvp_set_parallel`'s `user` points to for [`Cache::set_parallel_fn`].
struct HostParallel {
    f: Box<ParallelFn>,
    /// Per participant (n <= the cache's `threads`): whether its task ran in the current call.
    done: Box<[AtomicBool]>,
    /// A panic of `f` (or of a `run(t)` misuse), caught before it reaches C; resumed by the Rust
    /// method that made the C call once that call returned ([`Cache::check`]).
    panic: Cell<Option<Box<dyn Any + Send>>>,
}

/// The library's task of one call, shared with `f`'s threads as `run`.
struct Tasks<'d> {
    task: ffi::kvp_parallel_task,
    arg: *mut c_void,
    done: &'d [AtomicBool],
}

// The library's task may run on any threads, concurrently (kvprune.h, kvp_parallel_fn); each t
// runs at most once (the `done` flags).
unsafe impl<'d> Sync for Tasks<'d> {}

impl<'d> Tasks<'d> {
    fn run(&self, t: u32) {
        let n = self.done.len();
        match self.done.get(t as usize) {
            None => panic!("kvprune: parallel task {} of {} (t must be < n)", t, n),
            Some(d) if d.swap(true, Ordering::AcqRel) => panic!("kvprune: parallel task {} of {} run twice", t, n),
            Some(_) => unsafe { (self.task)(self.arg, t) },
        }
    }
}

/// The `kvp_parallel_fn` of [`Cache::set_parallel_fn`]: calls the closure with a `run` that
/// runs each t at most once, then runs here whatever it skipped (so the library's call always
/// completes), and keeps a panic from unwinding into C.
unsafe extern "C" fn host_parallel_call(user: *mut c_void, n: u32, task: ffi::kvp_parallel_task, arg: *mut c_void) {
    let hp = &*(user as *const HostParallel);
    if n as usize > hp.done.len() {
        // more participants than the cache's `threads` (the library never asks): in a row, here
        for t in 0..n {
            task(arg, t);
        }
        return;
    }
    let done = &hp.done[..n as usize];
    for d in done {
        d.store(false, Ordering::Relaxed);
    }
    let tasks = Tasks { task, arg, done };
    let run = |t: u32| tasks.run(t);
    let r = panic::catch_unwind(AssertUnwindSafe(|| (hp.f)(n, &run)));
    for t in 0..n {
        if !done[t as usize].swap(true, Ordering::AcqRel) {
            task(arg, t);
        }
    }
    if let Err(p) = r {
        hp.panic.set(Some(p));
    }
}

/// A RoPE table as (pointer, length) for `kvp_create_rope` (NULL, 0: theta's).
fn rope_arg(inv_freq: Option<&[f64]>) -> Result<(*const f64, u32)> {
    match inv_freq {
        Some(t) => {
            if t.len() > u32::MAX as usize {
                return Err(Error::new(Status::Arg, "the RoPE table has more than 2^32-1 entries"));
            }
            Ok((t.as_ptr(), t.len() as u32))
        }
        None => Ok((ptr::null(), 0)),
    }
}

/// `kvp_create_rope` in `n` bytes at `arena` (64-byte aligned).
fn create_at(cfg: &Config, inv_freq: Option<&[f64]>, arena: *mut u8, n: usize) -> Result<NonNull<ffi::kvp_cache>> {
    let (tab, nt) = rope_arg(inv_freq)?;
    let mut h: *mut ffi::kvp_cache = ptr::null_mut();
    let mut buf = [0u8; ERR_LEN];
    let s = unsafe { ffi::kvp_create_rope(&cfg.raw, tab, nt, arena, n, &mut h, buf.as_mut_ptr() as *mut c_char, ERR_LEN) };
    check_with_buf(s, &buf)?;
    NonNull::new(h).ok_or_else(|| Error::new(Status::State, "kvp_create returned NULL"))
}

/// The arena size of a valid configuration, else its check's error.
fn arena_bytes(cfg: &Config) -> Result<usize> {
    let n = cfg.arena_size();
    if n == 0 {
        cfg.check()?;
        return Err(Error::new(Status::Config, "invalid configuration"));
    }
    Ok(n)
}

/// `kvp_head_role`: a retrieval head keeps what the policy keeps (issue 32 item 2).
pub const HEAD_RETRIEVAL: u8 = 0;
/// `kvp_head_role`: a streaming head keeps its first `duo_sink` and its `duo_window` newest tokens.
pub const HEAD_STREAMING: u8 = 1;

impl Cache<'static> {
    /// `kvp_create_heads`: a cache with a DuoAttention role table (`roles[layer * n_kv_heads + h]`,
    /// [`HEAD_RETRIEVAL`] or [`HEAD_STREAMING`]) and an optional RoPE table, in an allocated arena
    /// of exactly `kvp_arena_size_heads` bytes. An empty `roles` is [`Cache::with_rope_freqs`].
    pub fn with_heads(cfg: &Config, inv_freq: Option<&[f64]>, roles: &[u8]) -> Result<Cache<'static>> {
        let (tab, nt) = rope_arg(inv_freq)?;
        if roles.len() > u32::MAX as usize {
            return Err(Error::new(Status::Arg, "the role table has more than 2^32-1 entries"));
        }
        let rp = if roles.is_empty() { ptr::null() } else { roles.as_ptr() };
        let n = cfg.arena_size_heads(roles);
        if n == 0 {
            // the library's own message: a create without memory fails the same checks first
            let mut h: *mut ffi::kvp_cache = ptr::null_mut();
            let mut buf = [0u8; ERR_LEN];
            let s = unsafe {
                ffi::kvp_create_heads(&cfg.raw, tab, nt, rp, roles.len() as u32, ptr::null_mut(), 0, &mut h, buf.as_mut_ptr() as *mut c_char, ERR_LEN)
            };
            check_with_buf(s, &buf)?;
            if !h.is_null() {
                unsafe { ffi::kvp_destroy(h) };
            }
            return Err(Error::new(Status::Config, "invalid configuration or role table"));
        }
        let arena = Arena::new(n)?;
        let mut h: *mut ffi::kvp_cache = ptr::null_mut();
        let mut buf = [0u8; ERR_LEN];
        let s = unsafe {
            ffi::kvp_create_heads(&cfg.raw, tab, nt, rp, roles.len() as u32, arena.ptr.as_ptr(), n, &mut h, buf.as_mut_ptr() as *mut c_char, ERR_LEN)
        };
        check_with_buf(s, &buf)?;
        let handle = NonNull::new(h).ok_or_else(|| Error::new(Status::State, "kvp_create_heads returned NULL"))?;
        Ok(Cache { handle, arena: Some(arena), arena_len: n, model: cfg.model(), config: *cfg, _mem: PhantomData, parallel: None })
    }

    /// Allocates the exact arena (`kvp_arena_size`) and creates the cache in it.
    pub fn new(cfg: &Config) -> Result<Cache<'static>> {
        Cache::with_rope_freqs(cfg, None)
    }

    /// `Cache::new` whose RoPE rotates pair i by `pos * inv_freq[i]` (rope_dim/2 entries, e.g. from
    /// [`rope_freqs_yarn`]; copied into the arena by `kvp_create_rope`); `None` = the model's theta.
    pub fn with_rope_freqs(cfg: &Config, inv_freq: Option<&[f64]>) -> Result<Cache<'static>> {
        rope_arg(inv_freq)?;
        let n = arena_bytes(cfg)?;
        let arena = Arena::new(n)?;
        let handle = create_at(cfg, inv_freq, arena.ptr.as_ptr(), n)?;
        Ok(Cache { handle, arena: Some(arena), arena_len: n, model: cfg.model(), config: *cfg, _mem: PhantomData, parallel: None })
    }

    /// `Config::from_spec` then `Cache::new`.
    pub fn from_spec(model: &Model, spec: &str) -> Result<Cache<'static>> {
        Cache::new(&Config::from_spec(model, spec)?)
    }
}

impl<'a> Cache<'a> {
    /// Creates the cache in caller memory (`kvp_create` with an arena the caller owns): the
    /// `Config::arena_size()` bytes from `mem`'s first 64-byte boundary (so `mem` needs up to 63
    /// bytes more unless it is 64-byte aligned: see [`Config::arena_size_unaligned`]). `mem` stays
    /// borrowed while the cache lives, and the cache is destroyed (`kvp_destroy`) before the
    /// borrow ends; the binding allocates nothing. Memory that is too short is
    /// [`Status::Arena`] with nothing created; memory that held a cache may hold a new one once
    /// that cache was dropped.
    ///
    /// ```compile_fail
    /// # use kvprune::{Cache, Config, Model};
    /// let cfg = Config::from_spec(&Model::new(1, 1, 1, 16), "policy=full capacity=8").unwrap();
    /// let mut mem = vec![0u8; cfg.arena_size_unaligned()];
    /// let cache = Cache::in_memory(&cfg, &mut mem).unwrap();
    /// mem[0] = 1; // error: `mem` is borrowed by the cache
    /// drop(cache);
    /// ```
    pub fn in_memory(cfg: &Config, mem: &'a mut [u8]) -> Result<Cache<'a>> {
        Cache::in_memory_with_rope_freqs(cfg, None, mem)
    }

    /// [`Cache::in_memory`] with a RoPE frequency table (as [`Cache::with_rope_freqs`]).
    pub fn in_memory_with_rope_freqs(cfg: &Config, inv_freq: Option<&[f64]>, mem: &'a mut [u8]) -> Result<Cache<'a>> {
        rope_arg(inv_freq)?;
        let n = arena_bytes(cfg)?;
        let off = mem.as_ptr().align_offset(64);
        if off > mem.len() || mem.len() - off < n {
            return Err(Error::new(
                Status::Arena,
                &format!(
                    "the memory holds {} bytes from its first 64-byte boundary; the arena needs {}                      (Config::arena_size; Config::arena_size_unaligned for memory of any alignment)",
                    mem.len().saturating_sub(off),
                    n
                ),
            ));
        }
        let handle = create_at(cfg, inv_freq, unsafe { mem.as_mut_ptr().add(off) }, n)?;
        Ok(Cache { handle, arena: None, arena_len: n, model: cfg.model(), config: *cfg, _mem: PhantomData, parallel: None })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The resolved configuration the cache was created with: the `kvp_config` passed to
    /// `kvp_create` (every spec key applied, apply-only keys such as `compression_ratio` resolved
    /// into their fields), read with [`Config::get`] / [`Config::raw`]. Per-layer capacities as
    /// the library resolved them: [`Cache::layer_capacity`].
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Bytes of the arena this cache uses (owned, or in the caller's memory).
    pub fn arena_len(&self) -> usize {
        self.arena_len
    }

    /// Whether the arena is the caller's memory ([`Cache::in_memory`]) rather than the cache's own.
    pub fn in_caller_memory(&self) -> bool {
        self.arena.is_none()
    }

    /// Message of the last failed call ("" if none).
    pub fn last_error(&self) -> String {
        unsafe { cstr(ffi::kvp_last_error(self.handle.as_ptr())) }
    }

    fn check(&self, s: ffi::kvp_status) -> Result<()> {
        if let Some(hp) = self.parallel {
            // A panic in the host's parallel-for, caught in host_parallel_call: the C call has
            // completed (every task ran), so it continues here, in the caller's thread.
            if let Some(p) = unsafe { hp.as_ref() }.panic.take() {
                panic::resume_unwind(p);
            }
        }
        match Status::from_raw(s) {
            None => Ok(()),
            Some(status) => Err(Error { status, message: self.last_error() }),
        }
    }

    fn q_width(&self) -> usize {
        self.model.n_q_heads as usize * self.model.head_dim as usize
    }

    fn kv_width(&self) -> usize {
        self.model.n_kv_heads as usize * self.model.head_dim as usize
    }

    /// Number of tokens in k/v slices (multiple of n_kv_heads*head_dim) and checks of the others.
    fn tokens(&self, q: Option<usize>, k: usize, v: usize, out: Option<usize>, positions: Option<usize>) -> Result<u32> {
        let kw = self.kv_width();
        if k == 0 || k % kw != 0 {
            return Err(arg_error(format!("k has {} floats: expected a positive multiple of n_kv_heads*head_dim = {}", k, kw)));
        }
        let n = k / kw;
        if v != k {
            return Err(arg_error(format!("v has {} floats, k has {}", v, k)));
        }
        // 32-bit targets: the q/out length of n tokens must fit usize (a wrapped product would let a
        // short q through and the library read past it).
        let qn = n
            .checked_mul(self.q_width())
            .ok_or_else(|| arg_error(format!("{} tokens: q would hold more floats than usize counts", n)))?;
        if let Some(q) = q {
            if q != qn {
                return Err(arg_error(format!("q has {} floats, expected {} ({} tokens)", q, qn, n)));
            }
        }
        if let Some(o) = out {
            if o != qn {
                return Err(arg_error(format!("out has {} floats, expected {} ({} tokens)", o, qn, n)));
            }
        }
        if let Some(p) = positions {
            if p != n {
                return Err(arg_error(format!("positions has {} entries, expected {}", p, n)));
            }
        }
        u32::try_from(n).map_err(|_| arg_error(format!("{} tokens in one call", n)))
    }

    /// Decodes one token of `layer`: q is `[n_q_heads*head_dim]`, k and v `[n_kv_heads*head_dim]`,
    /// out receives `[n_q_heads*head_dim]`.
    pub fn decode(&mut self, layer: u32, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) -> Result<()> {
        let n = self.tokens(Some(q.len()), k.len(), v.len(), Some(out.len()), None)?;
        if n != 1 {
            return Err(arg_error(format!("decode takes one token, k holds {}", n)));
        }
        let s = unsafe {
            ffi::kvp_decode(self.handle.as_ptr(), layer, q.as_ptr(), k.as_ptr(), v.as_ptr(), out.as_mut_ptr())
        };
        self.check(s)
    }

    fn prefill_raw(
        &mut self,
        layer: u32,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        positions: Option<&[i32]>,
        out: Option<&mut [f32]>,
        sel: *mut ffi::kvp_selection,
    ) -> Result<()> {
        let n = self.tokens(Some(q.len()), k.len(), v.len(), out.as_ref().map(|o| o.len()), positions.map(|p| p.len()))?;
        let pos = positions.map_or(ptr::null(), |p| p.as_ptr());
        let outp = out.map_or(ptr::null_mut(), |o| o.as_mut_ptr());
        let s = unsafe {
            ffi::kvp_prefill(self.handle.as_ptr(), layer, n, pos, q.as_ptr(), k.as_ptr(), v.as_ptr(), outp, sel)
        };
        self.check(s)
    }

    /// Prefills `layer` with a chunk of tokens (count taken from k): exact causal attention into
    /// `out` (None skips it), then the policy's prefill compression. `positions` None = next ones.
    pub fn prefill(
        &mut self,
        layer: u32,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        positions: Option<&[i32]>,
        out: Option<&mut [f32]>,
    ) -> Result<()> {
        self.prefill_raw(layer, q, k, v, positions, out, ptr::null_mut())
    }

    /// [`Cache::prefill`] that also receives the ASL selection into `indices`.
    pub fn prefill_select(
        &mut self,
        layer: u32,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        positions: Option<&[i32]>,
        out: Option<&mut [f32]>,
        indices: &mut [i32],
    ) -> Result<Selection> {
        let mut sel = ffi::kvp_selection {
            struct_size: std::mem::size_of::<ffi::kvp_selection>() as u32,
            capacity: u32::try_from(indices.len()).unwrap_or(u32::MAX),
            indices: indices.as_mut_ptr(),
            n: 0,
            selected: 0,
        };
        self.prefill_raw(layer, q, k, v, positions, out, &mut sel)?;
        Ok(Selection { selected: sel.selected != 0, n: (sel.n as usize).min(indices.len()) })
    }

    /// Stores tokens without attention (position-based pruning still applies).
    pub fn append(&mut self, layer: u32, k: &[f32], v: &[f32], positions: Option<&[i32]>) -> Result<()> {
        let n = self.tokens(None, k.len(), v.len(), None, positions.map(|p| p.len()))?;
        let pos = positions.map_or(ptr::null(), |p| p.as_ptr());
        let s = unsafe { ffi::kvp_append(self.handle.as_ptr(), layer, n, pos, k.as_ptr(), v.as_ptr()) };
        self.check(s)
    }

    /// [`Cache::decode`] with 2-byte rows (`kvp_decode_ex`): q, k, v and out hold the bits of
    /// IEEE half (`Half::F16`) or bfloat16 (`Half::BF16`) values; the cache and the outputs are
    /// those of the f32 call on the widened values, its outputs rounded to nearest even.
    pub fn decode_half(&mut self, layer: u32, dtype: Half, q: &[u16], k: &[u16], v: &[u16], out: &mut [u16]) -> Result<()> {
        let n = self.tokens(Some(q.len()), k.len(), v.len(), Some(out.len()), None)?;
        if n != 1 {
            return Err(arg_error(format!("decode takes one token, k holds {}", n)));
        }
        let s = unsafe {
            ffi::kvp_decode_ex(self.handle.as_ptr(), layer, dtype as u32, q.as_ptr(), k.as_ptr(), v.as_ptr(), out.as_mut_ptr())
        };
        self.check(s)
    }

    /// [`Cache::prefill`] with 2-byte rows (`kvp_prefill_ex`; see [`Cache::decode_half`]).
    pub fn prefill_half(
        &mut self,
        layer: u32,
        dtype: Half,
        q: &[u16],
        k: &[u16],
        v: &[u16],
        positions: Option<&[i32]>,
        out: Option<&mut [u16]>,
    ) -> Result<()> {
        let n = self.tokens(Some(q.len()), k.len(), v.len(), out.as_ref().map(|o| o.len()), positions.map(|p| p.len()))?;
        let pos = positions.map_or(ptr::null(), |p| p.as_ptr());
        let outp = out.map_or(ptr::null_mut(), |o| o.as_mut_ptr());
        let s = unsafe {
            ffi::kvp_prefill_ex(self.handle.as_ptr(), layer, n, pos, dtype as u32, q.as_ptr(), k.as_ptr(), v.as_ptr(), outp,
                                ptr::null_mut())
        };
        self.check(s)
    }

    /// [`Cache::append`] with 2-byte rows (`kvp_append_ex`; see [`Cache::decode_half`]).
    pub fn append_half(&mut self, layer: u32, dtype: Half, k: &[u16], v: &[u16], positions: Option<&[i32]>) -> Result<()> {
        let n = self.tokens(None, k.len(), v.len(), None, positions.map(|p| p.len()))?;
        let pos = positions.map_or(ptr::null(), |p| p.as_ptr());
        let s = unsafe { ffi::kvp_append_ex(self.handle.as_ptr(), layer, n, pos, dtype as u32, k.as_ptr(), v.as_ptr()) };
        self.check(s)
    }

    /// Tokens kept by `layer` (max over its KV heads); 0 for a bad layer.
    pub fn layer_len(&self, layer: u32) -> u32 {
        unsafe { ffi::kvp_layer_len(self.handle.as_ptr(), layer) }
    }

    /// Original positions kept by (layer, kv_head) into `out`; returns how many. A too small
    /// `out` is a [`Status::Buffer`] error.
    pub fn layer_positions_into(&self, layer: u32, kv_head: u32, out: &mut [i32]) -> Result<usize> {
        let mut n = 0u32;
        let cap = u32::try_from(out.len()).unwrap_or(u32::MAX);
        let s = unsafe { ffi::kvp_layer_positions(self.handle.as_ptr(), layer, kv_head, out.as_mut_ptr(), cap, &mut n) };
        self.check(s)?;
        Ok(n as usize)
    }

    /// Original positions kept by (layer, kv_head), ascending.
    pub fn layer_positions(&self, layer: u32, kv_head: u32) -> Result<Vec<i32>> {
        let mut n = 0u32;
        let s = unsafe { ffi::kvp_layer_positions(self.handle.as_ptr(), layer, kv_head, ptr::null_mut(), 0, &mut n) };
        if s != ffi::KVP_OK && s != ffi::KVP_ERR_BUFFER {
            self.check(s)?;
        }
        let mut v = vec![0i32; n as usize];
        let got = self.layer_positions_into(layer, kv_head, &mut v)?;
        v.truncate(got);
        Ok(v)
    }

    pub fn stats(&self) -> Result<Stats> {
        let mut s = ffi::kvp_stats { struct_size: std::mem::size_of::<ffi::kvp_stats>() as u32, ..Default::default() };
        let st = unsafe { ffi::kvp_get_stats(self.handle.as_ptr(), &mut s) };
        self.check(st)?;
        Ok(Stats {
            arena_bytes: s.arena_bytes,
            live_bytes: s.live_bytes,
            peak_live_bytes: s.peak_live_bytes,
            tokens_seen: s.tokens_seen,
            prune_events: s.prune_events,
            tokens_evicted: s.tokens_evicted,
        })
    }

    /// Token slots of `layer` per KV head (`kvp_layer_capacity`); 0 for a layer the cache lacks.
    pub fn layer_capacity(&self, layer: u32) -> u32 {
        unsafe { ffi::kvp_layer_capacity(self.handle.as_ptr(), layer) }
    }

    /// The largest prefill chunk that fits every layer from the current state
    /// (`kvp_prefill_room`): chunk a long prompt by it.
    pub fn prefill_room(&self) -> u32 {
        unsafe { ffi::kvp_prefill_room(self.handle.as_ptr()) }
    }

    /// `kvp_get_layer_stats` of `layer`.
    pub fn layer_stats(&self, layer: u32) -> Result<LayerStats> {
        let mut s =
            ffi::kvp_layer_stats { struct_size: std::mem::size_of::<ffi::kvp_layer_stats>() as u32, ..Default::default() };
        let st = unsafe { ffi::kvp_get_layer_stats(self.handle.as_ptr(), layer, &mut s) };
        self.check(st)?;
        Ok(LayerStats {
            capacity: s.capacity,
            len: s.len,
            live_bytes: s.live_bytes,
            prune_events: s.prune_events,
            tokens_evicted: s.tokens_evicted,
            evict_threshold: s.evict_threshold,
            sparsity: s.sparsity,
            lazy: s.lazy,
            prompt_early: s.prompt_early,
        })
    }

    /// New sequence in the same arena.
    pub fn reset(&mut self) -> Result<()> {
        let s = unsafe { ffi::kvp_reset(self.handle.as_ptr()) };
        self.check(s)
    }

    /// `kvp_query_stats_set`: TriAttention's query statistics of (layer, q_head) for
    /// `tri_stats=given`: `mean` the mean of each pre-RoPE query channel (head_dim values),
    /// `abs_mean` the mean magnitude of each unit (RoPE pairs, then each unrotated channel).
    pub fn query_stats_set(&mut self, layer: u32, q_head: u32, mean: &[f32], abs_mean: &[f32]) -> Result<()> {
        let n = u32::try_from(abs_mean.len()).map_err(|_| arg_error("abs_mean is too long".to_string()))?;
        if mean.len() != self.model.head_dim as usize {
            return Err(arg_error(format!("mean has {} floats, expected head_dim {}", mean.len(), self.model.head_dim)));
        }
        let s = unsafe {
            ffi::kvp_query_stats_set(self.handle.as_ptr(), layer, q_head, mean.as_ptr(), abs_mean.as_ptr(), n)
        };
        self.check(s)
    }

    /// `kvp_prompt_end`: ends the prompt (config `max_prompt` > 0): every layer holding an open
    /// prompt selects from the whole prompt now, as one prefill of it would. Without an open
    /// prompt nothing happens; with a draft open it is [`Status::State`].
    pub fn prompt_end(&mut self) -> Result<()> {
        let s = unsafe { ffi::kvp_prompt_end(self.handle.as_ptr()) };
        self.check(s)
    }

    /// `kvp_draft_begin`: opens a draft (speculative decoding; needs `max_draft` > 0). Until
    /// [`Cache::draft_commit`], prefill and decode only append draft tokens and attend.
    pub fn draft_begin(&mut self) -> Result<()> {
        let s = unsafe { ffi::kvp_draft_begin(self.handle.as_ptr()) };
        self.check(s)
    }

    /// `kvp_draft_commit`: keeps the first `accepted` draft tokens of every layer, drops the
    /// rest, and leaves the cache as one prefill of exactly those tokens would have. No draft
    /// open is [`Status::State`]; more than a layer drafted is [`Status::Arg`] (draft stays open).
    pub fn draft_commit(&mut self, accepted: u32) -> Result<()> {
        let s = unsafe { ffi::kvp_draft_commit(self.handle.as_ptr(), accepted) };
        self.check(s)
    }

    /// `kvp_set_parallel`, raw: from now on the cache's parallel work (the calls that would use
    /// k > 1 of its `threads`) runs as `f(user, k, task, arg)` on the calling thread instead of on
    /// the cache's own workers; `None` restores the default (its own workers with
    /// `thread_pool=own`, the caller alone with `thread_pool=host`). Outputs are bit-identical
    /// either way. Replaces a closure of [`Cache::set_parallel_fn`]. A cache with `threads=1`
    /// never calls `f`. [`Status::Unsupported`] in a library built without threads.
    ///
    /// # Safety
    ///
    /// `f` must keep the contract of [`ffi::kvp_parallel_fn`]: call `task(arg, t)` exactly once
    /// for every t in 0..n (on any threads) and return after all of them returned, without
    /// unwinding. `user` must stay valid for `f` until `f` is replaced or cleared or the cache is
    /// dropped, on whichever thread the cache is used from (the cache is `Send`).
    pub unsafe fn set_parallel(&mut self, f: Option<ffi::kvp_parallel_fn>, user: *mut c_void) -> Result<()> {
        let s = ffi::kvp_set_parallel(self.handle.as_ptr(), f, user);
        self.check(s)?;
        self.free_parallel();
        Ok(())
    }

    /// `kvp_set_parallel` with a Rust closure: every call that would use k > 1 of the cache's
    /// `threads` calls `f(k, run)` on the calling thread instead of waking the cache's workers;
    /// `f` must call `run(t)` for each t in 0..k, on any threads that finish before `f` returns
    /// (e.g. `std::thread::scope`, a pool's scoped spawn, or in a row), and may run them
    /// concurrently: outputs are bit-identical whichever thread runs which t. A t that `f` skips
    /// runs on the calling thread after `f` returns; `run(t)` with t >= k or a t that already ran
    /// panics. A panic of `f` continues in the cache method that called it (the library's call
    /// completes first). Use a cache with `thread_pool=host` so its own workers are not started.
    /// [`Cache::clear_parallel`] restores the default.
    pub fn set_parallel_fn<F>(&mut self, f: F) -> Result<()>
    where
        F: Fn(u32, &(dyn Fn(u32) + Sync)) + Send + 'static,
    {
        let slots = self.config.raw.threads.max(1) as usize;
        let hp = Box::into_raw(Box::new(HostParallel {
            f: Box::new(f),
            done: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            panic: Cell::new(None),
        }));
        let s = unsafe { ffi::kvp_set_parallel(self.handle.as_ptr(), Some(host_parallel_call), hp as *mut c_void) };
        if let Err(e) = self.check(s) {
            drop(unsafe { Box::from_raw(hp) }); // not taken: the library keeps what it had
            return Err(e);
        }
        self.free_parallel(); // the one it replaced
        self.parallel = NonNull::new(hp);
        Ok(())
    }

    /// `kvp_set_parallel(c, NULL, NULL)`: the cache's parallel work goes back to its own workers
    /// (`thread_pool=own`) or to the caller alone (`thread_pool=host`).
    pub fn clear_parallel(&mut self) -> Result<()> {
        unsafe { self.set_parallel(None, ptr::null_mut()) }
    }

    fn free_parallel(&mut self) {
        if let Some(hp) = self.parallel.take() {
            drop(unsafe { Box::from_raw(hp.as_ptr()) });
        }
    }

    /// `kvp_state_size`: bytes [`Cache::state_save`] writes now (0 while the cache cannot be saved).
    pub fn state_size(&self) -> usize {
        unsafe { ffi::kvp_state_size(self.handle.as_ptr()) }
    }

    /// `kvp_state_save` into the caller's `buf` (the library allocates nothing); returns the bytes
    /// written (the state is `buf[..n]`). A too small `buf` is a [`Status::Buffer`] error with
    /// `buf` untouched; an open draft is [`Status::State`]. The cache is never changed.
    pub fn state_save(&self, buf: &mut [u8]) -> Result<usize> {
        let mut written = 0usize;
        let s = unsafe { ffi::kvp_state_save(self.handle.as_ptr(), buf.as_mut_ptr(), buf.len(), &mut written) };
        self.check(s)?;
        Ok(written)
    }

    /// `kvp_state_load`: replaces this cache's state with one [`Cache::state_save`] wrote from a
    /// cache of the same configuration. A truncated, corrupted or foreign state is an error and
    /// the cache is unchanged.
    pub fn state_load(&mut self, buf: &[u8]) -> Result<()> {
        let s = unsafe { ffi::kvp_state_load(self.handle.as_ptr(), buf.as_ptr(), buf.len()) };
        self.check(s)
    }
}

impl<'a> Drop for Cache<'a> {
    fn drop(&mut self) {
        unsafe { ffi::kvp_destroy(self.handle.as_ptr()) };
        self.free_parallel(); // the library no longer calls it
        // An owned `arena` is freed after this, by its own Drop; caller memory goes back to the caller.
    }
}

impl<'a> fmt::Debug for Cache<'a> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache").field("model", &self.model).field("arena_len", &self.arena_len).finish()
    }
}

// ---- RoPE frequency tables (issue 21; kvprune.h kvp_rope_freqs_*) ----

fn rope_table(n: u32, f: impl FnOnce(*mut f64, *mut c_char) -> ffi::kvp_status) -> Result<Vec<f64>> {
    if n == 0 {
        return Err(Error::new(Status::Arg, "n (rope_dim/2 pairs) must be > 0"));
    }
    let mut t = vec![0f64; n as usize];
    let mut buf = [0u8; ERR_LEN];
    let s = f(t.as_mut_ptr(), buf.as_mut_ptr() as *mut c_char);
    check_with_buf(s, &buf)?;
    Ok(t)
}

/// Linear RoPE scaling (position interpolation): `theta^(-i/n) / factor` for the n = rope_dim/2 pairs.
pub fn rope_freqs_linear(n: u32, theta: f64, factor: f64) -> Result<Vec<f64>> {
    rope_table(n, |t, e| unsafe { ffi::kvp_rope_freqs_linear(t, n, theta, factor, e, ERR_LEN) })
}

/// Llama 3.1's RoPE frequency scaling (`kvp_rope_freqs_llama3`).
pub fn rope_freqs_llama3(
    n: u32,
    theta: f64,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_max_position_embeddings: f64,
) -> Result<Vec<f64>> {
    rope_table(n, |t, e| unsafe {
        ffi::kvp_rope_freqs_llama3(
            t,
            n,
            theta,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
            e,
            ERR_LEN,
        )
    })
}

/// YaRN (`kvp_rope_freqs_yarn`): the frequencies and the attention factor (set it as the config
/// key `rope_attn_factor`). The published defaults are beta_fast 32, beta_slow 1.
pub fn rope_freqs_yarn(
    n: u32,
    theta: f64,
    factor: f64,
    original_max_position_embeddings: f64,
    beta_fast: f64,
    beta_slow: f64,
) -> Result<(Vec<f64>, f32)> {
    let mut a = 0f32;
    let t = rope_table(n, |t, e| unsafe {
        ffi::kvp_rope_freqs_yarn(t, n, theta, factor, original_max_position_embeddings, beta_fast, beta_slow, &mut a, e, ERR_LEN)
    })?;
    Ok((t, a))
}

/// `theta^(-i/n) / divisors[i]` (a GGUF `rope_freqs` tensor, LongRoPE factors); n = divisors.len().
pub fn rope_freqs_divided(theta: f64, divisors: &[f32]) -> Result<Vec<f64>> {
    if divisors.len() > u32::MAX as usize {
        return Err(Error::new(Status::Arg, "more than 2^32-1 divisors"));
    }
    let n = divisors.len() as u32;
    rope_table(n, |t, e| unsafe { ffi::kvp_rope_freqs_divided(t, n, theta, divisors.as_ptr(), e, ERR_LEN) })
}
