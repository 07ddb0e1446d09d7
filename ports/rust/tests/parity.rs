//! Issue 22: the C API in full (prefill_room, layer_capacity, layer_stats, the key table,
//! key_used, get/set, the ASL selection) and values that do not fit the C types. The Python
//! (ports/python/tests/test_parity.py) and Go (ports/go/parity_test.go) suites run the same
//! cases with the same numbers; keep the three in step.
use kvprune::{config_keys, ffi, Cache, Config, KeyType, Model, Rope, Status};

mod common;
use common::Rng;

fn model() -> Model {
    Model::new(2, 4, 2, 16).rope(Rope::Neox, 0, 10000.0)
}

fn status<T>(r: kvprune::Result<T>) -> Option<Status> {
    r.err().map(|e| e.status)
}

#[test]
fn geometry_error_names_the_field() {
    // kvp_config_init_ex: the message names the model field (same case in the three suites)
    let bad = Model::new(2, 6, 4, 16);
    for e in [Config::new(&bad).unwrap_err(), Cache::from_spec(&bad, "policy=window window=8").unwrap_err()] {
        assert_eq!(e.status, Status::Config);
        assert!(e.message.contains("model.n_kv_heads=4 must divide model.n_q_heads=6"), "{}", e);
        assert_eq!(e.message.matches("KVP_ERR").count(), 1, "{}", e);
    }
}

// Model fields are u32 here: Model::new(1 << 32 + 2, ...) does not compile, so the Python cases
// of out-of-range geometry have no Rust counterpart. Config::set takes any f64: same cases.
#[test]
fn config_set_same_cases_as_python_and_go() {
    let mut cfg = Config::from_spec(&model(), "policy=window window=8").unwrap();
    let bad: &[(&str, f64)] = &[
        ("window", 4294967300.0),
        ("window", -1.0),
        ("window", 2.5),
        ("threads", 0.0),
        ("beta", f64::NAN),
        ("beta", 1e300),
        ("nonlazy", 99.0),
        ("lazy_force", 4294967296.0),
        ("no_such_key", 1.0),
    ];
    for &(key, value) in bad {
        assert_eq!(status(cfg.set(key, value)), Some(Status::Config), "{}={}", key, value);
    }
    assert_eq!(cfg.get("window").unwrap(), 8.0, "a refused set changes nothing");
    assert_eq!(cfg.get("threads").unwrap(), 1.0);
    assert_eq!(status(cfg.get("no_such_key")), Some(Status::Config));
    let e = cfg.set("window", 4294967300.0).unwrap_err();
    assert!(e.message.starts_with("KVP_ERR_CONFIG: ") && e.message.contains("window=4294967300"), "{}", e);
    cfg.set("lazy_force", 4294967295.0).unwrap(); // the largest uint32: kept whole
    assert_eq!(cfg.get("lazy_force").unwrap(), 4294967295.0);
    assert_eq!(cfg.raw().lazy_force, u32::MAX);
    cfg.set("lazy_force", 0.0).unwrap();
    cfg.set("beta", 2.5).unwrap();
    assert_eq!(cfg.get("beta").unwrap(), 2.5);
    cfg.set("policy", ffi::KVP_POLICY_H2O as f64).unwrap();
    assert_eq!(cfg.get("policy").unwrap(), ffi::KVP_POLICY_H2O as f64);
    cfg.set("window", 12.0).unwrap();
    cfg.set("policy", ffi::KVP_POLICY_WINDOW as f64).unwrap();
    cfg.check().unwrap();
    let c = Cache::new(&cfg).unwrap();
    assert_eq!(c.layer_capacity(0), 13);
}

#[test]
fn key_table_and_defaults() {
    let keys = config_keys().unwrap();
    let names: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names[0], "policy");
    for want in ["capacity", "window", "budget", "lazy_force", "prefill_stage"] {
        assert!(names.contains(&want), "{}", want);
    }
    let cfg = Config::new(&model()).unwrap();
    for k in &keys {
        if k.config_size == 0 {
            // apply-only (compression_ratio, ratio_tokens): nothing stored
            assert_eq!(status(cfg.get(&k.name)), Some(Status::Config));
            continue;
        }
        let got = cfg.get(&k.name).unwrap();
        if k.key_type == KeyType::Float {
            assert!((got - k.default_value).abs() < 1e-5 * k.default_value.abs().max(1.0), "{}", k.name);
        } else {
            assert_eq!(got, k.default_value, "{}", k.name);
        }
        assert_eq!(k.values.is_some(), k.key_type == KeyType::Enum, "{}", k.name);
        assert!(!k.help.is_empty());
    }
    let pool = keys.iter().find(|k| k.name == "pool").unwrap();
    assert_eq!(pool.values.as_deref(), Some("avg|max"));
    assert_eq!(pool.default_name.as_deref(), Some("max"));
    assert!(pool.policies & (1 << ffi::KVP_POLICY_SNAPKV) != 0);
}

#[test]
fn compression_ratio_through_apply() {
    let mut cfg = Config::from_spec(&model(), "policy=h2o compression_ratio=0.75 ratio_tokens=64").unwrap();
    assert_eq!(cfg.get("budget").unwrap(), 16.0); // keeps 25 % of 64 tokens
    assert_eq!(status(cfg.get("compression_ratio")), Some(Status::Config));
    assert_eq!(status(cfg.set("compression_ratio", 0.5)), Some(Status::Config));
}

#[test]
fn key_used() {
    assert!(!Config::from_spec(&model(), "policy=window window=8").unwrap().key_used("sinks").unwrap());
    assert!(Config::from_spec(&model(), "policy=streaming sinks=4 window=8").unwrap().key_used("sinks").unwrap());
    assert_eq!(status(Config::new(&model()).unwrap().key_used("no_such_key")), Some(Status::Config));
}

#[test]
fn layer_stats_errors_carry_the_message() {
    let cfg = Config::from_spec(&model(), "policy=window window=8").unwrap();
    let c = Cache::new(&cfg).unwrap();
    assert_eq!(c.arena_len(), cfg.arena_size());
    assert_eq!(c.last_error(), "");
    assert_eq!(status(c.layer_stats(2)), Some(Status::Layer));
    assert!(c.last_error().contains("layer"));
}

/// bench/harness/session.cpp: chunk = max(1, min(left, kvp_prefill_room)), every layer per chunk.
#[test]
fn chunk_a_long_prompt_by_prefill_room() {
    let n = 100usize;
    let mut r = Rng(5);
    let (q, k, v) = (r.vec(n * 64), r.vec(n * 32), r.vec(n * 32));
    let mut c = Cache::from_spec(&model(), "policy=streaming sinks=4 window=24 compress_every=8").unwrap();
    assert_eq!(c.layer_capacity(0), 36);
    assert_eq!(c.layer_capacity(2), 0);
    assert_eq!(c.prefill_room(), 36);
    // the whole prompt at once does not fit, and changes nothing
    assert_eq!(status(c.prefill(0, &q, &k, &v, None, None)), Some(Status::Full));
    assert_eq!(c.layer_len(0), 0);
    let (mut done, mut chunks) = (0usize, Vec::new());
    while done < n {
        let room = c.prefill_room() as usize;
        let chunk = (n - done).min(room).max(1);
        for layer in 0..2 {
            let (a, b) = (done, done + chunk);
            c.prefill(layer, &q[a * 64..b * 64], &k[a * 32..b * 32], &v[a * 32..b * 32], None, None).unwrap();
            assert!(c.layer_len(layer) <= c.layer_capacity(layer));
        }
        chunks.push(chunk);
        done += chunk;
    }
    assert!(chunks.len() > 2);
    assert_eq!(chunks.iter().sum::<usize>(), n);
    assert_eq!(c.stats().unwrap().tokens_seen, n as u64);
    let ls = c.layer_stats(1).unwrap();
    assert_eq!((ls.capacity, ls.len), (36, 28));
    assert!(ls.tokens_evicted > 0);
    assert_eq!(ls.lazy, -1);
    let kept = c.layer_positions(1, 0).unwrap();
    assert_eq!(&kept[..4], &[0, 1, 2, 3]);
    assert_eq!(*kept.last().unwrap(), n as i32 - 1);
}

#[test]
fn read_lazy_layers() {
    let mut r = Rng(6);
    let n = 30usize;
    let (q, k, v) = (r.vec(n * 64), r.vec(n * 32), r.vec(n * 32));
    // lazy_force=1: layer 0 lazy (trimmed to sinks + window), layer 1 not, decided at prefill
    let mut c = Cache::from_spec(&model(), "policy=simlayerkv sinks=4 window=8 capacity=64 lazy_force=1").unwrap();
    assert_eq!(c.layer_stats(0).unwrap().lazy, -1);
    for layer in 0..2 {
        c.prefill(layer, &q, &k, &v, None, None).unwrap();
    }
    let (l0, l1) = (c.layer_stats(0).unwrap(), c.layer_stats(1).unwrap());
    assert_eq!((l0.lazy, l0.len), (1, 12));
    assert_eq!((l1.lazy, l1.len), (0, n as u32));
    // lazy_mode=decode: undecided after the prompt, decided by the first decode
    let mut c = Cache::from_spec(&model(), "policy=simlayerkv sinks=4 window=8 capacity=64 lazy_mode=decode").unwrap();
    for layer in 0..2 {
        c.prefill(layer, &q, &k, &v, None, None).unwrap();
    }
    assert_eq!([c.layer_stats(0).unwrap().lazy, c.layer_stats(1).unwrap().lazy], [-1, -1]);
    let mut out = vec![0f32; 64];
    for layer in 0..2 {
        c.decode(layer, &r.vec(64), &r.vec(32), &r.vec(32), &mut out).unwrap();
    }
    for layer in 0..2 {
        let ls = c.layer_stats(layer).unwrap();
        assert!(ls.lazy == 0 || ls.lazy == 1);
        assert_eq!(ls.len, if ls.lazy == 1 { 12 } else { n as u32 + 1 });
        assert!(ls.sparsity.is_finite());
    }
}

#[test]
fn asl_selection() {
    let m = Model::new(4, 4, 2, 16).rope(Rope::Neox, 0, 10000.0);
    let n = 30usize;
    let mut r = Rng(7);
    let (q, k, v) = (r.vec(n * 64), r.vec(n * 32), r.vec(n * 32));
    let mut c = Cache::from_spec(&m, "policy=asl budget=12 obs_window=4 asl_tau=1000000").unwrap();
    let mut idx = vec![0i32; 12];
    let mut out = vec![0f32; n * 64];
    // layer 0 < asl_min_layer = 1: no selection
    let sel = c.prefill_select(0, &q, &k, &v, None, Some(&mut out), &mut idx).unwrap();
    assert!(!sel.selected && sel.n == 0);
    // layer 1 may select up to budget tokens: a smaller buffer is ERR_BUFFER, nothing changed
    let mut small = vec![0i32; 4];
    assert_eq!(status(c.prefill_select(1, &q, &k, &v, None, None, &mut small)), Some(Status::Buffer));
    assert_eq!(c.layer_len(1), 0);
    let sel = c.prefill_select(1, &q, &k, &v, None, None, &mut idx).unwrap();
    assert!(sel.selected);
    assert_eq!(sel.n, 12);
    assert!(idx.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(&idx[8..], &[26, 27, 28, 29], "the observation window is propagated");
    // later layers receive only the selected tokens, at their original positions
    let rows = |x: &[f32], w: usize| -> Vec<f32> {
        idx.iter().flat_map(|&i| x[i as usize * w..(i as usize + 1) * w].to_vec()).collect()
    };
    let (qs, ks, vs) = (rows(&q, 64), rows(&k, 32), rows(&v, 32));
    let mut idx2 = vec![0i32; 12];
    for layer in [2u32, 3] {
        let s2 = c.prefill_select(layer, &qs, &ks, &vs, Some(&idx), None, &mut idx2).unwrap();
        assert!(!s2.selected);
        assert_eq!(c.layer_positions(layer, 1).unwrap(), idx);
    }
}
