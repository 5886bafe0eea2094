package chunkstore

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The index is a bbolt database; every change is one transaction, fsynced on
// commit. Buckets and record layouts (all integers big-endian):
//
//	chunks:  ID -> pack u64 | offset u64 | length u32
//	packs:   pack u64 -> committed size u64 | flags u8
//	objects: ID -> manifest bytes (FileManifest or DirManifest encoding)
//	heads:   name -> root ID | HLC u64
//	intents: pack u64 -> flags u8 (pack begun, not yet committed)
//	meta:    "version" -> u32; "log" -> log generation u64 | applied offset u64
//
// The index is a cache of the metadata log (metalog.go): every change is
// first appended to the log and synced, then applied here.
var (
	bucketChunks  = []byte("chunks")
	bucketPacks   = []byte("packs")
	bucketObjects = []byte("objects")
	bucketHeads   = []byte("heads")
	bucketMeta    = []byte("meta")
	bucketIntents = []byte("intents")
)

const indexVersion = 1

// Pack flags.
const (
	// packExclusive: the pack was written for one file and holds exactly
	// that file's bytes from offset 0 (when all of its chunks were new).
	packExclusive = 1
)

// Location says where a chunk's bytes are.
type Location struct {
	Pack uint64
	Off  int64
	Len  uint32
}

func (l Location) encode() []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint64(b[0:], l.Pack)
	binary.BigEndian.PutUint64(b[8:], uint64(l.Off))
	binary.BigEndian.PutUint32(b[16:], l.Len)
	return b
}

func decodeLocation(b []byte) (Location, error) {
	if len(b) != 20 {
		return Location{}, fmt.Errorf("index: chunk record of %d bytes: %w", len(b), ErrCorrupt)
	}
	return Location{
		Pack: binary.BigEndian.Uint64(b[0:]),
		Off:  int64(binary.BigEndian.Uint64(b[8:])),
		Len:  binary.BigEndian.Uint32(b[16:]),
	}, nil
}

type packInfo struct {
	Size  int64
	Flags uint8
}

func (p packInfo) encode() []byte {
	b := make([]byte, 9)
	binary.BigEndian.PutUint64(b, uint64(p.Size))
	b[8] = p.Flags
	return b
}

func decodePackInfo(b []byte) (packInfo, error) {
	if len(b) != 9 {
		return packInfo{}, fmt.Errorf("index: pack record of %d bytes: %w", len(b), ErrCorrupt)
	}
	return packInfo{Size: int64(binary.BigEndian.Uint64(b)), Flags: b[8]}, nil
}

func packKey(id uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, id)
	return b
}

// Head is a named, mutable pointer to a root object.
type Head struct {
	Name string
	Root ID
	HLC  HLC
}

func (h Head) encode() []byte {
	b := make([]byte, IDSize+8)
	copy(b, h.Root[:])
	binary.BigEndian.PutUint64(b[IDSize:], uint64(h.HLC))
	return b
}

func decodeHead(name string, b []byte) (Head, error) {
	if len(b) != IDSize+8 {
		return Head{}, fmt.Errorf("index: head %q record of %d bytes: %w", name, len(b), ErrCorrupt)
	}
	h := Head{Name: name, HLC: HLC(binary.BigEndian.Uint64(b[IDSize:]))}
	copy(h.Root[:], b)
	return h, nil
}

func initIndex(db *bolt.DB) error {
	return db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketChunks, bucketPacks, bucketObjects, bucketHeads, bucketMeta, bucketIntents} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get([]byte("version")); v != nil {
			if len(v) != 4 || binary.BigEndian.Uint32(v) != indexVersion {
				return fmt.Errorf("index version %x, this kylix reads %d: %w", v, indexVersion, ErrCorrupt)
			}
			return nil
		}
		v := make([]byte, 4)
		binary.BigEndian.PutUint32(v, indexVersion)
		return meta.Put([]byte("version"), v)
	})
}
