package kvprune

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
)

// rng: deterministic inputs, multiples of 2^-9 in [-1, 1).
type rng uint64

func (r *rng) next() float32 {
	x := uint64(*r)
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	*r = rng(x)
	return float32(int32(x>>54)-512) / 512
}

func (r *rng) vec(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = r.next()
	}
	return v
}

var testModel = Model{Layers: 2, QHeads: 4, KVHeads: 2, HeadDim: 16, Rope: RopeNeox, RopeTheta: 10000}

func mustCache(t *testing.T, spec string) *Cache {
	t.Helper()
	c, err := NewCache(testModel, spec)
	if err != nil {
		t.Fatalf("NewCache(%q): %v", spec, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestVersion(t *testing.T) {
	if a, b, c := Version(); a != 0 || b != 2 || c != 0 {
		t.Fatalf("version %d.%d.%d", a, b, c)
	}
}

func TestConfigDefaultsAndSpec(t *testing.T) {
	cfg, err := NewConfig(testModel, "policy=streaming sinks=5 window=27 threads=2")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Sinks() != 5 || cfg.Window() != 27 || cfg.Threads() != 2 || cfg.Policy() != 2 {
		t.Fatalf("fields: sinks %d window %d threads %d policy %d", cfg.Sinks(), cfg.Window(), cfg.Threads(), cfg.Policy())
	}
	if cfg.StructSize() == 0 || cfg.ArenaSize() == 0 {
		t.Fatalf("struct_size %d arena %d", cfg.StructSize(), cfg.ArenaSize())
	}
	if err := cfg.Check(); err != nil {
		t.Fatal(err)
	}
	if cfg.Model() != testModel {
		t.Fatalf("model %+v", cfg.Model())
	}
}

func TestBadSpec(t *testing.T) {
	cfg, err := NewConfig(testModel, "policy=streaming sinks=4 window=60")
	if err != nil {
		t.Fatal(err)
	}
	before := cfg.raw
	err = cfg.Apply("sinks=8 no_such_key=1")
	if StatusOf(err) != ErrConfig || !strings.Contains(err.Error(), "no_such_key") {
		t.Fatalf("unknown key: %v", err)
	}
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("errors.Is(%v, ErrConfig) is false", err)
	}
	if cfg.raw != before {
		t.Fatal("failed apply changed the config")
	}
	if err := cfg.Apply("window=abc"); StatusOf(err) != ErrConfig || !strings.Contains(err.Error(), "window") {
		t.Fatalf("malformed value: %v", err)
	}
	if err := cfg.Apply("sinks=1\x00"); StatusOf(err) != ErrArg {
		t.Fatalf("NUL: %v", err)
	}
	if _, err := NewCache(testModel, "policy=nonsense"); err == nil {
		t.Fatal("policy=nonsense accepted")
	}
	if _, err := NewCache(Model{Layers: 2, QHeads: 3, KVHeads: 2, HeadDim: 16}, ""); StatusOf(err) != ErrConfig {
		t.Fatalf("bad geometry: %v", err)
	}
	if _, err := NewCache(testModel, "policy=streaming sinks=4 window=16 capacity=3"); err == nil {
		t.Fatal("capacity below the policy's need accepted")
	}
}

func TestSingleTokenAttention(t *testing.T) {
	c := mustCache(t, "policy=full capacity=64")
	r := rng(7)
	q, k, v := r.vec(64), r.vec(32), r.vec(32)
	out := make([]float32, 64)
	if err := c.Decode(0, q, k, v, out); err != nil {
		t.Fatal(err)
	}
	for h := 0; h < 4; h++ {
		for j := 0; j < 16; j++ {
			if d := math.Abs(float64(out[h*16+j] - v[(h/2)*16+j])); d > 1e-6 {
				t.Fatalf("head %d j %d: %g vs %g", h, j, out[h*16+j], v[(h/2)*16+j])
			}
		}
	}
}

// An arena of 2 MiB or more is allocated in whole 2 MiB pages and advised for huge pages
// (arenaAlloc, kvp_arena_advise): it decodes as a small one does (no token is evicted in either).
func TestHugePageArena(t *testing.T) {
	big, small := mustCache(t, "policy=window window=20000"), mustCache(t, "policy=window window=64")
	if st, err := big.Stats(); err != nil || st.ArenaBytes < 2<<20 {
		t.Fatalf("arena %d bytes (%v): want 2 MiB or more", st.ArenaBytes, err)
	}
	r := rng(5)
	a, b := make([]float32, 64), make([]float32, 64)
	for i := 0; i < 20; i++ {
		for layer := 0; layer < 2; layer++ {
			q, k, v := r.vec(64), r.vec(32), r.vec(32)
			if err := big.Decode(layer, q, k, v, a); err != nil {
				t.Fatal(err)
			}
			if err := small.Decode(layer, q, k, v, b); err != nil {
				t.Fatal(err)
			}
			for j := range a {
				if math.Float32bits(a[j]) != math.Float32bits(b[j]) {
					t.Fatalf("step %d layer %d: %g vs %g", i, layer, a[j], b[j])
				}
			}
		}
	}
}

func TestStreamingDecode(t *testing.T) {
	c := mustCache(t, "policy=streaming sinks=4 window=16 compress_every=4")
	r := rng(42)
	out := make([]float32, 64)
	const steps = 100
	for i := 0; i < steps; i++ {
		for layer := 0; layer < 2; layer++ {
			if err := c.Decode(layer, r.vec(64), r.vec(32), r.vec(32), out); err != nil {
				t.Fatalf("step %d layer %d: %v", i, layer, err)
			}
		}
	}
	var live uint64
	for layer := 0; layer < 2; layer++ {
		if n := c.LayerLen(layer); n < 20 || n >= 24 {
			t.Fatalf("layer %d keeps %d", layer, n)
		}
		for h := 0; h < 2; h++ {
			pos, err := c.LayerPositions(layer, h)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 4; i++ {
				if pos[i] != int32(i) {
					t.Fatalf("sinks: %v", pos)
				}
			}
			if pos[len(pos)-1] != steps-1 {
				t.Fatalf("newest not kept: %v", pos)
			}
			for i := 5; i < len(pos); i++ {
				if pos[i] != pos[i-1]+1 {
					t.Fatalf("window not contiguous: %v", pos)
				}
			}
			live += uint64(len(pos)) * 16 * 4 * 2
		}
	}
	s, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.TokensSeen != steps || s.PruneEvents == 0 || s.TokensEvicted == 0 || s.LiveBytes != live ||
		s.PeakLiveBytes < s.LiveBytes || s.ArenaBytes != uint64(c.ArenaLen()) {
		t.Fatalf("stats %+v (live want %d, arena %d)", s, live, c.ArenaLen())
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if s, _ := c.Stats(); c.LayerLen(0) != 0 || s.TokensSeen != 0 || s.LiveBytes != 0 {
		t.Fatalf("after reset: len %d stats %+v", c.LayerLen(0), s)
	}
}

func TestPrefillAppend(t *testing.T) {
	a := mustCache(t, "policy=full capacity=64")
	b := mustCache(t, "policy=full capacity=64")
	r := rng(3)
	const n = 8
	q, k, v := r.vec(n*64), r.vec(n*32), r.vec(n*32)
	outA := make([]float32, n*64)
	if err := a.Prefill(0, q, k, v, nil, outA); err != nil {
		t.Fatal(err)
	}
	outB := make([]float32, 64)
	for i := 0; i < n; i++ {
		if err := b.Decode(0, q[i*64:(i+1)*64], k[i*32:(i+1)*32], v[i*32:(i+1)*32], outB); err != nil {
			t.Fatal(err)
		}
		for j := range outB {
			if d := math.Abs(float64(outA[i*64+j] - outB[j])); d > 1e-5 {
				t.Fatalf("token %d j %d: prefill %g decode %g", i, j, outA[i*64+j], outB[j])
			}
		}
	}
	if err := a.Append(1, k[:64], v[:64], []int32{10, 20}); err != nil {
		t.Fatal(err)
	}
	if err := a.Prefill(1, q[:64], k[:32], v[:32], nil, nil); err != nil {
		t.Fatal(err)
	}
	pos, _ := a.LayerPositions(1, 0)
	if len(pos) != 3 || pos[0] != 10 || pos[1] != 20 || pos[2] != 21 {
		t.Fatalf("positions %v", pos)
	}
	idx := make([]int32, 4)
	if got, sel, err := a.PrefillSelect(1, q[:64], k[:32], v[:32], nil, nil, idx); err != nil || got != 0 || sel {
		t.Fatalf("selection without ASL: %d %v %v", got, sel, err)
	}
}

func TestBadInput(t *testing.T) {
	c := mustCache(t, "policy=full capacity=4")
	r := rng(9)
	q, k, v := r.vec(64), r.vec(32), r.vec(32)
	out := make([]float32, 64)
	if err := c.Decode(0, q, k, v, out); err != nil {
		t.Fatal(err)
	}
	check := func(name string, err error, want Status) {
		t.Helper()
		if StatusOf(err) != want {
			t.Fatalf("%s: got %v, want %v", name, err, want)
		}
	}
	check("short q", c.Decode(0, q[:63], k, v, out), ErrArg)
	check("short out", c.Decode(0, q, k, v, out[:10]), ErrArg)
	check("nil out", c.Decode(0, q, k, v, nil), ErrArg)
	check("v/k mismatch", c.Prefill(0, q, k, v[:16], nil, nil), ErrArg)
	check("positions count", c.Append(0, k, v, []int32{1, 2}), ErrArg)
	check("empty", c.Append(0, nil, nil, nil), ErrArg)
	err := c.Decode(5, q, k, v, out)
	check("layer", err, ErrLayer)
	if msg := c.LastError(); msg == "" || !strings.Contains(err.Error(), msg) {
		t.Fatalf("last error %q vs %v", msg, err)
	}
	bad := append([]float32(nil), k...)
	bad[3] = float32(math.NaN())
	check("NaN k", c.Decode(0, q, bad, v, out), ErrNonFinite)
	badq := append([]float32(nil), q...)
	badq[0] = float32(math.Inf(1))
	check("Inf q", c.Decode(0, badq, k, v, out), ErrNonFinite)
	check("old position", c.Append(0, k, v, []int32{0}), ErrArg)
	if c.LayerLen(0) != 1 {
		t.Fatalf("failed calls changed the cache: len %d", c.LayerLen(0))
	}
	for i := 0; i < 3; i++ {
		if err := c.Decode(0, q, k, v, out); err != nil {
			t.Fatal(err)
		}
	}
	err = c.Decode(0, q, k, v, out)
	check("full", err, ErrFull)
	if !errors.Is(err, ErrFull) {
		t.Fatal("errors.Is(ErrFull)")
	}
	_, err = c.LayerPositions(0, 2)
	check("kv head", err, ErrLayer)
	if c.LayerLen(9) != 0 {
		t.Fatal("bad layer length")
	}
}

func TestCloseAndFinalizer(t *testing.T) {
	c, err := NewCache(testModel, "policy=full capacity=16")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if err := c.Reset(); StatusOf(err) != ErrState {
		t.Fatalf("use after Close: %v", err)
	}
	if _, err := c.Stats(); StatusOf(err) != ErrState {
		t.Fatalf("stats after Close: %v", err)
	}
	// Caches left to the garbage collector are destroyed by their finalizer.
	for i := 0; i < 50; i++ {
		if _, err := NewCache(testModel, "policy=full capacity=256"); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.GC()
}

func TestConcurrentCaches(t *testing.T) {
	done := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func(seed int) {
			c, err := NewCache(testModel, "policy=streaming sinks=2 window=8 compress_every=2 threads=2")
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			r := rng(seed + 1)
			out := make([]float32, 64)
			for i := 0; i < 40; i++ {
				for layer := 0; layer < 2; layer++ {
					if err := c.Decode(layer, r.vec(64), r.vec(32), r.vec(32), out); err != nil {
						done <- err
						return
					}
				}
			}
			done <- nil
		}(g)
	}
	for g := 0; g < 4; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// Issue 11: integers beyond 32 bits are rejected, never truncated (layer 1<<32 is not layer 0).
func TestIntegersBeyond32Bits(t *testing.T) {
	c := mustCache(t, "policy=window window=8")
	defer c.Close()
	q, kv, out := make([]float32, 4*16), make([]float32, 2*16), make([]float32, 4*16)
	for _, layer := range []int{1 << 32, 1<<32 + 1, -1, math.MaxInt64} {
		if err := c.Decode(layer, q, kv, kv, out); StatusOf(err) != ErrLayer {
			t.Fatalf("Decode(layer %d): %v", layer, err)
		}
		if err := c.Append(layer, kv, kv, nil); StatusOf(err) != ErrLayer {
			t.Fatalf("Append(layer %d): %v", layer, err)
		}
		if err := c.Prefill(layer, q, kv, kv, nil, out); StatusOf(err) != ErrLayer {
			t.Fatalf("Prefill(layer %d): %v", layer, err)
		}
		if _, err := c.LayerPositions(0, layer); StatusOf(err) != ErrLayer {
			t.Fatalf("LayerPositions(head %d): %v", layer, err)
		}
		if n := c.LayerLen(layer); n != 0 {
			t.Fatalf("LayerLen(%d) = %d", layer, n)
		}
	}
	if c.LayerLen(0) != 0 {
		t.Fatal("a rejected call changed layer 0")
	}
	if err := c.Decode(0, q, kv, kv, out); err != nil {
		t.Fatal(err)
	}
}

// One message format ("<status>: <detail>"), never doubled; create failures are explained.
func TestErrorTextNotDoubled(t *testing.T) {
	c := mustCache(t, "policy=window window=8")
	defer c.Close()
	q, kv, out := make([]float32, 4*16), make([]float32, 2*16), make([]float32, 4*16)
	err := c.Decode(1, q[:3], kv, kv, out)
	if !strings.HasPrefix(err.Error(), "KVP_ERR_ARG: ") || strings.Count(err.Error(), "KVP_ERR") != 1 {
		t.Fatalf("binding error: %q", err)
	}
	err = c.Decode(5, q, kv, kv, out)
	if !strings.HasPrefix(err.Error(), "KVP_ERR_LAYER: ") || strings.Count(err.Error(), "KVP_ERR") != 1 {
		t.Fatalf("library error: %q", err)
	}
	cfg, err := NewConfig(testModel, "policy=window window=8")
	if err != nil {
		t.Fatal(err)
	}
	cfg.raw.capacity = 3
	_, err = NewCacheFromConfig(cfg)
	if StatusOf(err) != ErrConfig || !strings.Contains(err.Error(), "capacity") || strings.Contains(err.Error(), "NULL cache") {
		t.Fatalf("create: %v", err)
	}
	if _, err := c.LayerPositions(0, 0); err != nil {
		t.Fatal(err)
	}
}
