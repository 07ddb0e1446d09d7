package kvprune

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

// Issue 21 through the Go binding: draft rollback against a twin, state save/load, errors.

const draftSpec = "policy=streaming sinks=2 window=6 capacity=32 max_draft=4"

type toks struct{ q, k, v []float32 }

func draftToks(r *rng, n int) toks {
	m := testModel
	return toks{r.vec(n * int(m.QHeads*m.HeadDim)), r.vec(n * int(m.KVHeads*m.HeadDim)), r.vec(n * int(m.KVHeads*m.HeadDim))}
}

func (t toks) head(n int) toks {
	m := testModel
	return toks{t.q[:n*int(m.QHeads*m.HeadDim)], t.k[:n*int(m.KVHeads*m.HeadDim)], t.v[:n*int(m.KVHeads*m.HeadDim)]}
}

func prefillAll(t *testing.T, c *Cache, x toks) {
	t.Helper()
	for l := 0; l < int(testModel.Layers); l++ {
		if err := c.Prefill(l, x.q, x.k, x.v, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func decodeBits(t *testing.T, c *Cache, seed uint64) []uint32 {
	t.Helper()
	r := rng(seed)
	var bits []uint32
	for l := 0; l < int(testModel.Layers); l++ {
		x := draftToks(&r, 1)
		out := make([]float32, len(x.q))
		if err := c.Decode(l, x.q, x.k, x.v, out); err != nil {
			t.Fatal(err)
		}
		for _, f := range out {
			bits = append(bits, math.Float32bits(f))
		}
	}
	return bits
}

type keptRow struct {
	len int
	pos []int32
}

func kept(t *testing.T, c *Cache) []keptRow {
	t.Helper()
	var all []keptRow
	for l := 0; l < int(testModel.Layers); l++ {
		for h := 0; h < int(testModel.KVHeads); h++ {
			p, err := c.LayerPositions(l, h)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, keptRow{c.LayerLen(l), p})
		}
	}
	return all
}

func saveState(t *testing.T, c *Cache) []byte {
	t.Helper()
	buf := make([]byte, c.StateSize())
	n, err := c.StateSave(buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

func statusOf(err error) Status {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return OK
}

// kvp_query_stats_set: 16 NeoX channels = 8 units; tri_stats=given only.
func TestQueryStatsSet(t *testing.T) {
	c, err := NewCache(testModel, "policy=triattention budget=6 beta=3 tri_stats=given")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mean, abs := make([]float32, 16), make([]float32, 8)
	if err := c.QueryStatsSet(1, 3, mean, abs); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryStatsSet(0, 0, mean, abs[:7]); statusOf(err) != ErrArg {
		t.Fatalf("7 units: %v", err)
	}
	o, err := NewCache(testModel, "policy=triattention")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if err := o.QueryStatsSet(0, 0, mean, abs); statusOf(err) != ErrConfig {
		t.Fatalf("online: %v", err)
	}
}

func TestDraftConfigFields(t *testing.T) {
	cfg, err := NewConfig(testModel, draftSpec)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := cfg.Get("max_draft"); v != 4 || cfg.raw.max_draft != 4 {
		t.Fatalf("max_draft %v", v)
	}
	if err := cfg.Set("attn_scale", 0.0625); err != nil || cfg.raw.attn_scale != 0.0625 {
		t.Fatalf("attn_scale: %v %v", err, cfg.raw.attn_scale)
	}
	if err := cfg.Set("logit_softcap", 50); err != nil || cfg.raw.logit_softcap != 50 {
		t.Fatalf("logit_softcap: %v %v", err, cfg.raw.logit_softcap)
	}
	if err := cfg.Set("attn_scale", 2); statusOf(err) != ErrConfig || cfg.raw.attn_scale != 0.0625 {
		t.Fatalf("attn_scale=2 out of range: %v, field %v", err, cfg.raw.attn_scale)
	}
}

func TestDraftCommitEqualsTwin(t *testing.T) {
	r := rng(0x2b7e1516)
	prompt, draft := draftToks(&r, 9), draftToks(&r, 3)
	c, twin := mustCache(t, draftSpec), mustCache(t, draftSpec)
	prefillAll(t, c, prompt)
	prefillAll(t, twin, prompt)
	if err := c.DraftBegin(); err != nil {
		t.Fatal(err)
	}
	for l := 0; l < int(testModel.Layers); l++ {
		out := make([]float32, len(draft.q))
		if err := c.Prefill(l, draft.q, draft.k, draft.v, nil, out); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DraftCommit(2); err != nil {
		t.Fatal(err)
	}
	prefillAll(t, twin, draft.head(2))
	if a, b := kept(t, c), kept(t, twin); !reflect.DeepEqual(a, b) {
		t.Fatalf("kept %v, twin %v", a, b)
	}
	sa, _ := c.Stats()
	sb, _ := twin.Stats()
	if sa != sb {
		t.Fatalf("stats %+v, twin %+v", sa, sb)
	}
	if a, b := decodeBits(t, c, 77), decodeBits(t, twin, 77); !reflect.DeepEqual(a, b) {
		t.Fatal("decode after commit differs from the twin's")
	}
}

func TestStateSaveLoad(t *testing.T) {
	r := rng(0x9e3779b9)
	c := mustCache(t, draftSpec)
	prefillAll(t, c, draftToks(&r, 11))
	decodeBits(t, c, 5)
	n := c.StateSize()
	if n == 0 {
		t.Fatal("state size 0")
	}
	small := bytes.Repeat([]byte{0xa5}, n-1)
	if _, err := c.StateSave(small); statusOf(err) != ErrBuffer || !bytes.Equal(small, bytes.Repeat([]byte{0xa5}, n-1)) {
		t.Fatalf("small buffer: %v", err)
	}
	if _, err := c.StateSave(nil); statusOf(err) != ErrBuffer {
		t.Fatalf("empty buffer: %v", err)
	}
	saved := saveState(t, c)
	if len(saved) != n {
		t.Fatalf("wrote %d of %d", len(saved), n)
	}
	fresh := mustCache(t, draftSpec)
	if err := fresh.StateLoad(saved); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(kept(t, fresh), kept(t, c)) || !bytes.Equal(saveState(t, fresh), saved) {
		t.Fatal("loaded cache differs")
	}
	for step := uint64(0); step < 3; step++ {
		if !reflect.DeepEqual(decodeBits(t, fresh, 100+step), decodeBits(t, c, 100+step)) {
			t.Fatalf("step %d: decode after load differs", step)
		}
	}
}

func TestDraftAndStateErrors(t *testing.T) {
	r := rng(0x12345678)
	c := mustCache(t, draftSpec)
	prefillAll(t, c, draftToks(&r, 5))
	before := saveState(t, c)

	err := c.DraftCommit(0)
	if statusOf(err) != ErrState || !bytes.HasPrefix([]byte(err.Error()), []byte("KVP_ERR_STATE")) {
		t.Fatalf("commit without begin: %v", err)
	}
	if !bytes.Equal(saveState(t, c), before) {
		t.Fatal("failed commit changed the cache")
	}
	if err := c.DraftCommit(-1); statusOf(err) != ErrArg {
		t.Fatalf("commit(-1): %v", err)
	}
	if err := c.DraftBegin(); err != nil {
		t.Fatal(err)
	}
	if err := c.DraftBegin(); statusOf(err) != ErrState {
		t.Fatalf("begin twice: %v", err)
	}
	prefillAll(t, c, draftToks(&r, 2))
	if err := c.DraftCommit(3); statusOf(err) != ErrArg {
		t.Fatalf("commit(3) of 2: %v", err)
	}
	if _, err := c.StateSave(make([]byte, 2*len(before)+4096)); statusOf(err) != ErrState {
		t.Fatalf("save with a draft open: %v", err)
	}
	if err := c.StateLoad(before); statusOf(err) != ErrState {
		t.Fatalf("load with a draft open: %v", err)
	}
	if err := c.DraftCommit(0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(saveState(t, c), before) {
		t.Fatal("commit(0) did not restore the state at begin")
	}

	other := mustCache(t, draftSpec)
	prefillAll(t, other, draftToks(&r, 3))
	otherBefore := saveState(t, other)
	if err := other.StateLoad(before[:len(before)-1]); statusOf(err) != ErrArg {
		t.Fatalf("truncated: %v", err)
	}
	if err := other.StateLoad(before[:16]); statusOf(err) != ErrArg {
		t.Fatalf("truncated to 16: %v", err)
	}
	if err := other.StateLoad(nil); statusOf(err) != ErrArg {
		t.Fatalf("empty: %v", err)
	}
	bad := append([]byte(nil), before...)
	bad[len(bad)/2] ^= 1
	if err := other.StateLoad(bad); statusOf(err) != ErrArg {
		t.Fatalf("corrupted: %v", err)
	}
	if !bytes.Equal(saveState(t, other), otherBefore) {
		t.Fatal("failed load changed the cache")
	}
	nodraft := mustCache(t, "policy=streaming sinks=2 window=6 capacity=32")
	if err := nodraft.StateLoad(before); statusOf(err) != ErrConfig {
		t.Fatalf("other config: %v", err)
	}
	if err := nodraft.DraftBegin(); statusOf(err) != ErrConfig {
		t.Fatalf("begin with max_draft=0: %v", err)
	}
	c.Close()
	if err := c.DraftBegin(); statusOf(err) != ErrState {
		t.Fatalf("closed: %v", err)
	}
	if c.StateSize() != 0 {
		t.Fatal("closed cache has a state size")
	}
}

// Issue 28: a prompt in chunks with max_prompt keeps what one call keeps (PromptEnd).
func TestChunkedPromptWithMaxPromptKeepsWhatOneCallKeeps(t *testing.T) {
	const spec = "policy=snapkv budget=12 obs_window=4 recent=2 max_prompt=64"
	one, err := NewCache(testModel, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	chunked, err := NewCache(testModel, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer chunked.Close()
	r := rng(0x5eed0028)
	prompt := draftToks(&r, 40)
	prefillAll(t, one, prompt)
	m := testModel
	nq, nkv := int(m.QHeads*m.HeadDim), int(m.KVHeads*m.HeadDim)
	for at := 0; at < 40; at += 7 {
		n := 7
		if 40-at < n {
			n = 40 - at
		}
		prefillAll(t, chunked, toks{prompt.q[at*nq : (at+n)*nq], prompt.k[at*nkv : (at+n)*nkv], prompt.v[at*nkv : (at+n)*nkv]})
	}
	if got := chunked.LayerLen(0); got != 40 {
		t.Fatalf("an open prompt holds %d tokens, want 40", got)
	}
	if err := one.PromptEnd(); err != nil {
		t.Fatal(err)
	}
	if err := chunked.PromptEnd(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(kept(t, one), kept(t, chunked)) {
		t.Fatal("chunked prompt kept other tokens than one call")
	}
	if ls, err := chunked.LayerStats(0); err != nil || ls.PromptEarly != 0 || ls.Len != 12 {
		t.Fatalf("layer stats %+v, %v", ls, err)
	}
	if !reflect.DeepEqual(decodeBits(t, one, 5), decodeBits(t, chunked, 5)) {
		t.Fatal("decode outputs differ after the prompt")
	}
}

// issue 32 item 2: a DuoAttention role table (kvp_create_heads). Layer 0's KV head 0 and layer
// 1's KV head 1 stream (duo_sink 2, duo_window 6) and keep 8 tokens; the arena is smaller than
// the uniform one; a state refuses a cache with another table.
func TestDuoHeads(t *testing.T) {
	cfg, err := NewConfig(testModel, "policy=full capacity=64 duo_sink=2 duo_window=6")
	if err != nil {
		t.Fatal(err)
	}
	roles := []uint8{HeadStreaming, HeadRetrieval, HeadRetrieval, HeadStreaming}
	if cfg.ArenaSizeHeads(roles) >= cfg.ArenaSize() || cfg.ArenaSizeHeads(make([]uint8, 4)) != cfg.ArenaSize() ||
		cfg.ArenaSizeHeads(roles[:3]) != 0 {
		t.Fatal("arena sizes")
	}
	c, err := NewCacheHeads(cfg, nil, roles)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := uint64(0); i < 20; i++ {
		decodeBits(t, c, 7+i)
	}
	want := []int32{0, 1, 14, 15, 16, 17, 18, 19}
	for _, lh := range [][2]int{{0, 0}, {1, 1}} {
		if p, err := c.LayerPositions(lh[0], lh[1]); err != nil || !reflect.DeepEqual(p, want) {
			t.Fatalf("layer %d head %d: %v %v", lh[0], lh[1], p, err)
		}
	}
	if p, _ := c.LayerPositions(0, 1); len(p) != 20 {
		t.Fatalf("retrieval head holds %d", len(p))
	}
	if _, err := NewCacheHeads(cfg, nil, []uint8{1, 0, 2, 0}); statusOf(err) != ErrConfig {
		t.Fatalf("role 2: %v", err)
	}
	other, err := NewCacheHeads(cfg, nil, []uint8{0, 1, 1, 0})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.StateLoad(saveState(t, c)); statusOf(err) != ErrConfig {
		t.Fatalf("another table: %v", err)
	}
}

// issue 32 item 1: AdaKV's per-head budgets (head_budget=ada) through the C struct.
func TestAdaHeadBudget(t *testing.T) {
	cfg, err := NewConfig(testModel, "policy=snapkv budget=8 obs_window=2 head_budget=ada ada_floor=0.5")
	if err != nil {
		t.Fatal(err)
	}
	if hb, _ := cfg.Get("head_budget"); hb != 1 {
		t.Fatalf("head_budget %v", hb)
	}
	if af, _ := cfg.Get("ada_floor"); af != 0.5 {
		t.Fatalf("ada_floor %v", af)
	}
	c, err := NewCacheFromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := uint64(0); i < 12; i++ {
		decodeBits(t, c, 11+i)
	}
	if p, _ := c.LayerPositions(0, 0); len(p) != 12 {
		t.Fatalf("layer 0 head 0 holds %d", len(p))
	}
}
