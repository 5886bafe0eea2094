package stripe

import "github.com/kylix/kylix/chunkstore"

// A stripe's record is chunkstore's (chunkstore/stripe.go): file manifests
// name the stripes of their chunks and garbage collection reaches their
// shards, so the format lives with the manifests. These names keep the
// codec's vocabulary.

// Limits of a stripe: at most MaxData data shards (k) and MaxParity parity
// shards (m).
const (
	MaxData   = chunkstore.MaxStripeData
	MaxParity = chunkstore.MaxStripeParity
)

// Record describes one stripe (chunkstore.Stripe).
type Record = chunkstore.Stripe

// Member is one data chunk of a stripe.
type Member = chunkstore.ChunkRef

// ErrBadRecord: bytes that are not a canonical stripe record, or parameters
// no stripe may have.
var ErrBadRecord = chunkstore.ErrBadStripe

// ParseRecord decodes an encoded record (chunkstore.ParseStripe).
func ParseRecord(b []byte) (*Record, error) { return chunkstore.ParseStripe(b) }
