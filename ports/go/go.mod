module kvprune.dev/go/kvprune

go 1.19
