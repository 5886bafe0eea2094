package peers

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/kylix/kylix/chunkstore"
)

// Held asks every alive member which of ids it stores in its packs (the
// peer cache does not count: it may evict). held[i] reports that some
// member that answered stores ids[i]; unanswered lists the alive members
// that could not be asked, with why (their copies are unknown). kylix
// verify on a member uses it to tell chunks other members hold from
// chunks the cluster lost (docs/design/verification.md).
func (n *Node) Held(ctx context.Context, ids []chunkstore.ID) (held []bool, unanswered []string) {
	held = make([]bool, len(ids))
	if len(ids) == 0 {
		return held, nil
	}
	if !n.started.Load() {
		return held, []string{"this member has not joined its cluster yet"}
	}
	refs := make([]chunkstore.ChunkRef, len(ids))
	for i, id := range ids {
		refs[i] = chunkstore.ChunkRef{ID: id}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range n.livePeers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			has, err := n.askHas(ctx, p, refs)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				unanswered = append(unanswered, fmt.Sprintf("%s: %v", p.name, err))
				return
			}
			for i, ok := range has {
				held[i] = held[i] || ok
			}
		}()
	}
	wg.Wait()
	sort.Strings(unanswered)
	return held, unanswered
}
