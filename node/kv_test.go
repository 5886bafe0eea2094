package node

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestKVRuns(t *testing.T) {
	const bs = 2 << 20
	blk := func(dst, src int64) kvCopy { return kvCopy{dst: dst * bs, src: src * bs, n: bs} }
	run := func(dst, src, blocks int64) kvCopy { return kvCopy{dst: dst * bs, src: src * bs, n: blocks * bs} }
	for _, tc := range []struct {
		name string
		in   []kvCopy
		max  int64
		want []kvCopy
	}{
		{"a batch got back as it was put is one copy",
			[]kvCopy{blk(0, 10), blk(1, 11), blk(2, 12), blk(3, 13)}, 64 << 20, []kvCopy{run(0, 10, 4)}},
		{"the order of the keys does not matter",
			[]kvCopy{blk(3, 13), blk(1, 11), blk(0, 10), blk(2, 12)}, 64 << 20, []kvCopy{run(0, 10, 4)}},
		{"adjacent in the caller's memory only: separate copies",
			[]kvCopy{blk(0, 10), blk(1, 12), blk(2, 11)}, 64 << 20, []kvCopy{blk(0, 10), blk(1, 12), blk(2, 11)}},
		{"adjacent in the arena only: separate copies",
			[]kvCopy{blk(0, 10), blk(2, 11)}, 64 << 20, []kvCopy{blk(0, 10), blk(2, 11)}},
		{"misses (n 0) are left out and break a run",
			[]kvCopy{blk(0, 10), {}, blk(2, 12)}, 64 << 20, []kvCopy{blk(0, 10), blk(2, 12)}},
		{"a run stops at max",
			[]kvCopy{blk(0, 0), blk(1, 1), blk(2, 2), blk(3, 3), blk(4, 4)}, 2 * bs, []kvCopy{run(0, 0, 2), run(2, 2, 2), blk(4, 4)}},
		{"none", nil, 64 << 20, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, kvRuns(tc.in, tc.max))
		})
	}
}
