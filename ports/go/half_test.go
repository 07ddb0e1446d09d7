package kvprune

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
)

// Half-precision rows through the Go binding (kvp_*_ex): the same cache as the float32 calls on
// the widened values, outputs rounded; bad rows leave the cache unchanged.

const halfSpec = "policy=h2o budget=16 recent=4 capacity=32"

// halfVals: multiples of 1/64 in [-1, 1), exact in f16 and bf16.
func halfVals(seed uint64, n int) []float32 {
	x := seed
	out := make([]float32, n)
	for i := range out {
		x = x*6364136223846793005 + 1
		out[i] = float32(int32(x>>57)-64) / 64
	}
	return out
}

func toBF16(x []float32) []uint16 {
	out := make([]uint16, len(x))
	for i, f := range x {
		out[i] = uint16(math.Float32bits(f) >> 16)
	}
	return out
}

// toF16 for values exact in f16 (normal or zero).
func toF16(x []float32) []uint16 {
	out := make([]uint16, len(x))
	for i, f := range x {
		b := math.Float32bits(f)
		if f == 0 {
			out[i] = uint16((b >> 16) & 0x8000)
			continue
		}
		out[i] = uint16(((b >> 16) & 0x8000) | ((((b >> 23) & 255) - 112) << 10) | ((b >> 13) & 0x3ff))
	}
	return out
}

func bf16Round(x []float32) []uint16 {
	out := make([]uint16, len(x))
	for i, f := range x {
		u := math.Float32bits(f)
		out[i] = uint16((u + 0x7fff + ((u >> 16) & 1)) >> 16)
	}
	return out
}

func halfTwin(t *testing.T, dt Half) {
	a, b := mustCache(t, halfSpec), mustCache(t, halfSpec)
	m := testModel
	nq, nkv := int(m.QHeads*m.HeadDim), int(m.KVHeads*m.HeadDim)
	bits := toF16
	if dt == BF16 {
		bits = toBF16
	}
	ho, fo := make([]uint16, nq), make([]float32, nq)
	for s := uint64(0); s < 24; s++ {
		q, k, v := halfVals(3*s+1, nq), halfVals(3*s+2, nkv), halfVals(3*s+3, nkv)
		for l := 0; l < int(m.Layers); l++ {
			switch {
			case s < 8:
				if err := a.PrefillHalf(l, dt, bits(q), bits(k), bits(v), nil, ho); err != nil {
					t.Fatal(err)
				}
				if err := b.Prefill(l, q, k, v, nil, fo); err != nil {
					t.Fatal(err)
				}
			case s < 10:
				if err := a.AppendHalf(l, dt, bits(k), bits(v), nil); err != nil {
					t.Fatal(err)
				}
				if err := b.Append(l, k, v, nil); err != nil {
					t.Fatal(err)
				}
				continue
			default:
				if err := a.DecodeHalf(l, dt, bits(q), bits(k), bits(v), ho); err != nil {
					t.Fatal(err)
				}
				if err := b.Decode(l, q, k, v, fo); err != nil {
					t.Fatal(err)
				}
			}
			if dt == BF16 && !reflect.DeepEqual(ho, bf16Round(fo)) {
				t.Fatalf("step %d layer %d: bf16 outputs are not the rounded float32 outputs", s, l)
			}
		}
	}
	if !bytes.Equal(saveState(t, a), saveState(t, b)) {
		t.Fatal("states differ")
	}
}

func TestHalfF16Twin(t *testing.T)  { halfTwin(t, F16) }
func TestHalfBF16Twin(t *testing.T) { halfTwin(t, BF16) }

func TestHalfErrors(t *testing.T) {
	c := mustCache(t, halfSpec)
	m := testModel
	nq, nkv := int(m.QHeads*m.HeadDim), int(m.KVHeads*m.HeadDim)
	q, k, v, out := toF16(halfVals(1, nq)), toF16(halfVals(2, nkv)), toF16(halfVals(3, nkv)), make([]uint16, nq)
	if err := c.DecodeHalf(0, F16, q, k, v, out); err != nil {
		t.Fatal(err)
	}
	before := saveState(t, c)
	k[5] = 0x7c00 // +Inf
	err := c.DecodeHalf(0, F16, q, k, v, out)
	if statusOf(err) != ErrNonFinite || !strings.Contains(err.Error(), "k[5]") {
		t.Fatalf("f16 Inf: %v", err)
	}
	bv := toBF16(halfVals(3, nkv))
	bv[1] = 0x7fc0 // bf16 NaN
	if err := c.AppendHalf(1, BF16, toBF16(halfVals(2, nkv)), bv, nil); statusOf(err) != ErrNonFinite {
		t.Fatalf("bf16 NaN: %v", err)
	}
	if err := c.DecodeHalf(0, Half(9), q, k, v, out); statusOf(err) != ErrArg {
		t.Fatalf("bad dtype: %v", err)
	}
	if !bytes.Equal(saveState(t, c), before) {
		t.Fatal("a refused call changed the cache")
	}
}
