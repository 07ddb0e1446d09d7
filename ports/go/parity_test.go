package kvprune

// Issue 22: the C API in full (PrefillRoom, LayerCapacity, LayerStats, the key table, KeyUsed,
// Get/Set, the ASL selection) and values that do not fit the C types. The Python
// (ports/python/tests/test_parity.py) and Rust (ports/rust/tests/parity.rs) suites run the same
// cases with the same numbers; keep the three in step.

import (
	"math"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func TestGeometryErrorNamesTheField(t *testing.T) {
	// kvp_config_init_ex: the message names the model field (same case in the three suites)
	bad := Model{Layers: 2, QHeads: 6, KVHeads: 4, HeadDim: 16}
	_, err1 := NewConfig(bad, "")
	_, err2 := NewCache(bad, "policy=window window=8")
	for _, err := range []error{err1, err2} {
		if StatusOf(err) != ErrConfig || !strings.Contains(err.Error(), "model.n_kv_heads=4 must divide model.n_q_heads=6") ||
			strings.Count(err.Error(), "KVP_ERR") != 1 {
			t.Fatalf("geometry error: %v", err)
		}
	}
}

// Model fields are uint32 here: Model{Layers: 1<<32 + 2} does not compile, so the Python cases of
// out-of-range geometry have no Go counterpart. Config.Set takes any float64: same cases.
func TestConfigSetSameCasesAsPythonAndRust(t *testing.T) {
	cfg, err := NewConfig(testModel, "policy=window window=8")
	if err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		key   string
		value float64
	}{{"window", 4294967300}, {"window", -1}, {"window", 2.5}, {"threads", 0}, {"beta", math.NaN()},
		{"beta", 1e300}, {"nonlazy", 99}, {"lazy_force", 4294967296}, {"no_such_key", 1}}
	for _, b := range bad {
		if err := cfg.Set(b.key, b.value); StatusOf(err) != ErrConfig {
			t.Fatalf("Set(%s, %v): %v", b.key, b.value, err)
		}
	}
	if w, _ := cfg.Get("window"); w != 8 {
		t.Fatalf("a refused Set changed window to %v", w)
	}
	if th, _ := cfg.Get("threads"); th != 1 {
		t.Fatalf("threads %v", th)
	}
	if _, err := cfg.Get("no_such_key"); StatusOf(err) != ErrConfig {
		t.Fatalf("Get(no_such_key): %v", err)
	}
	err = cfg.Set("window", 4294967300)
	if !strings.HasPrefix(err.Error(), "KVP_ERR_CONFIG: ") || !strings.Contains(err.Error(), "window=4294967300") {
		t.Fatalf("message: %q", err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cfg.Set("lazy_force", 4294967295)) // the largest uint32: kept whole
	if v, _ := cfg.Get("lazy_force"); v != 4294967295 || cfg.raw.lazy_force != math.MaxUint32 {
		t.Fatalf("lazy_force %v", v)
	}
	must(cfg.Set("lazy_force", 0))
	must(cfg.Set("beta", 2.5))
	if v, _ := cfg.Get("beta"); v != 2.5 {
		t.Fatalf("beta %v", v)
	}
	must(cfg.Set("policy", PolicyH2O))
	if v, _ := cfg.Get("policy"); v != PolicyH2O {
		t.Fatalf("policy %v", v)
	}
	must(cfg.Set("window", 12))
	must(cfg.Set("policy", PolicyWindow))
	must(cfg.Check())
	c, err := NewCacheFromConfig(cfg)
	must(err)
	defer c.Close()
	if c.LayerCapacity(0) != 13 {
		t.Fatalf("capacity %d", c.LayerCapacity(0))
	}
}

func TestKeyTableAndDefaults(t *testing.T) {
	keys, err := ConfigKeys()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]KeyInfo{}
	for _, k := range keys {
		names[k.Name] = k
	}
	if keys[0].Name != "policy" || len(names) != len(keys) {
		t.Fatalf("keys %v", keys[0].Name)
	}
	for _, want := range []string{"capacity", "window", "budget", "lazy_force", "prefill_stage"} {
		if _, ok := names[want]; !ok {
			t.Fatalf("no key %s", want)
		}
	}
	cfg, err := NewConfig(testModel, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.ConfigSize == 0 { // apply-only (compression_ratio, ratio_tokens): nothing stored
			if _, err := cfg.Get(k.Name); StatusOf(err) != ErrConfig {
				t.Fatalf("Get(%s): %v", k.Name, err)
			}
			continue
		}
		got, err := cfg.Get(k.Name)
		if err != nil {
			t.Fatal(err)
		}
		if k.KeyType == KeyFloat {
			if math.Abs(got-k.DefaultValue) > 1e-5*math.Max(1, math.Abs(k.DefaultValue)) {
				t.Fatalf("%s = %v, default %v", k.Name, got, k.DefaultValue)
			}
		} else if got != k.DefaultValue {
			t.Fatalf("%s = %v, default %v", k.Name, got, k.DefaultValue)
		}
		if (k.Values != "") != (k.KeyType == KeyEnum) || k.Help == "" {
			t.Fatalf("%s: values %q help %q", k.Name, k.Values, k.Help)
		}
	}
	pool := names["pool"]
	if pool.Values != "avg|max" || pool.DefaultName != "max" || pool.Policies&(1<<PolicySnapKV) == 0 {
		t.Fatalf("pool %+v", pool)
	}
}

func TestCompressionRatioThroughApply(t *testing.T) {
	cfg, err := NewConfig(testModel, "policy=h2o compression_ratio=0.75 ratio_tokens=64")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := cfg.Get("budget"); b != 16 { // keeps 25 % of 64 tokens
		t.Fatalf("budget %v", b)
	}
	if _, err := cfg.Get("compression_ratio"); StatusOf(err) != ErrConfig {
		t.Fatalf("Get(compression_ratio): %v", err)
	}
	if err := cfg.Set("compression_ratio", 0.5); StatusOf(err) != ErrConfig {
		t.Fatalf("Set(compression_ratio): %v", err)
	}
}

func TestKeyUsed(t *testing.T) {
	w, _ := NewConfig(testModel, "policy=window window=8")
	s, _ := NewConfig(testModel, "policy=streaming sinks=4 window=8")
	if used, err := w.KeyUsed("sinks"); used || err != nil {
		t.Fatalf("window uses sinks: %v %v", used, err)
	}
	if used, err := s.KeyUsed("sinks"); !used || err != nil {
		t.Fatalf("streaming ignores sinks: %v %v", used, err)
	}
	if _, err := s.KeyUsed("no_such_key"); StatusOf(err) != ErrConfig {
		t.Fatalf("unknown key: %v", err)
	}
}

func TestLayerStatsErrorsCarryTheMessage(t *testing.T) {
	cfg, _ := NewConfig(testModel, "policy=window window=8")
	c, err := NewCacheFromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ArenaLen() != cfg.ArenaSize() || c.LastError() != "" {
		t.Fatalf("arena %d vs %d, last error %q", c.ArenaLen(), cfg.ArenaSize(), c.LastError())
	}
	if _, err := c.LayerStats(2); StatusOf(err) != ErrLayer || !strings.Contains(c.LastError(), "layer") {
		t.Fatalf("LayerStats(2): %v", err)
	}
	if _, err := c.LayerStats(1 << 32); StatusOf(err) != ErrLayer {
		t.Fatalf("LayerStats(1<<32): %v", err)
	}
	if c.LayerCapacity(1<<32) != 0 {
		t.Fatal("LayerCapacity(1<<32) wrapped to layer 0")
	}
}

// bench/harness/session.cpp: chunk = max(1, min(left, kvp_prefill_room)), every layer per chunk.
func TestChunkALongPromptByPrefillRoom(t *testing.T) {
	const n = 100
	r := rng(5)
	q, k, v := r.vec(n*64), r.vec(n*32), r.vec(n*32)
	c := mustCache(t, "policy=streaming sinks=4 window=24 compress_every=8")
	if c.LayerCapacity(0) != 36 || c.LayerCapacity(2) != 0 || c.PrefillRoom() != 36 {
		t.Fatalf("capacity %d/%d room %d", c.LayerCapacity(0), c.LayerCapacity(2), c.PrefillRoom())
	}
	// the whole prompt at once does not fit, and changes nothing
	if err := c.Prefill(0, q, k, v, nil, nil); StatusOf(err) != ErrFull || c.LayerLen(0) != 0 {
		t.Fatalf("whole prompt: %v, len %d", err, c.LayerLen(0))
	}
	done, chunks := 0, []int{}
	for done < n {
		chunk := n - done
		if room := c.PrefillRoom(); room < chunk {
			chunk = room
		}
		if chunk < 1 {
			chunk = 1
		}
		for layer := 0; layer < 2; layer++ {
			a, b := done, done+chunk
			if err := c.Prefill(layer, q[a*64:b*64], k[a*32:b*32], v[a*32:b*32], nil, nil); err != nil {
				t.Fatal(err)
			}
			if c.LayerLen(layer) > c.LayerCapacity(layer) {
				t.Fatalf("layer %d holds %d of %d", layer, c.LayerLen(layer), c.LayerCapacity(layer))
			}
		}
		chunks = append(chunks, chunk)
		done += chunk
	}
	sum := 0
	for _, ch := range chunks {
		sum += ch
	}
	st, _ := c.Stats()
	if len(chunks) <= 2 || sum != n || st.TokensSeen != n {
		t.Fatalf("chunks %v, tokens seen %d", chunks, st.TokensSeen)
	}
	ls, err := c.LayerStats(1)
	if err != nil || ls.Capacity != 36 || ls.Len != 28 || ls.TokensEvicted == 0 || ls.Lazy != -1 {
		t.Fatalf("layer stats %+v %v", ls, err)
	}
	kept, _ := c.LayerPositions(1, 0)
	if !reflect.DeepEqual(kept[:4], []int32{0, 1, 2, 3}) || kept[len(kept)-1] != n-1 {
		t.Fatalf("kept %v", kept)
	}
}

func TestReadLazyLayers(t *testing.T) {
	r := rng(6)
	const n = 30
	q, k, v := r.vec(n*64), r.vec(n*32), r.vec(n*32)
	// lazy_force=1: layer 0 lazy (trimmed to sinks + window), layer 1 not, decided at prefill
	c := mustCache(t, "policy=simlayerkv sinks=4 window=8 capacity=64 lazy_force=1")
	if ls, _ := c.LayerStats(0); ls.Lazy != -1 {
		t.Fatalf("before prefill: %+v", ls)
	}
	for layer := 0; layer < 2; layer++ {
		if err := c.Prefill(layer, q, k, v, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	l0, _ := c.LayerStats(0)
	l1, _ := c.LayerStats(1)
	if l0.Lazy != 1 || l0.Len != 12 || l1.Lazy != 0 || l1.Len != n {
		t.Fatalf("lazy_force: %+v %+v", l0, l1)
	}
	// lazy_mode=decode: undecided after the prompt, decided by the first decode
	c = mustCache(t, "policy=simlayerkv sinks=4 window=8 capacity=64 lazy_mode=decode")
	for layer := 0; layer < 2; layer++ {
		if err := c.Prefill(layer, q, k, v, nil, nil); err != nil {
			t.Fatal(err)
		}
		if ls, _ := c.LayerStats(layer); ls.Lazy != -1 {
			t.Fatalf("after prefill: %+v", ls)
		}
	}
	out := make([]float32, 64)
	for layer := 0; layer < 2; layer++ {
		if err := c.Decode(layer, r.vec(64), r.vec(32), r.vec(32), out); err != nil {
			t.Fatal(err)
		}
	}
	for layer := 0; layer < 2; layer++ {
		ls, _ := c.LayerStats(layer)
		want := uint32(n + 1)
		if ls.Lazy == 1 {
			want = 12
		}
		if (ls.Lazy != 0 && ls.Lazy != 1) || ls.Len != want || math.IsNaN(float64(ls.Sparsity)) {
			t.Fatalf("after decode: %+v", ls)
		}
	}
}

func TestASLSelection(t *testing.T) {
	m := Model{Layers: 4, QHeads: 4, KVHeads: 2, HeadDim: 16, Rope: RopeNeox, RopeTheta: 10000}
	const n = 30
	r := rng(7)
	q, k, v := r.vec(n*64), r.vec(n*32), r.vec(n*32)
	c, err := NewCache(m, "policy=asl budget=12 obs_window=4 asl_tau=1000000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	idx := make([]int32, 12)
	out := make([]float32, n*64)
	// layer 0 < asl_min_layer = 1: no selection
	if got, sel, err := c.PrefillSelect(0, q, k, v, nil, out, idx); err != nil || sel || got != 0 {
		t.Fatalf("layer 0: %d %v %v", got, sel, err)
	}
	// layer 1 may select up to budget tokens: a smaller buffer is ErrBuffer, nothing changed
	if _, _, err := c.PrefillSelect(1, q, k, v, nil, nil, make([]int32, 4)); StatusOf(err) != ErrBuffer || c.LayerLen(1) != 0 {
		t.Fatalf("small buffer: %v", err)
	}
	got, sel, err := c.PrefillSelect(1, q, k, v, nil, nil, idx)
	if err != nil || !sel || got != 12 {
		t.Fatalf("layer 1: %d %v %v", got, sel, err)
	}
	if !sort.SliceIsSorted(idx, func(i, j int) bool { return idx[i] < idx[j] }) ||
		!reflect.DeepEqual(idx[8:], []int32{26, 27, 28, 29}) {
		t.Fatalf("indices %v (the observation window is propagated)", idx)
	}
	// later layers receive only the selected tokens, at their original positions
	rows := func(x []float32, w int) []float32 {
		var o []float32
		for _, i := range idx {
			o = append(o, x[int(i)*w:int(i+1)*w]...)
		}
		return o
	}
	qs, ks, vs := rows(q, 64), rows(k, 32), rows(v, 32)
	for layer := 2; layer < 4; layer++ {
		if _, sel, err := c.PrefillSelect(layer, qs, ks, vs, idx, nil, make([]int32, 12)); err != nil || sel {
			t.Fatalf("layer %d: %v %v", layer, sel, err)
		}
		if kept, _ := c.LayerPositions(layer, 1); !reflect.DeepEqual(kept, idx) {
			t.Fatalf("layer %d kept %v", layer, kept)
		}
	}
}
