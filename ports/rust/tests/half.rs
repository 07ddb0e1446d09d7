//! Half-precision rows through the Rust binding (kvp_*_ex): the same cache as the f32 calls on
//! the widened values, outputs rounded; errors leave the cache unchanged.
use kvprune::{Cache, Config, Half, Model, Rope, Status};

const NQ: usize = 4;
const NKV: usize = 2;
const HD: usize = 16;
const SPEC: &str = "policy=h2o budget=16 recent=4 capacity=32";

fn model() -> Model {
    Model::new(2, NQ as u32, NKV as u32, HD as u32).rope(Rope::Neox, 0, 10000.0)
}

/// Multiples of 1/64 in [-1, 1): exact in f16 and bf16.
fn vals(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((x >> 57) as i32 - 64) as f32 / 64.0
        })
        .collect()
}

fn bf16(x: &[f32]) -> Vec<u16> {
    x.iter().map(|f| (f.to_bits() >> 16) as u16).collect()
}

/// f16 bits of values that are exact in f16 (normal or zero).
fn f16(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|f| {
            let b = f.to_bits();
            if *f == 0.0 {
                ((b >> 16) & 0x8000) as u16
            } else {
                (((b >> 16) & 0x8000) | ((((b >> 23) & 255) - 112) << 10) | ((b >> 13) & 0x3ff)) as u16
            }
        })
        .collect()
}

fn state(c: &Cache) -> Vec<u8> {
    let mut buf = vec![0u8; c.state_size()];
    let n = c.state_save(&mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn twin(dtype: Half) {
    let cfg = Config::from_spec(&model(), SPEC).unwrap();
    let (mut a, mut b) = (Cache::new(&cfg).unwrap(), Cache::new(&cfg).unwrap());
    let bits = |x: &[f32]| if dtype == Half::F16 { f16(x) } else { bf16(x) };
    let (mut ho, mut fo) = (vec![0u16; NQ * HD], vec![0f32; NQ * HD]);
    for t in 0..24u64 {
        let (q, k, v) = (vals(3 * t + 1, NQ * HD), vals(3 * t + 2, NKV * HD), vals(3 * t + 3, NKV * HD));
        for layer in 0..2 {
            if t < 8 {
                a.prefill_half(layer, dtype, &bits(&q), &bits(&k), &bits(&v), None, Some(&mut ho)).unwrap();
                b.prefill(layer, &q, &k, &v, None, Some(&mut fo)).unwrap();
            } else if t < 10 {
                a.append_half(layer, dtype, &bits(&k), &bits(&v), None).unwrap();
                b.append(layer, &k, &v, None).unwrap();
                continue;
            } else {
                a.decode_half(layer, dtype, &bits(&q), &bits(&k), &bits(&v), &mut ho).unwrap();
                b.decode(layer, &q, &k, &v, &mut fo).unwrap();
            }
            if dtype == Half::BF16 {  // outputs: the f32 outputs rounded to nearest even
                let r: Vec<u16> = fo
                    .iter()
                    .map(|f| {
                        let u = f.to_bits();
                        ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
                    })
                    .collect();
                assert_eq!(ho, r, "t {} layer {}", t, layer);
            }
        }
    }
    assert_eq!(state(&a), state(&b));
}

#[test]
fn f16_rows_twin_the_f32_calls() {
    twin(Half::F16);
}

#[test]
fn bf16_rows_twin_the_f32_calls() {
    twin(Half::BF16);
}

#[test]
fn bad_half_rows_are_refused() {
    let cfg = Config::from_spec(&model(), SPEC).unwrap();
    let mut c = Cache::new(&cfg).unwrap();
    let (q, mut k, v) = (f16(&vals(1, NQ * HD)), f16(&vals(2, NKV * HD)), f16(&vals(3, NKV * HD)));
    let mut out = vec![0u16; NQ * HD];
    c.decode_half(0, Half::F16, &q, &k, &v, &mut out).unwrap();
    let before = state(&c);
    k[5] = 0x7c00; // +Inf
    let e = c.decode_half(0, Half::F16, &q, &k, &v, &mut out).unwrap_err();
    assert_eq!(e.status, Status::NonFinite);
    assert!(e.message.contains("k[5]"), "{}", e.message);
    let mut bv = bf16(&vals(3, NKV * HD));
    bv[1] = 0x7fc0; // bf16 NaN
    let e = c.append_half(1, Half::BF16, &bf16(&vals(2, NKV * HD)), &bv, None).unwrap_err();
    assert_eq!(e.status, Status::NonFinite);
    assert_eq!(state(&c), before);
    let e = c.decode_half(0, Half::F16, &q[1..], &k, &v, &mut out).unwrap_err();
    assert_eq!(e.status, Status::Arg);
}
