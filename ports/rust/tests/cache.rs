//! Integration tests of the safe layer against the real libkvprune.a.
use kvprune::{ffi, Cache, Config, Model, Rope, Status};

mod common;
use common::Rng;

fn model() -> Model {
    Model::new(2, 4, 2, 16).rope(Rope::Neox, 0, 10000.0)
}

#[test]
fn version_matches_header() {
    assert_eq!(kvprune::version(), (0, 2, 0));
}

#[test]
fn config_struct_matches_c_layout() {
    let cfg = Config::new(&model()).unwrap();
    // kvp_config_default writes sizeof(kvp_config) as C sees it.
    assert_eq!(cfg.raw().struct_size as usize, std::mem::size_of::<ffi::kvp_config>());
    assert_eq!(cfg.raw().model.n_q_heads, 4);
    assert_eq!(cfg.raw().model.rope, ffi::KVP_ROPE_NEOX);
    assert_eq!(cfg.raw().threads, 1);
    assert_eq!(cfg.raw().policy, ffi::KVP_POLICY_FULL);
}

#[test]
fn spec_keys_land_in_their_fields() {
    // One key at a time, each to a distinctive value: checks every field offset of the repr(C)
    // struct against the C library's own writes. Keys this version reports as unsupported are skipped.
    type Get = fn(&ffi::kvp_config) -> f64;
    let cases: &[(&str, f64, Get)] = &[
        ("capacity=777", 777.0, |c| c.capacity as f64),
        ("positions=original", ffi::KVP_POS_ORIGINAL as f64, |c| c.positions as f64),
        ("threads=3", 3.0, |c| c.threads as f64),
        ("sinks=5", 5.0, |c| c.sinks as f64),
        ("window=17", 17.0, |c| c.window as f64),
        ("extra=3", 3.0, |c| c.extra as f64),
        ("compress_every=6", 6.0, |c| c.compress_every as f64),
        ("slack=11", 11.0, |c| c.slack as f64),
        ("max_drop=9", 9.0, |c| c.max_drop as f64),
        ("budget=33", 33.0, |c| c.budget as f64),
        ("recent=13", 13.0, |c| c.recent as f64),
        ("obs_window=7", 7.0, |c| c.obs_window as f64),
        ("pool_kernel=5", 5.0, |c| c.pool_kernel as f64),
        ("pool=max", ffi::KVP_POOL_MAX as f64, |c| c.pool as f64),
        ("beta=2.5", 2.5, |c| c.beta as f64),
        ("sparse_ratio=123", 123.0, |c| c.sparse_ratio as f64),
        ("recent_ratio=0.25", 0.25, |c| c.recent_ratio as f64),
        ("segments=12", 12.0, |c| c.segments as f64),
        ("decay=0.75", 0.75, |c| c.decay as f64),
        ("lazy_threshold=0.5", 0.5, |c| c.lazy_threshold as f64),
        ("lazy_last=3", 3.0, |c| c.lazy_last as f64),
        ("asl_min_layer=1", 1.0, |c| c.asl_min_layer as f64),
        ("asl_obs_layers=6", 6.0, |c| c.asl_obs_layers as f64),
        ("asl_tau=0.125", 0.125, |c| c.asl_tau as f64),
        ("lazy_force=5", 5.0, |c| c.lazy_force as f64),
        ("max_draft=6", 6.0, |c| c.max_draft as f64),
        ("attn_scale=0.0625", 0.0625, |c| c.attn_scale as f64),
        ("logit_softcap=50", 50.0, |c| c.logit_softcap as f64),
        ("key_channel_ratio=0.375", 0.375, |c| c.key_channel_ratio as f64),
        ("value_channel_ratio=0.25", 0.25, |c| c.value_channel_ratio as f64),
        ("policy=streaming", ffi::KVP_POLICY_STREAMING as f64, |c| c.policy as f64),
    ];
    let mut checked = 0;
    for (spec, want, get) in cases {
        let mut cfg = Config::new(&model()).unwrap();
        match cfg.apply(spec) {
            Ok(()) => {
                assert_eq!(get(cfg.raw()), *want, "{}", spec);
                checked += 1;
            }
            Err(e) if e.status == Status::Unsupported => {}
            Err(e) => panic!("{}: {}", spec, e),
        }
    }
    assert!(checked >= 10, "only {} keys accepted", checked);
}

#[test]
fn bad_specs_are_errors_and_leave_config_unchanged() {
    let mut cfg = Config::from_spec(&model(), "policy=streaming sinks=4 window=60").unwrap();
    let before = cfg;
    let e = cfg.apply("sinks=8 no_such_key=1").unwrap_err();
    assert_eq!(e.status, Status::Config);
    assert!(e.message.contains("no_such_key"), "message: {}", e.message);
    assert_eq!(cfg, before, "apply is all-or-nothing");
    let e = cfg.apply("window=abc").unwrap_err();
    assert_eq!(e.status, Status::Config);
    assert!(e.message.contains("window"), "message: {}", e.message);
    assert!(cfg.apply("policy=nonsense").is_err());
    assert!(cfg.apply("sinks=1\0").is_err());
    assert_eq!(cfg, before);
    // Errors format with the status name.
    assert!(format!("{}", e).contains("KVP_ERR_CONFIG"), "{}", e);
}

#[test]
fn bad_model_is_a_config_error() {
    let e = Config::new(&Model::new(2, 3, 2, 16)).unwrap_err();
    assert_eq!(e.status, Status::Config);
    let e = Config::new(&Model::new(0, 4, 2, 16)).unwrap_err();
    assert_eq!(e.status, Status::Config);
}

#[test]
fn single_token_attention_returns_its_value() {
    let m = model();
    let mut c = Cache::from_spec(&m, "policy=full capacity=64").unwrap();
    let mut r = Rng(7);
    let (q, k, v) = (r.vec(4 * 16), r.vec(2 * 16), r.vec(2 * 16));
    let mut out = vec![0f32; 4 * 16];
    c.decode(0, &q, &k, &v, &mut out).unwrap();
    // Softmax over one key is 1: query head h gets V row of KV head h / 2.
    for h in 0..4 {
        for j in 0..16 {
            let want = v[(h / 2) * 16 + j];
            assert!((out[h * 16 + j] - want).abs() <= 1e-6 * want.abs().max(1.0), "h{} j{}", h, j);
        }
    }
}

#[test]
fn streaming_decode_prunes_and_counts() {
    let m = model();
    let mut c = Cache::from_spec(&m, "policy=streaming sinks=4 window=16 compress_every=4").unwrap();
    assert!(c.arena_len() > 0);
    let mut r = Rng(42);
    let mut out = vec![0f32; 4 * 16];
    let steps = 100;
    for _ in 0..steps {
        for layer in 0..2 {
            let (q, k, v) = (r.vec(4 * 16), r.vec(2 * 16), r.vec(2 * 16));
            c.decode(layer, &q, &k, &v, &mut out).unwrap();
            assert!(out.iter().all(|x| x.is_finite()));
        }
    }
    let mut live = 0u64;
    for layer in 0..2 {
        let len = c.layer_len(layer);
        assert!(len >= 20 && len < 20 + 4, "layer {} keeps {}", layer, len);
        for h in 0..2 {
            let pos = c.layer_positions(layer, h).unwrap();
            assert_eq!(&pos[..4], &[0, 1, 2, 3], "sinks kept");
            assert_eq!(*pos.last().unwrap(), steps - 1, "newest kept");
            assert!(pos.windows(2).all(|w| w[0] < w[1]), "ascending");
            let tail = &pos[4..];
            assert!(tail.windows(2).all(|w| w[1] == w[0] + 1), "recent window contiguous: {:?}", pos);
            live += pos.len() as u64 * 16 * 4 * 2;
        }
    }
    let s = c.stats().unwrap();
    assert_eq!(s.tokens_seen, steps as u64);
    assert!(s.prune_events > 0);
    assert!(s.tokens_evicted > 0);
    assert_eq!(s.live_bytes, live, "f32 K+V rows of the kept tokens");
    assert!(s.peak_live_bytes >= s.live_bytes);
    assert_eq!(s.arena_bytes as usize, c.arena_len());
    // Too small an output slice is the library's KVP_ERR_FULL.
    let mut small = [0i32; 2];
    assert_eq!(c.layer_positions_into(0, 0, &mut small).unwrap_err().status, Status::Buffer);

    c.reset().unwrap();
    assert_eq!(c.layer_len(0), 0);
    let s = c.stats().unwrap();
    assert_eq!((s.tokens_seen, s.prune_events, s.live_bytes), (0, 0, 0));
}

#[test]
fn prefill_matches_token_by_token_decode() {
    let m = model();
    let mut a = Cache::from_spec(&m, "policy=full capacity=64").unwrap();
    let mut b = Cache::from_spec(&m, "policy=full capacity=64").unwrap();
    let mut r = Rng(3);
    let n = 8;
    let (q, k, v) = (r.vec(n * 64), r.vec(n * 32), r.vec(n * 32));
    let mut out_a = vec![0f32; n * 64];
    a.prefill(0, &q, &k, &v, None, Some(&mut out_a)).unwrap();
    let mut out_b = vec![0f32; 64];
    for t in 0..n {
        b.decode(0, &q[t * 64..(t + 1) * 64], &k[t * 32..(t + 1) * 32], &v[t * 32..(t + 1) * 32], &mut out_b)
            .unwrap();
        for j in 0..64 {
            let (x, y) = (out_a[t * 64 + j], out_b[j]);
            assert!((x - y).abs() <= 1e-5, "token {} j {}: {} vs {}", t, j, x, y);
        }
    }
    assert_eq!(a.layer_positions(0, 1).unwrap(), (0..n as i32).collect::<Vec<_>>());
    // append with explicit positions, then a prefill chunk without attention output.
    a.append(1, &k[..64], &v[..64], Some(&[10, 20])).unwrap();
    assert_eq!(a.layer_positions(1, 0).unwrap(), vec![10, 20]);
    a.prefill(1, &q[..64], &k[..32], &v[..32], None, None).unwrap();
    assert_eq!(a.layer_positions(1, 0).unwrap(), vec![10, 20, 21]);
    let sel = a.prefill_select(1, &q[..64], &k[..32], &v[..32], None, None, &mut [0; 4]).unwrap();
    assert_eq!(sel.n, 0, "only ASL selects");
    assert!(!sel.selected);
}

#[test]
fn bad_input_is_rejected_without_change() {
    let m = model();
    let mut c = Cache::from_spec(&m, "policy=full capacity=4").unwrap();
    let mut r = Rng(9);
    let (q, k, v) = (r.vec(64), r.vec(32), r.vec(32));
    let mut out = vec![0f32; 64];
    c.decode(0, &q, &k, &v, &mut out).unwrap();

    // Slice sizes are checked by the binding.
    let e = c.decode(0, &q[..63], &k, &v, &mut out).unwrap_err();
    assert_eq!(e.status, Status::Arg);
    assert!(e.message.contains("q has 63"), "{}", e.message);
    assert_eq!(c.decode(0, &q, &k, &v, &mut out[..10]).unwrap_err().status, Status::Arg);
    assert_eq!(c.prefill(0, &q, &k, &v[..16], None, None).unwrap_err().status, Status::Arg);
    assert_eq!(c.append(0, &k, &v, Some(&[1, 2])).unwrap_err().status, Status::Arg);
    assert_eq!(c.append(0, &[], &[], None).unwrap_err().status, Status::Arg);

    // The library's checks: layer range, NaN/Inf, positions, capacity.
    let e = c.decode(5, &q, &k, &v, &mut out).unwrap_err();
    assert_eq!(e.status, Status::Layer);
    assert!(!e.message.is_empty());
    assert_eq!(c.last_error(), e.message);
    let mut bad = k.clone();
    bad[3] = f32::NAN;
    assert_eq!(c.decode(0, &q, &bad, &v, &mut out).unwrap_err().status, Status::NonFinite);
    let mut badq = q.clone();
    badq[0] = f32::INFINITY;
    assert_eq!(c.decode(0, &badq, &k, &v, &mut out).unwrap_err().status, Status::NonFinite);
    assert_eq!(c.append(0, &k, &v, Some(&[0])).unwrap_err().status, Status::Arg, "position not after the last");
    assert_eq!(c.layer_len(0), 1, "failed calls change nothing");
    assert_eq!(c.layer_positions(0, 0).unwrap(), vec![0]);
    assert_eq!(c.stats().unwrap().tokens_seen, 1);

    for _ in 0..3 {
        c.decode(0, &q, &k, &v, &mut out).unwrap();
    }
    let e = c.decode(0, &q, &k, &v, &mut out).unwrap_err();
    assert_eq!(e.status, Status::Full);
    assert_eq!(c.layer_len(0), 4);
    assert_eq!(c.layer_positions(5, 0).unwrap_err().status, Status::Layer);
    assert_eq!(c.layer_positions(0, 2).unwrap_err().status, Status::Layer);
    assert_eq!(c.layer_len(9), 0);
}

#[test]
fn invalid_config_fails_at_create() {
    let mut cfg = Config::from_spec(&model(), "policy=streaming sinks=4 window=16").unwrap();
    cfg.raw_mut().capacity = 3; // below what streaming needs
    assert_eq!(cfg.arena_size(), 0);
    let e = Cache::new(&cfg).unwrap_err();
    assert!(e.status == Status::Config || e.status == Status::Unsupported, "{:?}", e);
    assert!(!e.message.is_empty());
}

#[test]
fn cache_moves_to_another_thread() {
    let m = model();
    let mut c = Cache::from_spec(&m, "policy=window window=8 threads=2").unwrap();
    let h = std::thread::spawn(move || {
        let mut r = Rng(11);
        let mut out = vec![0f32; 64];
        for _ in 0..20 {
            for layer in 0..2 {
                c.decode(layer, &r.vec(64), &r.vec(32), &r.vec(32), &mut out).unwrap();
            }
        }
        c.layer_positions(1, 1).unwrap()
    });
    let pos = h.join().unwrap();
    assert_eq!(*pos.last().unwrap(), 19);
    assert!(pos.len() >= 8);
}

// Issue 11: a valid configuration whose arena cannot be allocated is an error, not an abort.
#[test]
fn huge_arena_is_an_arena_error() {
    // 15 layers x 64 KV heads x 2^28 slots x 1024 halves x (K+V): about 2^50 bytes, beyond any
    // address space, yet a valid configuration with an exact arena size (f16 storage keeps a slot
    // space per KV head's pool, 15 x 2^28 slots, below the 2^32 slot ids allow; f32 storage numbers
    // all pools' slots in one space, which this geometry would exceed: a config error).
    let m = Model::new(15, 64, 64, 1024);
    let cfg = Config::from_spec(&m, "capacity=268435456 kv_dtype=f16").unwrap();
    let n = cfg.arena_size();
    assert!(n > (1usize << 48), "arena {}", n);
    let e = Cache::new(&cfg).unwrap_err();
    assert_eq!(e.status, Status::Arena);
    assert!(e.message.contains("cannot allocate"), "{}", e.message);
}

// One message format, never doubled; kvp_create_ex explains create failures.
#[test]
fn error_text_is_not_doubled() {
    let m = model();
    let mut c = Cache::from_spec(&m, "policy=window window=8").unwrap();
    let (q, k, v) = (vec![0.1f32; 4 * 16], vec![0.2f32; 2 * 16], vec![0.3f32; 2 * 16]);
    let mut out = vec![0f32; 4 * 16];
    let e = c.decode(9, &q, &k, &v, &mut out).unwrap_err();
    let shown = format!("{}", e);
    assert!(shown.starts_with("KVP_ERR_LAYER: "), "{}", shown);
    assert_eq!(shown.matches("KVP_ERR").count(), 1, "{}", shown);
    let e = Config::from_spec(&m, "bogus=1").unwrap_err();
    assert_eq!(format!("{}", e).matches("KVP_ERR").count(), 1, "{}", e);
    let e = c.decode(0, &q[..3], &k, &v, &mut out).unwrap_err();
    assert!(format!("{}", e).starts_with("KVP_ERR_ARG: "), "{}", e);
    let mut cfg = Config::from_spec(&m, "policy=window window=8").unwrap();
    cfg.raw_mut().capacity = 3;
    let e = Cache::new(&cfg).unwrap_err();
    assert_eq!(e.status, Status::Config);
    assert!(e.message.contains("capacity"), "{}", e.message);
    assert!(!e.message.contains("NULL cache"), "{}", e.message);
}
