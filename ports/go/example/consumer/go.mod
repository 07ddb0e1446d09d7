module example.com/kvprune-consumer

go 1.19

require kvprune.dev/go/kvprune v0.0.0
