// Caller memory and the resolved configuration (parity with C's kvp_create on the caller's arena).
use kvprune::{Cache, Config, Model, Rope, Status};

fn model() -> Model {
    Model::new(2, 4, 2, 16).rope(Rope::Neox, 0, 10000.0)
}

fn rows(seed: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 20) % 17) as f32 * 0.25 - 2.0).collect()
}

fn decode_bits(c: &mut Cache, steps: u32) -> Vec<u32> {
    let mut bits = Vec::new();
    let mut out = vec![0f32; 4 * 16];
    for s in 0..steps {
        for layer in 0..2 {
            let (q, k, v) = (rows(s * 7 + layer, 4 * 16), rows(s * 11 + layer, 2 * 16), rows(s * 13 + layer, 2 * 16));
            c.decode(layer, &q, &k, &v, &mut out).unwrap();
            bits.extend(out.iter().map(|x| x.to_bits()));
        }
    }
    bits
}

#[test]
fn a_cache_in_caller_memory_matches_an_owned_one() {
    let cfg = Config::from_spec(&model(), "policy=h2o budget=12 recent=4 capacity=16").unwrap();
    let mut owned = Cache::new(&cfg).unwrap();
    let mut mem = vec![0u8; cfg.arena_size_unaligned()];
    let want = decode_bits(&mut owned, 20);
    {
        let mut lent = Cache::in_memory(&cfg, &mut mem).unwrap();
        assert!(lent.in_caller_memory() && !owned.in_caller_memory());
        assert_eq!(lent.arena_len(), cfg.arena_size());
        assert_eq!(decode_bits(&mut lent, 20), want);
        assert_eq!(lent.stats().unwrap(), owned.stats().unwrap());
        assert_eq!(lent.layer_positions(1, 1).unwrap(), owned.layer_positions(1, 1).unwrap());
        // its state moves to an owned cache and back
        let mut st = vec![0u8; lent.state_size()];
        let n = lent.state_save(&mut st).unwrap();
        let mut other = Cache::new(&cfg).unwrap();
        other.state_load(&st[..n]).unwrap();
        assert_eq!(other.stats().unwrap(), lent.stats().unwrap());
    }
    // the memory is the caller's again once the cache is dropped, and may hold a new cache
    assert!(mem.iter().any(|&b| b != 0));
    let mut again = Cache::in_memory(&cfg, &mut mem).unwrap();
    assert_eq!(again.layer_len(0), 0);
    assert_eq!(decode_bits(&mut again, 20), want);
}

// An owned arena of 2 MiB or more is allocated in whole 2 MiB pages and advised for huge pages
// (`kvp_arena_advise`): it decodes as one in caller memory does.
#[test]
fn a_huge_page_arena_matches_caller_memory() {
    let cfg = Config::from_spec(&model(), "policy=window window=20000").unwrap();
    assert!(cfg.arena_size() >= 2 << 20);
    let mut owned = Cache::new(&cfg).unwrap();
    let mut mem = vec![0u8; cfg.arena_size_unaligned()];
    let mut lent = Cache::in_memory(&cfg, &mut mem).unwrap();
    assert_eq!(decode_bits(&mut owned, 20), decode_bits(&mut lent, 20));
    assert_eq!(owned.stats().unwrap(), lent.stats().unwrap());
}

#[test]
fn memory_too_short_or_a_bad_config_creates_nothing() {
    let cfg = Config::from_spec(&model(), "policy=window window=8 capacity=9").unwrap();
    let n = cfg.arena_size();
    let mut mem = vec![0u8; n + 63];
    let off = mem.as_ptr().align_offset(64);
    let e = Cache::in_memory(&cfg, &mut mem[off..off + n - 1]).unwrap_err();
    assert_eq!(e.status, Status::Arena);
    assert!(e.message.contains("Config::arena_size"), "{}", e.message);
    assert_eq!(Cache::in_memory(&cfg, &mut []).unwrap_err().status, Status::Arena);
    // exactly arena_size bytes suffice when they start on a 64-byte boundary
    let c = Cache::in_memory(&cfg, &mut mem[off..off + n]).unwrap();
    assert_eq!(c.arena_len(), n);
    drop(c);
    let mut bad = cfg;
    bad.raw_mut().model.n_kv_heads = 3; // does not divide n_q_heads
    assert_eq!(Cache::in_memory(&bad, &mut mem).unwrap_err().status, Status::Config);
}

#[test]
fn the_resolved_configuration_reads_back() {
    let cfg = Config::from_spec(&model(), "policy=window compression_ratio=0.5 ratio_tokens=32").unwrap();
    let c = Cache::new(&cfg).unwrap();
    assert_eq!(c.config(), &cfg);
    assert_eq!(c.config().get("window").unwrap(), 16.0); // compression_ratio resolved into the field
    assert_eq!(c.config().get("policy").unwrap(), 1.0);
    assert_eq!(c.config().model(), *c.model());
    let mut mem = vec![0u8; cfg.arena_size_unaligned()];
    let lent = Cache::in_memory(&cfg, &mut mem).unwrap();
    assert_eq!(lent.config().raw(), cfg.raw());
    assert_eq!(lent.layer_capacity(0), c.layer_capacity(0));
}
