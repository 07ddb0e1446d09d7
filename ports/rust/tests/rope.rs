//! Issue 21 item 3 through the Rust binding: RoPE frequency tables and the attention factor.
use kvprune::{rope_freqs_divided, rope_freqs_linear, rope_freqs_llama3, rope_freqs_yarn, Cache, Config, Model, Rope, Status};

const NQ: usize = 4;
const NKV: usize = 2;
const HD: usize = 16;

fn vec(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 55) as i32 - 256) as f32 / 256.0
        })
        .collect()
}

fn run(c: &mut Cache, seed: u64) -> Vec<f32> {
    let mut res = Vec::new();
    let mut out = vec![0f32; NQ * HD];
    for t in 0..20u64 {
        let (q, k, v) = (vec(seed + 3 * t, NQ * HD), vec(seed + 3 * t + 1, NKV * HD), vec(seed + 3 * t + 2, NKV * HD));
        c.decode(0, &q, &k, &v, &mut out).unwrap();
        res.extend_from_slice(&out);
    }
    res
}

#[test]
fn helpers_follow_the_formulas() {
    let (n, theta) = (8u32, 10000f64);
    let base: Vec<f64> = (0..n).map(|i| theta.powf(-(i as f64) / n as f64)).collect();
    let lin = rope_freqs_linear(n, theta, 4.0).unwrap();
    for (a, b) in lin.iter().zip(&base) {
        assert!((a - b / 4.0).abs() <= 1e-13 * b);
    }
    let l3 = rope_freqs_llama3(n, theta, 8.0, 1.0, 4.0, 64.0).unwrap();
    for (a, f) in l3.iter().zip(&base) {
        let wl = 2.0 * std::f64::consts::PI / f;
        let want = if wl < 16.0 {
            *f
        } else if wl > 64.0 {
            f / 8.0
        } else {
            let s = (64.0 / wl - 1.0) / 3.0;
            (1.0 - s) * f / 8.0 + s * f
        };
        assert!((a - want).abs() <= 1e-13 * f);
    }
    let (y, att) = rope_freqs_yarn(n, theta, 4.0, 256.0, 32.0, 1.0).unwrap();
    assert!((att as f64 - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-6);
    assert_eq!(y[0], base[0]);
    let d = rope_freqs_divided(theta, &[2.0; 8]).unwrap();
    assert!((d[5] - base[5] / 2.0).abs() <= 1e-13 * base[5]);
    let e = rope_freqs_linear(n, 1.0, 2.0).unwrap_err();
    assert_eq!(e.status, Status::Config);
    assert!(e.to_string().contains("theta=1"), "{}", e);
    assert!(rope_freqs_yarn(n, theta, 4.0, 256.0, 1.0, 2.0).is_err());
    assert_eq!(rope_freqs_linear(0, theta, 2.0).unwrap_err().status, Status::Arg);
}

#[test]
fn the_table_is_used() {
    let m = Model::new(1, NQ as u32, NKV as u32, HD as u32).rope(Rope::Neox, 0, 10000.0);
    let m2 = Model::new(1, NQ as u32, NKV as u32, HD as u32).rope(Rope::Neox, 0, 977.0);
    let tab: Vec<f64> = (0..HD / 2).map(|i| (977f32 as f64).powf(-2.0 * i as f64 / HD as f64)).collect();
    let spec = "policy=full capacity=32";
    let mut a = Cache::with_rope_freqs(&Config::from_spec(&m, spec).unwrap(), Some(&tab)).unwrap();
    let mut b = Cache::from_spec(&m2, spec).unwrap();
    let mut c = Cache::from_spec(&m, spec).unwrap();
    let (ra, rb, rc) = (run(&mut a, 5), run(&mut b, 5), run(&mut c, 5));
    assert_eq!(ra, rb);
    assert_ne!(ra, rc);
    let e = Cache::with_rope_freqs(&Config::from_spec(&m, spec).unwrap(), Some(&tab[..7])).unwrap_err();
    assert_eq!(e.status, Status::Config);
    assert!(e.to_string().contains("rope_dim/2=8"), "{}", e);
    let mut cfg = Config::from_spec(&m, spec).unwrap();
    cfg.set("rope_attn_factor", 1.25).unwrap();
    assert!(cfg.set("rope_attn_factor", 0.0).is_err());
    cfg.rope_check(&tab).unwrap();
    cfg.rope_check(&[]).unwrap();
    assert_eq!(cfg.rope_check(&tab[..7]).unwrap_err().status, Status::Config);
    let mut bad = tab.clone();
    bad[3] = f64::INFINITY;
    assert_eq!(cfg.rope_check(&bad).unwrap_err().status, Status::Config);
}
