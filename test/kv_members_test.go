package test

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/clientproto"
)

// kvMember is a cluster member with a KV store and a client socket.
type kvMember struct {
	*member
	sock string
}

func startKVMember(t *testing.T, ip, key string, env []string, join ...string) kvMember {
	t.Helper()
	sockDir := t.TempDir()
	sock := filepath.Join(sockDir, "client.sock")
	m := startMemberArgs(t, ip, key, env, []string{"--client-socket", sock, "--kv-block", "64KiB", "--kv-mem", "4MiB"}, join...)
	killOnFailure(t, m.node)
	waitFor(t, 10*time.Second, "the client socket of "+ip, func() bool { return clientAnswers(sock) })
	return kvMember{m, sock}
}

type kvMemberStats struct {
	Members struct {
		Hits        int64 `json:"hits"`
		Misses      int64 `json:"misses"`
		Pushed      int64 `json:"pushed"`
		PushFailed  int64 `json:"push_failed"`
		PushWaiting int64 `json:"push_waiting"`
	} `json:"members"`
}

func kvMemberStatsOf(t *testing.T, m kvMember) kvMemberStats {
	t.Helper()
	var st kvMemberStats
	require.NoError(t, json.Unmarshal([]byte(mustKylix(t, "/", "kv", "stats", "--data", m.data, "--json")), &st))
	return st
}

// waitPushed waits until m has copied every block put on it to its home.
func waitPushed(t *testing.T, m kvMember) {
	t.Helper()
	waitFor(t, 20*time.Second, "the copies to the home members", func() bool { return kvMemberStatsOf(t, m).Members.PushWaiting == 0 })
}

// TestKVMembersTier: three `kylix serve` members with KV stores on
// loopback, one of them a liar (it flips the first byte of every block it
// serves: KYLIX_TEST_PEER_CORRUPT).
//   - 32 blocks put on A: KV_CONTAINS on B names each (kept on B or by a
//     member); a get on B finds every one, byte for byte, from
//     B's memory (the copy A sent to B, its home) or from another member;
//     blocks whose home is the liar come from A after the liar's bytes
//     fail their BLAKE3 (counted against it); a second get is local;
//   - 32 blocks put on the liar: a get on B finds those copied to their
//     homes; those that only the liar holds are misses, never its bytes.
func TestKVMembersTier(t *testing.T) {
	requireFUSE(t)
	key := clusterKey(t)
	a := startKVMember(t, "127.0.0.93", key, nil)
	b := startKVMember(t, "127.0.0.94", key, nil, a.addr)
	liar := startKVMember(t, "127.0.0.95", key, []string{"KYLIX_TEST_PEER_CORRUPT=1"}, a.addr)
	for _, m := range []kvMember{a, b, liar} {
		waitFor(t, membershipWait, "three alive members seen by "+m.addr, func() bool { return aliveCount(t, m.member) == 3 })
	}
	ca, cb, cl := dialClient(t, a.sock), dialClient(t, b.sock), dialClient(t, liar.sock)
	ids := make([]int, 32)
	for i := range ids {
		ids[i] = i
	}
	fd := memBuf(t, len(ids))
	for _, st := range ca.kvPut(fd, "a", ids...) {
		require.Zero(t, st)
	}
	waitPushed(t, a)
	// KV_CONTAINS on B names every block: kept on B, or by a member.
	for i, tier := range cb.kvContains(ids...) {
		assert.Contains(t, []byte{clientproto.KVMemory, clientproto.KVMember}, tier, "key %d: contains on B", ids[i])
	}
	// kvGet checks every hit against the block A put.
	tiers := cb.kvGet(fd, "a", ids...)
	local, member := 0, 0
	for i, tier := range tiers {
		switch tier {
		case clientproto.KVMemory:
			local++
		case clientproto.KVMember:
			member++
		default:
			t.Errorf("key %d: tier %d on B, want every block found", ids[i], tier)
		}
	}
	assert.Positive(t, local, "blocks whose home is B were copied there")
	assert.Positive(t, member, "blocks whose home is another member were fetched")
	assert.Positive(t, peersOf(t, b.member)["127.0.0.95"].BadChunks, "the liar's blocks were caught")
	for i, tier := range cb.kvGet(fd, "a", ids...) {
		assert.Equal(t, byte(clientproto.KVMemory), tier, "key %d: kept on B after the first get", ids[i])
	}
	st := kvMemberStatsOf(t, b)
	assert.Equal(t, int64(member), st.Members.Hits)

	// Blocks put on the liar: what it copied to their homes is right;
	// what only it holds is a miss on B.
	lids := make([]int, 32)
	for i := range lids {
		lids[i] = 100 + i
	}
	for _, st := range cl.kvPut(fd, "liar", lids...) {
		require.Zero(t, st)
	}
	waitPushed(t, liar)
	hits, misses := 0, 0
	for _, tier := range cb.kvGet(fd, "liar", lids...) { // a hit's bytes are checked
		if tier == clientproto.KVMiss {
			misses++
		} else {
			hits++
		}
	}
	assert.Positive(t, hits, "blocks the liar copied to their homes are found")
	assert.Positive(t, misses, "blocks only the liar holds are misses")
	assert.Equal(t, int64(misses), kvMemberStatsOf(t, b).Members.Misses)
	if t.Failed() {
		for _, m := range []kvMember{a, b, liar} {
			t.Logf("%s log:\n%s", m.addr, m.log)
		}
	}
}
