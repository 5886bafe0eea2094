module github.com/kylix/kylix

go 1.26.0

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/hanwen/go-fuse/v2 v2.12.1 // indirect
	github.com/klauspost/cpuid/v2 v2.0.12 // indirect
	github.com/pawelgaczynski/giouring v0.0.0-20230826085535-69588b89acb9 // indirect
	github.com/zeebo/blake3 v0.2.4 // indirect
	go.etcd.io/bbolt v1.4.3 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/term v0.48.0 // indirect
)
