package kvprune

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Issue 30 through the Go binding: the host's parallel-for (thread_pool=host, SetParallel) gives
// the bits of one thread, is called, and nil restores the default.

var parModel = Model{Layers: 2, QHeads: 4, KVHeads: 2, HeadDim: 32}

const parPrompt, parDecodes = 24, 4

// parCache: KVP_PAR_WORK=0 (read at create) puts every call with 2+ threads on all of them.
func parCache(t *testing.T, spec string) *Cache {
	t.Helper()
	t.Setenv("KVP_PAR_WORK", "0")
	c, err := NewCache(parModel, "policy=full capacity=64 "+spec)
	if err != nil {
		t.Fatalf("NewCache(%q): %v", spec, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// parRun: output bits of a prefill and a few decodes in every layer, then the kept positions.
func parRun(t *testing.T, c *Cache) []uint32 {
	t.Helper()
	m := parModel
	qw, kw := int(m.QHeads*m.HeadDim), int(m.KVHeads*m.HeadDim)
	r := rng(0x30000030)
	var bits []uint32
	put := func(x []float32) {
		for _, f := range x {
			bits = append(bits, math.Float32bits(f))
		}
	}
	q, k, v := r.vec(parPrompt*qw), r.vec(parPrompt*kw), r.vec(parPrompt*kw)
	out := make([]float32, len(q))
	for l := 0; l < int(m.Layers); l++ {
		if err := c.Prefill(l, q, k, v, nil, out); err != nil {
			t.Fatal(err)
		}
		put(out)
	}
	for i := 0; i < parDecodes; i++ {
		for l := 0; l < int(m.Layers); l++ {
			q, k, v := r.vec(qw), r.vec(kw), r.vec(kw)
			out := make([]float32, qw)
			if err := c.Decode(l, q, k, v, out); err != nil {
				t.Fatal(err)
			}
			put(out)
		}
	}
	for l := 0; l < int(m.Layers); l++ {
		for h := 0; h < int(m.KVHeads); h++ {
			p, err := c.LayerPositions(l, h)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range p {
				bits = append(bits, uint32(x))
			}
		}
	}
	return bits
}

// goroutines runs t 1..n-1 on goroutines and t 0 on the caller, and counts its calls.
func goroutines(calls *int32) func(n uint32, run func(t uint32)) {
	return func(n uint32, run func(t uint32)) {
		atomic.AddInt32(calls, 1)
		var wg sync.WaitGroup
		for t := uint32(1); t < n; t++ {
			wg.Add(1)
			go func(t uint32) {
				defer wg.Done()
				run(t)
			}(t)
		}
		run(0)
		wg.Wait()
	}
}

func TestThreadPoolKey(t *testing.T) {
	cfg, err := NewConfig(parModel, "thread_pool=host")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := cfg.Get("thread_pool"); v != ThreadPoolHost || cfg.raw.thread_pool != ThreadPoolHost {
		t.Fatalf("thread_pool %v", v)
	}
	if _, err := NewConfig(parModel, "thread_pool=theirs"); !errors.Is(err, ErrConfig) {
		t.Fatalf("thread_pool=theirs: %v", err)
	}
}

func TestSetParallelGoroutinesGiveTheBitsOfOneThread(t *testing.T) {
	want := parRun(t, parCache(t, "threads=1"))
	// in a row, the last t first
	reverse := func(calls *int32) func(n uint32, run func(t uint32)) {
		return func(n uint32, run func(t uint32)) {
			atomic.AddInt32(calls, 1)
			if n < 2 || n > 3 {
				panic("n out of range")
			}
			for t := n; t > 0; t-- {
				run(t - 1)
			}
		}
	}
	cases := []struct {
		name, spec string
		fn         func(*int32) func(n uint32, run func(t uint32))
	}{
		{"goroutines", "threads=3 thread_pool=host", goroutines},
		{"reverse", "threads=3 thread_pool=host", reverse},
		{"reverse, own pool", "threads=3", reverse},
	}
	for _, cs := range cases {
		var calls int32
		c := parCache(t, cs.spec)
		if err := c.SetParallel(cs.fn(&calls)); err != nil {
			t.Fatal(err)
		}
		if got := parRun(t, c); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: bits differ from threads=1", cs.name)
		}
		if calls == 0 {
			t.Fatalf("%s: the parallel function was never called", cs.name)
		}
	}
}

func TestSetParallelNilRestoresAndMisuse(t *testing.T) {
	want := parRun(t, parCache(t, "threads=1"))
	var calls int32
	c := parCache(t, "threads=3 thread_pool=host")
	if err := c.SetParallel(goroutines(&calls)); err != nil {
		t.Fatal(err)
	}
	parRun(t, c)
	n := atomic.LoadInt32(&calls)
	if n == 0 {
		t.Fatal("never called")
	}
	// nil: the caller alone again, same bits, no more calls; kept across Reset
	if err := c.SetParallel(nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if got := parRun(t, c); !reflect.DeepEqual(got, want) || atomic.LoadInt32(&calls) != n {
		t.Fatalf("after nil: equal %v, calls %d -> %d", reflect.DeepEqual(got, want), n, calls)
	}
	// a function that skips every task: the binding runs them
	if err := c.SetParallel(func(uint32, func(uint32)) {}); err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if got := parRun(t, c); !reflect.DeepEqual(got, want) {
		t.Fatal("skipping function: bits differ")
	}
	// run(0) twice panics; the panic continues in the Cache method, after the call completed
	if err := c.SetParallel(func(n uint32, run func(t uint32)) {
		for t := uint32(0); t < n; t++ {
			run(t)
		}
		run(0)
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r, _ := recover().(string); !strings.Contains(r, "run twice") {
				t.Fatalf("recovered %q", r)
			}
		}()
		parRun(t, c)
	}()
	if err := c.SetParallel(goroutines(&calls)); err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if got := parRun(t, c); !reflect.DeepEqual(got, want) {
		t.Fatal("after a panic: bits differ")
	}
	// threads=1 never calls it; a closed cache is ErrState
	one := parCache(t, "threads=1 thread_pool=host")
	if err := one.SetParallel(func(uint32, func(uint32)) { panic("called with threads=1") }); err != nil {
		t.Fatal(err)
	}
	if got := parRun(t, one); !reflect.DeepEqual(got, want) {
		t.Fatal("threads=1: bits differ")
	}
	c.Close()
	if err := c.SetParallel(goroutines(&calls)); !errors.Is(err, ErrState) {
		t.Fatalf("closed cache: %v", err)
	}
	hostParallels.Lock()
	left := len(hostParallels.m)
	hostParallels.Unlock()
	if left != 1 { // one's function; c's went with Close
		t.Fatalf("%d functions registered", left)
	}
}
