// A separate module that uses the binding by its module path (see docs/ports.md: a go.work
// beside it points at a checkout; no replace directive).
package main

import (
	"fmt"
	"os"

	kvprune "kvprune.dev/go/kvprune"
)

func main() {
	c, err := kvprune.NewCache(kvprune.Model{Layers: 2, QHeads: 4, KVHeads: 2, HeadDim: 64,
		Rope: kvprune.RopeNeox, RopeTheta: 10000}, "policy=streaming sinks=4 window=252")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	q, kv, out := make([]float32, 4*64), make([]float32, 2*64), make([]float32, 4*64)
	for layer := 0; layer < 2; layer++ {
		if err := c.Decode(layer, q, kv, kv, out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	st, _ := c.Stats()
	fmt.Printf("consumer: %d token(s), %d live bytes\n", st.TokensSeen, st.LiveBytes)
}
