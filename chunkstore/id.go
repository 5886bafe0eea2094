package chunkstore

import (
	"encoding/hex"
	"fmt"

	"github.com/zeebo/blake3"
)

// IDSize is the length of an ID in bytes.
const IDSize = 32

// ID names a chunk or an object: the BLAKE3-256 hash of its bytes.
type ID [IDSize]byte

// Sum returns the ID of b.
func Sum(b []byte) ID { return ID(blake3.Sum256(b)) }

// String returns the ID in lower-case hex.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Short returns the first 12 hex digits, for logs and tables.
func (id ID) Short() string { return hex.EncodeToString(id[:6]) }

// IsZero reports whether id is the zero ID (no object).
func (id ID) IsZero() bool { return id == ID{} }

// MarshalText implements encoding.TextMarshaler (hex).
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (hex).
func (id *ID) UnmarshalText(b []byte) error {
	p, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = p
	return nil
}

// ParseID parses a 64-digit hex ID.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*IDSize {
		return id, fmt.Errorf("parse id %q: want %d hex digits: %w", s, 2*IDSize, ErrInvalidPath)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("parse id %q: %w", s, err)
	}
	return id, nil
}
