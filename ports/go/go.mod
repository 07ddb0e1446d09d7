module kvprune

go 1.19
