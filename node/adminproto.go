package node

// The admin socket's protocol (docs/design/cli.md, "Through a node"): the
// CLI's commands reach a running node through DATA/kylix.sock (mode 0600;
// the node also checks the peer's uid with SO_PEERCRED).
//
//	client -> node: one JSON line, a Request: {"v": 1, "op": "pin", "body": {...}}
//	node -> client: frames: 1 byte kind, 4 bytes big-endian length, payload:
//	  'p' an Event (JSON): progress, or a partial result (a load's pass)
//	  'r' the Reply (JSON) of a typed op; the last frame
//	  'o', 'e' stdout and stderr of an exec'd command line
//	  'x' its exit status (4 bytes); the last frame
//
// Node-only commands (node, peers, pin, unpin, warm, evict, metrics, load,
// import) are typed: a request and a reply type per op, below. The store
// commands that run the same code with or without a node (ls, stat, export,
// verify, gc, ...) are sent as a command line (OpExec) that the CLI's own
// code runs inside the node against its open store (Config.Exec).
//
// When the client goes away (Ctrl-C), the node cancels the request.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"time"

	"github.com/kylix/kylix/chunkstore"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/gpuio"
	"github.com/kylix/kylix/internal/unixsock"
	"github.com/kylix/kylix/node/kvstore"
	"github.com/kylix/kylix/peers"
)

// AdminVersion is the admin protocol's version. A node answers a request
// of another version with an error naming both.
const AdminVersion = 1

// SocketName is the admin socket's name in the data directory.
const SocketName = "kylix.sock"

// The ops.
const (
	OpNode    = "node"
	OpPeers   = "peers"
	OpPin     = "pin"
	OpUnpin   = "unpin"
	OpWarm    = "warm"
	OpEvict   = "evict"
	OpMetrics = "metrics"
	OpLoad    = "load"
	OpImport  = "import"
	OpExec    = "exec"
	// OpKVStats and OpKVClear: the KV store (kv.go: KVStatsReply,
	// KVClearRequest, KVClearReply).
	OpKVStats = "kv-stats"
	OpKVClear = "kv-clear"
	// OpTier moves a path between tiers (tier.go: TierRequest, TierReply).
	OpTier = "tier"
	// OpTierShards sets, clears or lists the cluster's rules of k by
	// path (tier.go: TierShardsRequest, TierShardsReply).
	OpTierShards = "tier-shards"
)

// Request is one admin request.
type Request struct {
	V    int             `json:"v"`
	Op   string          `json:"op"`
	Body json.RawMessage `json:"body,omitempty"`
}

// Reply ends a typed request: Error, or Body (the op's reply type).
type Reply struct {
	Error string          `json:"error,omitempty"`
	Body  json.RawMessage `json:"body,omitempty"`
}

// Event is a frame sent while a request runs: progress (Label, Done and
// Total bytes) or, with Data, a partial result of the op.
type Event struct {
	Label string          `json:"label,omitempty"`
	Done  int64           `json:"done,omitempty"`
	Total int64           `json:"total,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
}

// Progress reports the progress of long work: done of total bytes. label
// says what is done. It may be nil where nobody watches.
type Progress func(label string, done, total int64)

func (p Progress) report(label string, done, total int64) {
	if p != nil {
		p(label, done, total)
	}
}

// ExecRequest is a store command's command line, run inside the node as
// the CLI would run it (OpExec).
type ExecRequest struct {
	Args []string `json:"args"`
	// Cwd is the caller's working directory (absolute): relative paths
	// of the command resolve there.
	Cwd string `json:"cwd"`
	// TTY: the caller's stderr is a terminal (progress bars).
	TTY bool `json:"tty"`
}

// ExecFunc runs an ExecRequest against n, writing the command's output to
// stdout and stderr, and returns its exit status.
type ExecFunc func(ctx context.Context, n *Node, req ExecRequest, stdout, stderr io.Writer) int

// NodeRequest asks for the node's status (OpNode).
type NodeRequest struct {
	// GC runs the Go garbage collector first (memory measurements).
	GC bool `json:"gc,omitempty"`
}

// NodeStatus is the reply of OpNode.
type NodeStatus struct {
	PID      int       `json:"pid"`
	DataDir  string    `json:"data_dir"`
	Mount    string    `json:"mount"`
	Started  time.Time `json:"started"`
	RSSBytes int64     `json:"rss_bytes"`
	// HeapBytes is the Go heap in use (runtime.MemStats.HeapInuse).
	HeapBytes int64     `json:"heap_bytes"`
	FS        kfs.Stats `json:"fs"`
	// PackChecks counts the pack checks before passthrough and the scrub
	// (docs/design/verification.md).
	PackChecks chunkstore.PackVerifyStats `json:"pack_checks"`
	// Clients is the client socket's activity (nil without one).
	Clients *ClientStats `json:"clients,omitempty"`
	// Pins is the node's pins (docs/design/pin.md).
	Pins *PinsStatus `json:"pins,omitempty"`
	// KV is the KV-cache store (docs/design/kv.md; nil without one).
	KV *kvstore.Stats `json:"kv,omitempty"`
	// Whole is the whole copies of deduplicated files (docs/design/whole.md).
	Whole *WholeStatus `json:"whole,omitempty"`
	// Watermark is the high watermark's releases of kept files (a
	// cluster member; docs/design/space.md).
	Watermark *WatermarkStatus `json:"watermark,omitempty"`
}

// PeersStatus is the reply of OpPeers.
type PeersStatus struct {
	Self string `json:"self"`
	// ReadAhead: chunks fetched ahead of sequential readers (chunkstore).
	ReadAhead ReadAheadStatus      `json:"read_ahead"`
	Replicas  int                  `json:"replicas"`
	Placement peers.PlacementStats `json:"placement"`
	Swarm     peers.SwarmStats     `json:"swarm"`
	Members   []peers.Member       `json:"members"`
	// StripeRebuilt: chunks this member rebuilt from their erasure-coded
	// stripes (docs/design/erasure.md).
	StripeRebuilt int64 `json:"stripe_rebuilt_chunks"`
	// StripeShape is the k+m kylix tier cold would code with now, "" when
	// the cluster is too small (StripeNote says why).
	StripeShape string `json:"stripe_shape,omitempty"`
	StripeNote  string `json:"stripe_note,omitempty"`
}

// ReadAheadStatus is the store's read-ahead for sequential readers.
type ReadAheadStatus struct {
	Window int   `json:"window_chunks"`
	Chunks int64 `json:"chunks"`
	Bytes  int64 `json:"bytes"`
}

// PathRequest names a namespace path (OpPin, OpUnpin, OpWarm).
type PathRequest struct {
	Path string `json:"path"`
}

// PinReply is the reply of OpPin.
type PinReply struct {
	Path        string `json:"path"`
	Files       int    `json:"files"`
	Bytes       int64  `json:"bytes"`
	LockedBytes int64  `json:"locked_bytes"`
	BudgetBytes int64  `json:"budget_bytes"`
	UsedBytes   int64  `json:"used_bytes"`
	GPUNote     string `json:"gpu_note"`
	// Cluster: the node is a cluster member (fetched counts apply).
	Cluster bool `json:"cluster"`
	// Fetched: the chunks of the path this node did not store, brought
	// from the members into its packs before locking (cluster only).
	FetchedChunks int   `json:"fetched_chunks"`
	FetchedBytes  int64 `json:"fetched_bytes"`
}

// UnpinReply is the reply of OpUnpin.
type UnpinReply struct {
	Path string `json:"path"`
	// Kept: PATH was not a pin but a file kept by KYLIX_IOC_MAKE_LOCAL.
	Kept        bool  `json:"kept"`
	LockedBytes int64 `json:"locked_bytes"`
	BudgetBytes int64 `json:"budget_bytes"`
}

// EvictRequest is OpEvict: Path, or All.
type EvictRequest struct {
	Path string `json:"path,omitempty"`
	All  bool   `json:"all,omitempty"`
}

// EvictReply is the reply of OpEvict.
type EvictReply struct {
	Path   string `json:"path"` // "" with All
	Chunks int    `json:"chunks"`
	Bytes  int64  `json:"bytes"`
	// CacheBytes and CacheChunks: what the peer cache holds afterwards.
	CacheBytes  int64 `json:"cache_bytes"`
	CacheChunks int   `json:"cache_chunks"`
}

// MetricsReply is the reply of OpMetrics: the node's registry in the
// Prometheus text format, as its --metrics endpoint serves it.
type MetricsReply struct {
	Text string `json:"text"`
}

// ImportRequest is OpImport. Src is an absolute path the node can read
// (the CLI resolves --hf-cache and relative paths first).
type ImportRequest struct {
	Src           string `json:"src"`
	Dest          string `json:"dest"`
	NoDereference bool   `json:"no_dereference,omitempty"`
	// TPSize: after the import, store rank layouts of the safetensors
	// files for this tensor-parallel size (kylix layout; 0: none).
	TPSize int `json:"tp_size,omitempty"`
}

// ImportReply is the reply of OpImport.
type ImportReply struct {
	Result chunkstore.ImportResult `json:"result"`
	// Layouts: with TPSize, the files' rank layouts (or why a file got
	// none); LayoutOthers counts the files that are not safetensors.
	Layouts      []gpuio.RankLayoutsFile `json:"layouts,omitempty"`
	LayoutOthers int                     `json:"layout_others,omitempty"`
	// PushError: the push to the other members failed as a whole;
	// PushFailed names the members it could not reach (a cluster member;
	// their placement passes copy the chunks later).
	PushError  string   `json:"push_error,omitempty"`
	PushFailed []string `json:"push_failed,omitempty"`
}

// ErrNoNode is returned by Dial when no node answers on the data
// directory's admin socket.
var ErrNoNode = errors.New("no node serves this data directory")

// RemoteError is an error a node answered with.
type RemoteError struct{ Msg string }

func (e *RemoteError) Error() string { return e.Msg }

const (
	frameEvent  = 'p'
	frameReply  = 'r'
	frameStdout = 'o'
	frameStderr = 'e'
	frameExit   = 'x'
	maxFrame    = 1 << 20
	maxRequest  = 1 << 20
)

// Client is a connection to a node's admin socket, for one request.
type Client struct {
	conn    *net.UnixConn
	dataDir string
}

// Dial connects to the node serving dataDir; ErrNoNode if none answers.
func Dial(dataDir string) (*Client, error) {
	conn, err := unixsock.Dial("unix", filepath.Join(dataDir, SocketName))
	if err != nil {
		return nil, ErrNoNode // no node (or a stale socket)
	}
	return &Client{conn: conn, dataDir: dataDir}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// send writes the request (its error: see receive).
func (c *Client) send(op string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := json.Marshal(Request{V: AdminVersion, Op: op, Body: b})
	if err != nil {
		return err
	}
	_, err = c.conn.Write(append(req, '\n'))
	return err
}

// Call runs a typed op: req is its request, reply points at its reply
// type (nil: none wanted). Events go to onEvent (may be nil). The request
// is cancelled in the node when ctx ends. It closes the client.
func (c *Client) Call(ctx context.Context, op string, req, reply any, onEvent func(Event)) error {
	defer c.Close()
	return c.receive(ctx, c.send(op, req), func(kind byte, payload []byte) (bool, error) {
		switch kind {
		case frameEvent:
			var ev Event
			if json.Unmarshal(payload, &ev) == nil && onEvent != nil {
				onEvent(ev)
			}
		case frameReply:
			var rep Reply
			if err := json.Unmarshal(payload, &rep); err != nil {
				return true, fmt.Errorf("the node at %s sent a bad reply: %w", c.dataDir, err)
			}
			if rep.Error != "" {
				return true, &RemoteError{Msg: rep.Error}
			}
			if reply != nil && len(rep.Body) > 0 {
				if err := json.Unmarshal(rep.Body, reply); err != nil {
					return true, fmt.Errorf("the node at %s sent a bad reply: %w", c.dataDir, err)
				}
			}
			return true, nil
		}
		return false, nil
	})
}

// Exec runs a store command's command line in the node, copying its
// output to stdout and stderr, and returns its exit status. It closes the
// client.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) (int, error) {
	defer c.Close()
	code := 1
	err := c.receive(ctx, c.send(OpExec, req), func(kind byte, payload []byte) (bool, error) {
		switch kind {
		case frameStdout:
			stdout.Write(payload)
		case frameStderr:
			stderr.Write(payload)
		case frameReply: // refused before it ran (version, permission)
			var rep Reply
			json.Unmarshal(payload, &rep)
			return true, &RemoteError{Msg: rep.Error}
		case frameExit:
			if len(payload) != 4 {
				return true, fmt.Errorf("the node at %s sent a bad exit frame", c.dataDir)
			}
			code = int(int32(binary.BigEndian.Uint32(payload)))
			return true, nil
		}
		return false, nil
	})
	return code, err
}

// receive reads the answer's frames and gives each to handle until it
// says the answer is complete. werr is the error of sending the request:
// a node that refused the peer answers without reading it, so it is
// reported only when no answer comes. ctx ending closes the connection,
// which cancels the request in the node.
func (c *Client) receive(ctx context.Context, werr error, handle func(kind byte, payload []byte) (bool, error)) error {
	stop := context.AfterFunc(ctx, func() { c.conn.Close() })
	defer stop()
	r := bufio.NewReader(c.conn)
	for {
		kind, payload, err := readFrame(r)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if werr != nil {
				err = werr
			}
			return fmt.Errorf("the node at %s went away: %w", c.dataDir, err)
		}
		if done, err := handle(kind, payload); done || err != nil {
			return err
		}
	}
}

func readFrame(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("bad frame of %d bytes", n)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	return hdr[0], payload, nil
}

func writeFrame(w io.Writer, kind byte, p []byte) error {
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(p)
	return err
}
