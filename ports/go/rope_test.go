package kvprune

// Issue 21 item 3 through the Go binding: RoPE frequency tables and the attention factor.

import (
	"math"
	"strings"
	"testing"
)

func ropeVec(seed uint64, n int) []float32 {
	x := seed
	v := make([]float32, n)
	for i := range v {
		x = x*6364136223846793005 + 1442695040888963407
		v[i] = float32(int32(x>>55)-256) / 256
	}
	return v
}

func ropeRun(t *testing.T, c *Cache, seed uint64) []float32 {
	const nq, nkv, hd = 4, 2, 16
	var res []float32
	out := make([]float32, nq*hd)
	for i := uint64(0); i < 20; i++ {
		if err := c.Decode(0, ropeVec(seed+3*i, nq*hd), ropeVec(seed+3*i+1, nkv*hd), ropeVec(seed+3*i+2, nkv*hd), out); err != nil {
			t.Fatal(err)
		}
		res = append(res, out...)
	}
	return res
}

func TestRopeHelpersFollowTheFormulas(t *testing.T) {
	const n, theta = 8, 10000.0
	base := make([]float64, n)
	for i := range base {
		base[i] = math.Pow(theta, -float64(i)/n)
	}
	lin, err := RopeFreqsLinear(n, theta, 4)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range lin {
		if math.Abs(a-base[i]/4) > 1e-13*base[i] {
			t.Fatalf("linear %d: %v vs %v", i, a, base[i]/4)
		}
	}
	l3, err := RopeFreqsLlama3(n, theta, 8, 1, 4, 64)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range l3 {
		f := base[i]
		wl := 2 * math.Pi / f
		want := f
		if wl > 64 {
			want = f / 8
		} else if wl >= 16 {
			s := (64/wl - 1) / 3
			want = (1-s)*f/8 + s*f
		}
		if math.Abs(a-want) > 1e-13*f {
			t.Fatalf("llama3 %d: %v vs %v", i, a, want)
		}
	}
	y, att, err := RopeFreqsYarn(n, theta, 4, 256, 32, 1)
	if err != nil || y[0] != base[0] || math.Abs(float64(att)-(0.1*math.Log(4)+1)) > 1e-6 {
		t.Fatalf("yarn: %v %v %v", err, y, att)
	}
	d, err := RopeFreqsDivided(theta, []float32{2, 2, 2, 2, 2, 2, 2, 2})
	if err != nil || math.Abs(d[5]-base[5]/2) > 1e-13*base[5] {
		t.Fatalf("divided: %v %v", err, d)
	}
	if _, err := RopeFreqsLinear(n, 1, 2); statusOf(err) != ErrConfig || !strings.Contains(err.Error(), "theta=1") {
		t.Fatalf("theta=1: %v", err)
	}
	if _, _, err := RopeFreqsYarn(n, theta, 4, 256, 1, 2); statusOf(err) != ErrConfig {
		t.Fatalf("beta_fast < beta_slow: %v", err)
	}
	if _, err := RopeFreqsLinear(0, theta, 2); statusOf(err) != ErrArg {
		t.Fatalf("n=0: %v", err)
	}
}

func TestRopeTableIsUsed(t *testing.T) {
	m := Model{Layers: 1, QHeads: 4, KVHeads: 2, HeadDim: 16, Rope: RopeNeox, RopeTheta: 10000}
	m2 := m
	m2.RopeTheta = 977
	tab := make([]float64, 8)
	for i := range tab {
		tab[i] = math.Pow(float64(float32(977)), -2*float64(i)/16)
	}
	const spec = "policy=full capacity=32"
	cfg, err := NewConfig(m, spec)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewCacheRope(cfg, tab)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewCache(m2, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := NewCache(m, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ra, rb, rc := ropeRun(t, a, 5), ropeRun(t, b, 5), ropeRun(t, c, 5)
	same := func(x, y []float32) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(ra, rb) || same(ra, rc) {
		t.Fatal("the table's outputs must equal theta=977's and differ from theta=10000's")
	}
	if _, err := NewCacheRope(cfg, tab[:7]); statusOf(err) != ErrConfig || !strings.Contains(err.Error(), "rope_dim/2=8") {
		t.Fatalf("short table: %v", err)
	}
	if err := cfg.RopeCheck(tab); err != nil {
		t.Fatalf("RopeCheck of a good table: %v", err)
	}
	if err := cfg.RopeCheck(nil); err != nil {
		t.Fatalf("RopeCheck of no table: %v", err)
	}
	bad := append([]float64(nil), tab...)
	bad[3] = math.Inf(1)
	if err := cfg.RopeCheck(bad); statusOf(err) != ErrConfig {
		t.Fatalf("RopeCheck of an Inf entry: %v", err)
	}
	if err := cfg.RopeCheck(tab[:7]); statusOf(err) != ErrConfig {
		t.Fatalf("RopeCheck of a short table: %v", err)
	}
	if err := cfg.Set("rope_attn_factor", 1.25); err != nil || cfg.raw.rope_attn_factor != 1.25 {
		t.Fatalf("rope_attn_factor: %v", err)
	}
	if err := cfg.Set("rope_attn_factor", 0); statusOf(err) != ErrConfig {
		t.Fatalf("rope_attn_factor=0: %v", err)
	}
}
