//! Raw declarations of include/kvprune/kvprune.h (version 0.2). Field order, types and enum
//! values match the header exactly; C enums are `int`-sized on every supported ABI and are
//! declared here as `u32` type aliases with their pinned values as constants.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_void};

pub type kvp_status = u32;
pub const KVP_OK: kvp_status = 0;
pub const KVP_ERR_ARG: kvp_status = 1;
pub const KVP_ERR_CONFIG: kvp_status = 2;
pub const KVP_ERR_ARENA: kvp_status = 3;
pub const KVP_ERR_LAYER: kvp_status = 4;
pub const KVP_ERR_FULL: kvp_status = 5;
pub const KVP_ERR_NONFINITE: kvp_status = 6;
pub const KVP_ERR_STATE: kvp_status = 7;
pub const KVP_ERR_UNSUPPORTED: kvp_status = 8;
pub const KVP_ERR_BUFFER: kvp_status = 9;

pub type kvp_rope_style = u32;
pub const KVP_ROPE_NONE: kvp_rope_style = 0;
pub const KVP_ROPE_NEOX: kvp_rope_style = 1;
pub const KVP_ROPE_GPTJ: kvp_rope_style = 2;

pub type kvp_policy = u32;
pub const KVP_POLICY_FULL: kvp_policy = 0;
pub const KVP_POLICY_WINDOW: kvp_policy = 1;
pub const KVP_POLICY_STREAMING: kvp_policy = 2;
pub const KVP_POLICY_H2O: kvp_policy = 3;
pub const KVP_POLICY_SNAPKV: kvp_policy = 4;
pub const KVP_POLICY_PYRAMIDKV: kvp_policy = 5;
pub const KVP_POLICY_LETHE: kvp_policy = 6;
pub const KVP_POLICY_SIMLAYERKV: kvp_policy = 7;
pub const KVP_POLICY_ASL: kvp_policy = 8;
pub const KVP_POLICY_THINK: kvp_policy = 9;
pub const KVP_POLICY_RANDOM: kvp_policy = 10;
pub const KVP_POLICY_TRIATTENTION: kvp_policy = 11;

pub type kvp_positions = u32;
pub const KVP_POS_DEFAULT: kvp_positions = 0;
pub const KVP_POS_ORIGINAL: kvp_positions = 1;
pub const KVP_POS_REALIGN: kvp_positions = 2;

pub type kvp_dtype = u32;
pub const KVP_DTYPE_F32: kvp_dtype = 0;
pub const KVP_DTYPE_F16: kvp_dtype = 1;
pub const KVP_DTYPE_Q8: kvp_dtype = 2;
pub const KVP_DTYPE_Q4: kvp_dtype = 3;

/// `kvp_io_dtype`: element type of the `_ex` calls' q/k/v/out rows.
pub type kvp_io_dtype = u32;
pub const KVP_IO_F32: kvp_io_dtype = 0;
pub const KVP_IO_F16: kvp_io_dtype = 1;
pub const KVP_IO_BF16: kvp_io_dtype = 2;

pub type kvp_score_mode = u32;
pub const KVP_SCORE_FLOAT: kvp_score_mode = 0;
pub const KVP_SCORE_FIXED: kvp_score_mode = 1;

/// `kvp_thread_pool` (the config key `thread_pool`): whose threads run a call's parallel work.
pub type kvp_thread_pool = u32;
pub const KVP_THREAD_POOL_OWN: kvp_thread_pool = 0;
pub const KVP_THREAD_POOL_HOST: kvp_thread_pool = 1;

pub type kvp_pool = u32;
pub const KVP_POOL_AVG: kvp_pool = 0;
pub const KVP_POOL_MAX: kvp_pool = 1;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct kvp_model {
    pub n_layers: u32,
    pub n_q_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub rope: kvp_rope_style,
    pub rope_dim: u32,
    pub rope_theta: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct kvp_config {
    pub struct_size: u32,
    pub model: kvp_model,
    pub policy: kvp_policy,
    pub capacity: u32,
    pub positions: kvp_positions,
    pub threads: u32,
    pub kv_dtype: kvp_dtype,
    pub score: kvp_score_mode,
    // streaming and window
    pub sinks: u32,
    pub window: u32,
    pub extra: u32,
    pub compress_every: u32,
    pub slack: u32,
    pub max_drop: u32,
    // h2o / snapkv / pyramidkv / asl
    pub budget: u32,
    pub recent: u32,
    pub obs_window: u32,
    pub pool_kernel: u32,
    pub pool: kvp_pool,
    pub beta: f32,
    // lethe
    pub sparse_ratio: f32,
    pub recent_ratio: f32,
    pub segments: u32,
    pub decay: f32,
    // simlayerkv
    pub lazy_threshold: f32,
    pub lazy_last: u32,
    pub lazy_mode: u32,
    pub nonlazy: kvp_policy,
    // asl
    pub asl_min_layer: u32,
    pub asl_obs_layers: u32,
    pub asl_tau: f32,
    // think
    pub key_channel_ratio: f32,
    pub value_channel_ratio: f32,
    pub channel_score: u32,
    // shared block pool
    pub block: u32,
    pub total_capacity: u32,
    // appended in 0.3: lethe, prompt staging
    pub evict_threshold: u32,
    pub prefill_stage: u32,
    // appended for issue 10: ThinK's token policy, quantization group
    pub token_policy: kvp_policy,
    pub quant_group: u32,
    // appended for issue 9: simlayerkv's forced lazy layers (bit mask)
    pub lazy_force: u32,
    // appended for issue 21: speculative decoding, attention scale, logit soft-capping
    pub max_draft: u32,
    pub attn_scale: f32,
    pub logit_softcap: f32,
    // appended for issue 21: RoPE frequencies from the caller (the table goes to kvp_create_rope)
    pub rope_attn_factor: f32,
    pub sliding_window: u32,
    pub sliding_pattern: u32,
    // appended for issue 23: kv_rotate=none (0) | hadamard (1)
    pub kv_rotate: u32,
    // appended for issue 28: whole-prompt selection (kvp_prompt_end)
    pub max_prompt: u32,
    pub max_new: u32,
    pub prompt_scores: u32,
    // appended for issue 32: the random baseline
    pub seed: u32,
    pub keep_prompt: u32,
    // appended for issue 32: TriAttention
    pub tri_mode: u32,
    pub tri_stats: u32,
    // appended for issue 32: DuoAttention's streaming heads (the role table goes to kvp_create_heads)
    pub duo_sink: u32,
    pub duo_window: u32,
    // appended for issue 32: AdaKV's per-head budgets (kvp_head_budget)
    pub head_budget: u32,
    pub ada_floor: f32,
    // appended for issue 30: running on the host's threads (kvp_thread_pool; kvp_set_parallel)
    pub thread_pool: kvp_thread_pool,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kvp_stats {
    pub struct_size: u32,
    pub arena_bytes: u64,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub tokens_seen: u64,
    pub prune_events: u64,
    pub tokens_evicted: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct kvp_layer_stats {
    pub struct_size: u32,
    pub capacity: u32,
    pub len: u32,
    pub live_bytes: u64,
    pub prune_events: u64,
    pub tokens_evicted: u64,
    pub evict_threshold: u32,
    pub sparsity: f32,
    pub lazy: i32,
    pub prompt_early: u32,
}

pub type kvp_key_type = u32;
pub const KVP_KEY_UINT: kvp_key_type = 0;
pub const KVP_KEY_FLOAT: kvp_key_type = 1;
pub const KVP_KEY_ENUM: kvp_key_type = 2;

/// `KVP_POLICY_ALL`: kvp_key_info.policies of a key every policy uses.
pub const KVP_POLICY_ALL: u32 = 0xfff;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_key_info {
    pub struct_size: u32,
    pub name: *const c_char,
    pub type_: kvp_key_type,
    pub min: f64,
    pub max: f64,
    pub default_value: f64,
    pub values: *const c_char,
    pub default_name: *const c_char,
    pub policies: u32,
    pub config_size: u32,
    pub help: *const c_char,
}

#[repr(C)]
#[derive(Debug)]
pub struct kvp_selection {
    pub struct_size: u32,
    pub capacity: u32,
    pub indices: *mut i32,
    pub n: u32,
    pub selected: i32,
}

/// The task a [`kvp_parallel_fn`] runs: `task(arg, t)` once for every t in [0, n).
pub type kvp_parallel_task = unsafe extern "C" fn(arg: *mut c_void, t: u32);

/// `kvp_parallel_fn`: a host's parallel-for, given to `kvp_set_parallel`. It must call
/// `task(arg, t)` exactly once for every t in [0, n) (any threads, concurrently or in a row) and
/// return only after every one of those calls returned; it must not unwind.
pub type kvp_parallel_fn = unsafe extern "C" fn(user: *mut c_void, n: u32, task: kvp_parallel_task, arg: *mut c_void);

/// Opaque cache handle; lives at the start of its arena.
#[repr(C)]
pub struct kvp_cache {
    _private: [u8; 0],
}

extern "C" {
    pub fn kvp_version() -> u32;
    pub fn kvp_status_str(s: kvp_status) -> *const c_char;
    pub fn kvp_config_default(cfg: *mut kvp_config, model: *const kvp_model) -> kvp_status;
    pub fn kvp_config_init(cfg: *mut kvp_config, struct_size: u32, model: *const kvp_model) -> kvp_status;
    pub fn kvp_config_default_ex(cfg: *mut kvp_config, model: *const kvp_model, err: *mut c_char, err_len: usize)
        -> kvp_status;
    pub fn kvp_config_init_ex(
        cfg: *mut kvp_config,
        struct_size: u32,
        model: *const kvp_model,
        err: *mut c_char,
        err_len: usize,
    ) -> kvp_status;
    pub fn kvp_config_apply(cfg: *mut kvp_config, spec: *const c_char, err: *mut c_char, err_len: usize)
        -> kvp_status;
    pub fn kvp_config_check(cfg: *const kvp_config, err: *mut c_char, err_len: usize) -> kvp_status;
    pub fn kvp_arena_size(cfg: *const kvp_config) -> usize;
    pub fn kvp_arena_advise(arena: *mut u8, arena_len: usize) -> kvp_status;
    pub fn kvp_create(cfg: *const kvp_config, arena: *mut u8, arena_len: usize, out: *mut *mut kvp_cache)
        -> kvp_status;
    pub fn kvp_create_ex(
        cfg: *const kvp_config,
        arena: *mut u8,
        arena_len: usize,
        out: *mut *mut kvp_cache,
        err: *mut c_char,
        err_len: usize,
    ) -> kvp_status;
    pub fn kvp_destroy(c: *mut kvp_cache);
    pub fn kvp_reset(c: *mut kvp_cache) -> kvp_status;
    pub fn kvp_prefill(
        c: *mut kvp_cache,
        layer: u32,
        n_tokens: u32,
        positions: *const i32,
        q: *const f32,
        k: *const f32,
        v: *const f32,
        out: *mut f32,
        sel: *mut kvp_selection,
    ) -> kvp_status;
    pub fn kvp_decode(c: *mut kvp_cache, layer: u32, q: *const f32, k: *const f32, v: *const f32, out: *mut f32)
        -> kvp_status;
    pub fn kvp_append(
        c: *mut kvp_cache,
        layer: u32,
        n_tokens: u32,
        positions: *const i32,
        k: *const f32,
        v: *const f32,
    ) -> kvp_status;
    pub fn kvp_prefill_ex(
        c: *mut kvp_cache,
        layer: u32,
        n_tokens: u32,
        positions: *const i32,
        dtype: kvp_io_dtype,
        q: *const u16,
        k: *const u16,
        v: *const u16,
        out: *mut u16,
        sel: *mut kvp_selection,
    ) -> kvp_status;
    pub fn kvp_decode_ex(
        c: *mut kvp_cache,
        layer: u32,
        dtype: kvp_io_dtype,
        q: *const u16,
        k: *const u16,
        v: *const u16,
        out: *mut u16,
    ) -> kvp_status;
    pub fn kvp_append_ex(
        c: *mut kvp_cache,
        layer: u32,
        n_tokens: u32,
        positions: *const i32,
        dtype: kvp_io_dtype,
        k: *const u16,
        v: *const u16,
    ) -> kvp_status;
    pub fn kvp_layer_len(c: *const kvp_cache, layer: u32) -> u32;
    pub fn kvp_layer_positions(c: *const kvp_cache, layer: u32, kv_head: u32, out: *mut i32, cap: u32, n: *mut u32)
        -> kvp_status;
    pub fn kvp_layer_capacity(c: *const kvp_cache, layer: u32) -> u32;
    pub fn kvp_prefill_room(c: *const kvp_cache) -> u32;
    pub fn kvp_get_stats(c: *const kvp_cache, s: *mut kvp_stats) -> kvp_status;
    pub fn kvp_get_layer_stats(c: *const kvp_cache, layer: u32, s: *mut kvp_layer_stats) -> kvp_status;
    pub fn kvp_last_error(c: *const kvp_cache) -> *const c_char;
    pub fn kvp_config_key_count() -> u32;
    pub fn kvp_config_key(index: u32, info: *mut kvp_key_info) -> kvp_status;
    pub fn kvp_draft_begin(c: *mut kvp_cache) -> kvp_status;
    pub fn kvp_prompt_end(c: *mut kvp_cache) -> kvp_status;
    pub fn kvp_query_stats_set(
        c: *mut kvp_cache,
        layer: u32,
        q_head: u32,
        mean: *const f32,
        abs_mean: *const f32,
        n_units: u32,
    ) -> kvp_status;
    pub fn kvp_draft_commit(c: *mut kvp_cache, accepted: u32) -> kvp_status;
    // issue 30: the host's parallel-for (None restores the default)
    pub fn kvp_set_parallel(c: *mut kvp_cache, f: Option<kvp_parallel_fn>, user: *mut c_void) -> kvp_status;
    pub fn kvp_state_size(c: *const kvp_cache) -> usize;
    pub fn kvp_state_save(c: *const kvp_cache, buf: *mut u8, size: usize, written: *mut usize) -> kvp_status;
    pub fn kvp_state_load(c: *mut kvp_cache, buf: *const u8, size: usize) -> kvp_status;
    pub fn kvp_config_key_used(cfg: *const kvp_config, name: *const c_char) -> std::os::raw::c_int;
    // issue 21: RoPE frequencies from the caller
    pub fn kvp_rope_check(cfg: *const kvp_config, inv_freq: *const f64, n: u32, err: *mut c_char, err_len: usize)
        -> kvp_status;
    pub fn kvp_create_rope(
        cfg: *const kvp_config,
        inv_freq: *const f64,
        n: u32,
        arena: *mut u8,
        arena_len: usize,
        out: *mut *mut kvp_cache,
        err: *mut c_char,
        err_len: usize,
    ) -> kvp_status;
    // issue 32 item 2: DuoAttention role tables
    pub fn kvp_arena_size_heads(cfg: *const kvp_config, roles: *const u8, n_roles: u32) -> usize;
    pub fn kvp_create_heads(
        cfg: *const kvp_config,
        inv_freq: *const f64,
        n_freq: u32,
        roles: *const u8,
        n_roles: u32,
        arena: *mut u8,
        arena_len: usize,
        out: *mut *mut kvp_cache,
        err: *mut c_char,
        err_len: usize,
    ) -> kvp_status;
    pub fn kvp_rope_freqs_linear(inv_freq: *mut f64, n: u32, theta: f64, factor: f64, err: *mut c_char, err_len: usize)
        -> kvp_status;
    pub fn kvp_rope_freqs_llama3(
        inv_freq: *mut f64,
        n: u32,
        theta: f64,
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
        err: *mut c_char,
        err_len: usize,
    ) -> kvp_status;
    pub fn kvp_rope_freqs_yarn(
        inv_freq: *mut f64,
        n: u32,
        theta: f64,
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attn_factor: *mut f32,
        err: *mut c_char,
        err_len: usize,
    ) -> kvp_status;
    pub fn kvp_rope_freqs_divided(
        inv_freq: *mut f64,
        n: u32,
        theta: f64,
        divisors: *const f32,
        err: *mut c_char,
        err_len: usize,
    ) -> kvp_status;
}
