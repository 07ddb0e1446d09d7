//! Issue 21 through the Rust binding: draft rollback against a twin, state save/load, errors.
use kvprune::{Cache, Config, Model, Rope, Status};

mod common;
use common::Rng;

const NQ: usize = 4;
const NKV: usize = 2;
const HD: usize = 16;
const SPEC: &str = "policy=streaming sinks=2 window=6 capacity=32 max_draft=4";

fn model() -> Model {
    Model::new(2, NQ as u32, NKV as u32, HD as u32).rope(Rope::Neox, 0, 10000.0)
}

/// q, k, v of n tokens.
fn tokens(r: &mut Rng, n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (r.vec(n * NQ * HD), r.vec(n * NKV * HD), r.vec(n * NKV * HD))
}

fn prefill_all(c: &mut Cache, t: &(Vec<f32>, Vec<f32>, Vec<f32>)) {
    for layer in 0..2 {
        c.prefill(layer, &t.0, &t.1, &t.2, None, None).unwrap();
    }
}

/// First `n` tokens of a token batch.
fn head(t: &(Vec<f32>, Vec<f32>, Vec<f32>), n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (t.0[..n * NQ * HD].to_vec(), t.1[..n * NKV * HD].to_vec(), t.2[..n * NKV * HD].to_vec())
}

/// Output bits of one decode step in every layer.
fn decode_bits(c: &mut Cache, seed: u64) -> Vec<u32> {
    let mut r = Rng(seed);
    let mut bits = Vec::new();
    for layer in 0..2 {
        let (q, k, v) = tokens(&mut r, 1);
        let mut out = vec![0f32; NQ * HD];
        c.decode(layer, &q, &k, &v, &mut out).unwrap();
        bits.extend(out.iter().map(|x| x.to_bits()));
    }
    bits
}

fn kept(c: &Cache) -> Vec<(u32, Vec<i32>)> {
    let mut all = Vec::new();
    for layer in 0..2 {
        for h in 0..NKV as u32 {
            all.push((c.layer_len(layer), c.layer_positions(layer, h).unwrap()));
        }
    }
    all
}

fn state(c: &Cache) -> Vec<u8> {
    let mut buf = vec![0u8; c.state_size()];
    let n = c.state_save(&mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn draft_commit_equals_a_twin_that_prefilled_the_accepted_tokens() {
    let cfg = Config::from_spec(&model(), SPEC).unwrap();
    assert_eq!(cfg.get("max_draft").unwrap(), 4.0);
    let mut r = Rng(0x2b7e_1516);
    let prompt = tokens(&mut r, 9);
    let draft = tokens(&mut r, 3);
    let (mut c, mut twin) = (Cache::new(&cfg).unwrap(), Cache::new(&cfg).unwrap());
    prefill_all(&mut c, &prompt);
    prefill_all(&mut twin, &prompt);

    c.draft_begin().unwrap();
    for layer in 0..2 {
        let mut out = vec![0f32; 3 * NQ * HD];
        c.prefill(layer, &draft.0, &draft.1, &draft.2, None, Some(&mut out)).unwrap();
    }
    c.draft_commit(2).unwrap();
    prefill_all(&mut twin, &head(&draft, 2));

    assert_eq!(kept(&c), kept(&twin));
    assert_eq!(c.stats().unwrap(), twin.stats().unwrap());
    assert_eq!(decode_bits(&mut c, 77), decode_bits(&mut twin, 77));
    assert_eq!(kept(&c), kept(&twin));
}

#[test]
fn state_save_load_continues_bit_identically() {
    let cfg = Config::from_spec(&model(), SPEC).unwrap();
    let mut r = Rng(0x9e37_79b9);
    let mut c = Cache::new(&cfg).unwrap();
    prefill_all(&mut c, &tokens(&mut r, 11));
    decode_bits(&mut c, 5);
    let n = c.state_size();
    assert!(n > 0);
    // A too small buffer: KVP_ERR_BUFFER, the buffer untouched.
    let mut small = vec![0xa5u8; n - 1];
    assert_eq!(c.state_save(&mut small).unwrap_err().status, Status::Buffer);
    assert!(small.iter().all(|&b| b == 0xa5));
    let saved = state(&c);
    assert_eq!(saved.len(), n);

    let mut fresh = Cache::new(&cfg).unwrap();
    fresh.state_load(&saved).unwrap();
    assert_eq!(kept(&fresh), kept(&c));
    assert_eq!(state(&fresh), saved);
    for step in 0..3 {
        assert_eq!(decode_bits(&mut fresh, 100 + step), decode_bits(&mut c, 100 + step), "step {}", step);
    }
    assert_eq!(kept(&fresh), kept(&c));
}

#[test]
fn draft_and_state_errors_leave_the_cache_unchanged() {
    let cfg = Config::from_spec(&model(), SPEC).unwrap();
    let mut r = Rng(0x1234_5678);
    let mut c = Cache::new(&cfg).unwrap();
    prefill_all(&mut c, &tokens(&mut r, 5));
    let before = state(&c);

    // Commit without begin: KVP_ERR_STATE, with the library's message.
    let e = c.draft_commit(0).unwrap_err();
    assert_eq!(e.status, Status::State);
    assert!(e.message.starts_with("KVP_ERR_STATE"), "{}", e.message);
    assert_eq!(state(&c), before);

    // Begin twice: KVP_ERR_STATE; accepted above the drafted count: KVP_ERR_ARG, draft stays open.
    c.draft_begin().unwrap();
    assert_eq!(c.draft_begin().unwrap_err().status, Status::State);
    let d = tokens(&mut r, 2);
    prefill_all(&mut c, &d);
    assert_eq!(c.draft_commit(3).unwrap_err().status, Status::Arg);
    // Save and load refuse an open draft.
    let mut buf = vec![0u8; before.len() * 2 + 4096];
    assert_eq!(c.state_save(&mut buf).unwrap_err().status, Status::State);
    assert_eq!(c.state_load(&before).unwrap_err().status, Status::State);
    c.draft_commit(0).unwrap();
    assert_eq!(state(&c), before, "commit(0) restores the state at begin");

    // A truncated or corrupted state: an error, the target unchanged.
    let mut other = Cache::new(&cfg).unwrap();
    prefill_all(&mut other, &tokens(&mut r, 3));
    let other_before = state(&other);
    let e = other.state_load(&before[..before.len() - 1]).unwrap_err();
    assert_eq!(e.status, Status::Arg, "{}", e);
    assert_eq!(other.state_load(&before[..16]).unwrap_err().status, Status::Arg);
    let mut bad = before.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 1;
    assert_eq!(other.state_load(&bad).unwrap_err().status, Status::Arg);
    assert_eq!(state(&other), other_before);

    // A state of another configuration: KVP_ERR_CONFIG; a cache without max_draft: no drafts.
    let mut nodraft = Cache::from_spec(&model(), "policy=streaming sinks=2 window=6 capacity=32").unwrap();
    assert_eq!(nodraft.state_load(&before).unwrap_err().status, Status::Config);
    assert_eq!(nodraft.draft_begin().unwrap_err().status, Status::Config);
    assert_eq!(nodraft.layer_len(0), 0);
}

/// Issue 28: a prompt in chunks with `max_prompt` keeps what one call keeps (`prompt_end`).
#[test]
fn chunked_prompt_with_max_prompt_keeps_what_one_call_keeps() {
    let spec = "policy=snapkv budget=12 obs_window=4 recent=2 max_prompt=64";
    let cfg = Config::from_spec(&model(), spec).unwrap();
    assert_eq!(cfg.get("max_prompt").unwrap(), 64.0);
    // the papers' defaults' keys (issue 28 item 2) reach the struct this binding mirrors
    let gen = Config::from_spec(&model(), "policy=snapkv budget=12 obs_window=4 max_new=5").unwrap();
    assert_eq!(gen.get("max_new").unwrap(), 5.0);
    let h2o = Config::from_spec(&model(), "policy=h2o budget=8 prompt_scores=window obs_window=4").unwrap();
    assert_eq!(h2o.get("prompt_scores").unwrap(), 1.0);
    assert_eq!(h2o.get("obs_window").unwrap(), 4.0);
    // issue 32's random baseline: its keys sit after prompt_scores in the mirrored struct
    let rnd = Config::from_spec(&model(), "policy=random budget=6 seed=9 keep_prompt=0").unwrap();
    assert_eq!((rnd.get("seed").unwrap(), rnd.get("keep_prompt").unwrap()), (9.0, 0.0));
    let tri = Config::from_spec(&model(), "policy=triattention budget=6 beta=3 tri_mode=per_head").unwrap();
    assert_eq!((tri.get("beta").unwrap(), tri.get("budget").unwrap(), tri.get("tri_mode").unwrap()), (3.0, 6.0, 1.0));
    // kvp_query_stats_set: 16 NeoX channels = 8 units; tri_stats=given only
    let given = Config::from_spec(&model(), "policy=triattention budget=6 beta=3 tri_stats=given").unwrap();
    let mut g = Cache::new(&given).unwrap();
    g.query_stats_set(1, 3, &[0.1; HD], &[0.5; 8]).unwrap();
    assert_eq!(g.query_stats_set(0, 0, &[0.1; HD], &[0.5; 7]).unwrap_err().status, Status::Arg);
    let online = Config::from_spec(&model(), "policy=triattention").unwrap();
    assert_eq!(Cache::new(&online).unwrap().query_stats_set(0, 0, &[0.1; HD], &[0.5; 8]).unwrap_err().status, Status::Config);
    let mut r = Rng(0x5eed_0028);
    let prompt = tokens(&mut r, 40);
    let (mut one, mut chunked) = (Cache::new(&cfg).unwrap(), Cache::new(&cfg).unwrap());
    prefill_all(&mut one, &prompt);
    for t in (0..40).step_by(7) {
        let n = if 40 - t < 7 { 40 - t } else { 7 };
        let part = (
            prompt.0[t * NQ * HD..(t + n) * NQ * HD].to_vec(),
            prompt.1[t * NKV * HD..(t + n) * NKV * HD].to_vec(),
            prompt.2[t * NKV * HD..(t + n) * NKV * HD].to_vec(),
        );
        prefill_all(&mut chunked, &part);
    }
    assert_eq!(chunked.layer_len(0), 40); // held whole until the prompt ends
    one.prompt_end().unwrap();
    chunked.prompt_end().unwrap();
    assert_eq!(one.layer_len(0), 12);
    assert_eq!(kept(&one), kept(&chunked));
    assert_eq!(chunked.layer_stats(0).unwrap().prompt_early, 0);
    assert_eq!(decode_bits(&mut one, 5), decode_bits(&mut chunked, 5));
}

// issue 32 item 2: a DuoAttention role table (kvp_create_heads). Layer 0's KV head 0 and layer
// 1's KV head 1 stream (duo_sink 2, duo_window 6): they keep 8 tokens, the others all 20; the
// arena is smaller than the uniform one; a state refuses a cache with another table.
#[test]
fn duo_heads_stream_and_shrink_the_arena() {
    use kvprune::{HEAD_RETRIEVAL as R, HEAD_STREAMING as S};
    let cfg = Config::from_spec(&model(), "policy=full capacity=64 duo_sink=2 duo_window=6").unwrap();
    assert_eq!((cfg.get("duo_sink").unwrap(), cfg.get("duo_window").unwrap()), (2.0, 6.0));
    let roles = [S, R, R, S];
    assert!(cfg.arena_size_heads(&roles) < cfg.arena_size());
    assert_eq!(cfg.arena_size_heads(&[R; 4]), cfg.arena_size());
    assert_eq!(cfg.arena_size_heads(&roles[..3]), 0);
    let mut c = Cache::with_heads(&cfg, None, &roles).unwrap();
    let mut r = Rng(0x5eed_0032);
    for _ in 0..20 {
        decode_bits(&mut c, r.0);
        r.next();
    }
    let want: Vec<i32> = (0..2).chain(14..20).collect();
    assert_eq!(c.layer_positions(0, 0).unwrap(), want);
    assert_eq!(c.layer_positions(1, 1).unwrap(), want);
    assert_eq!(c.layer_positions(0, 1).unwrap().len(), 20);
    let e = Cache::with_heads(&cfg, None, &[S, R, 2, R]).unwrap_err();
    assert_eq!(e.status, Status::Config);
    assert!(e.message.contains("roles[2]=2"), "{}", e.message);
    let mut other = Cache::with_heads(&cfg, None, &[R, S, S, R]).unwrap();
    assert_eq!(other.state_load(&state(&c)).unwrap_err().status, Status::Config);
}

// issue 32 item 1: AdaKV's per-head budgets (head_budget=ada) reach the struct this binding mirrors,
// and a cache with them runs.
#[test]
fn ada_head_budget_reaches_the_struct() {
    let cfg = Config::from_spec(&model(), "policy=snapkv budget=8 obs_window=2 head_budget=ada ada_floor=0.5").unwrap();
    assert_eq!((cfg.get("head_budget").unwrap(), cfg.get("ada_floor").unwrap()), (1.0, 0.5));
    assert_eq!((cfg.raw().head_budget, cfg.raw().ada_floor), (1, 0.5));
    let mut c = Cache::new(&cfg).unwrap();
    let mut r = Rng(0x5eed_0132);
    for _ in 0..12 {
        decode_bits(&mut c, r.0);
        r.next();
    }
    assert_eq!(c.layer_positions(0, 0).unwrap().len(), 12);
}
