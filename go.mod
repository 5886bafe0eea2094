module github.com/kylix/kylix

go 1.26.0

require (
	github.com/ebitengine/purego v0.11.3
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/stretchr/testify v1.11.1
	github.com/zeebo/blake3 v0.2.4
	go.etcd.io/bbolt v1.4.3
	golang.org/x/sys v0.50.0
	golang.org/x/term v0.48.0
)

require (
	github.com/coreos/go-systemd/v22 v22.7.0
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/klauspost/cpuid/v2 v2.0.12 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	gopkg.in/yaml.v3 v3.0.1
)
