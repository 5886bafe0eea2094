package chunkstore

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// Tar shards: a directory of many small files seen as a few large
// WebDataset-style tar files (docs/design/datasets.md). A shard is an
// ordinary file in the namespace whose manifest lists, for each member, a
// tar header chunk, the member file's own chunks and a zero padding chunk,
// and ends with the two zero blocks of a tar trailer. So the shards cost
// no second copy of the files' bytes: only the headers (512 bytes a member,
// more for long names) and a handful of distinct zero chunks are new.

// DefaultShardSize is the shard size MakeShards aims at when none is given:
// large enough that a reader moves its bytes in long sequential reads,
// small enough that many ranks and workers each get several shards
// (WebDataset and MosaicML streaming use shards of 64 MiB to 1 GiB).
const DefaultShardSize = 256 << 20

// ShardIndexName is the file MakeShards writes beside the shards: JSON
// naming each shard with its size, samples and members (ShardIndex).
const ShardIndexName = "index.json"

// ShardIndexFormat names the index's layout (ShardIndex.Format).
const ShardIndexFormat = "kylix-tar-shards/1"

// ShardOptions configure Store.MakeShards.
type ShardOptions struct {
	// ShardSize is the size a shard grows to before the next one starts
	// (default DefaultShardSize). Shards end at sample boundaries, so a
	// shard is larger where one sample is.
	ShardSize int64
	// Progress is called after each member with the member bytes placed
	// so far and the total.
	Progress func(done, total int64)
}

// ShardInfo describes one shard in ShardIndex.
type ShardInfo struct {
	Name    string `json:"name"`
	Bytes   int64  `json:"bytes"`
	Samples int    `json:"samples"`
	Files   int    `json:"files"`
}

// ShardIndex is what MakeShards writes to DEST/index.json.
type ShardIndex struct {
	Format  string      `json:"format"`
	Source  string      `json:"source"`
	Samples int         `json:"samples"`
	Files   int         `json:"files"`
	Shards  []ShardInfo `json:"shards"`
}

// ShardResult sums up a MakeShards.
type ShardResult struct {
	ShardIndex
	// MemberBytes is the member files' bytes; TarBytes the shards' bytes
	// (members, headers, padding and trailers); NewBytes what the
	// shards added to the store (headers and padding not stored before).
	MemberBytes int64    `json:"member_bytes"`
	TarBytes    int64    `json:"tar_bytes"`
	NewBytes    int64    `json:"new_bytes"`
	Skipped     []string `json:"skipped,omitempty"`
}

// ErrShardOwners is returned by MakeShards when the files below SRC do not
// all share one owner and group: one shard would then carry bytes of
// several owners, and no single owner and mode says who may read them.
var ErrShardOwners = errors.New("files with different owners")

// shardMember is one file on its way into a shard.
type shardMember struct {
	name string // path below SRC: the tar member's name
	e    Entry
	m    *FileManifest
}

// MakeShards writes the regular files below the namespace directory src as
// tar shards into the namespace directory dest (shard-000000.tar, ... and
// index.json), replacing what dest named. Members are in path order, so
// the files of one WebDataset sample (one key, the path up to the first dot
// of its base name) are adjacent and never split across shards. Symlinks
// and other entries are skipped and listed.
//
// Who may read a shard: the shards get the files' common owner and group
// (ErrShardOwners if they differ), and for each of owner, group and
// others the read bit only if that class may read every member through the
// tree (read on the file, search on every directory from src down). So a
// shard never shows a byte to someone the mount would refuse it to.
//
// The shards are a snapshot: files changed below src later are not seen
// in them until MakeShards runs again.
func (s *Store) MakeShards(ctx context.Context, src, dest string, opts ShardOptions) (ShardResult, error) {
	var res ShardResult
	if opts.ShardSize <= 0 {
		opts.ShardSize = DefaultShardSize
	}
	srcClean, err := CleanPath(src)
	if err != nil {
		return res, fmt.Errorf("shards of %q: %w", src, err)
	}
	destClean, err := CleanPath(dest)
	if err != nil || destClean == "" {
		return res, fmt.Errorf("shards into %q: name a path inside the namespace, such as datasets/NAME.shards: %w", dest, ErrInvalidPath)
	}
	if destClean == srcClean || strings.HasPrefix(destClean+"/", srcClean+"/") || srcClean == "" {
		return res, fmt.Errorf("shards into %q: DEST must lie outside SRC %q: %w", dest, src, ErrInvalidPath)
	}
	top, err := s.Lookup(srcClean)
	if err != nil {
		return res, fmt.Errorf("shards of %s: %w", src, err)
	}
	if top.Kind != KindDir {
		return res, fmt.Errorf("shards of %s: not a directory (%v): %w", src, top.Kind, ErrInvalidPath)
	}

	// Collect the members, their owners and who may read them.
	var members []shardMember
	var total int64
	readable := uint32(0o444) // r bits still held by every member, per class
	search := map[string]uint32{srcClean: 0o111 & UnixMode(top.Mode)}
	err = s.Walk(srcClean, func(p string, e Entry) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == srcClean {
			return nil
		}
		rel := strings.TrimPrefix(p, srcClean+"/")
		parentX := search[path.Dir(p)]
		switch e.Kind {
		case KindDir:
			search[p] = parentX & 0o111 & UnixMode(e.Mode)
			return nil
		case KindFile:
		default:
			res.Skipped = append(res.Skipped, fmt.Sprintf("%s: a %v, not a regular file", rel, e.Kind))
			return nil
		}
		if e.UID != top.UID || e.GID != top.GID {
			return fmt.Errorf("shards of %s: %s is owned by %d:%d, %s by %d:%d: %w",
				src, rel, e.UID, e.GID, src, top.UID, top.GID, ErrShardOwners)
		}
		// Class c may read the member if it may read the file and search
		// every directory down to it (x bits sit one place right of r).
		readable &= UnixMode(e.Mode) & 0o444 & (parentX << 2)
		m, err := s.FileManifest(e.ID)
		if err != nil {
			return fmt.Errorf("shards of %s: %s: %w", src, rel, err)
		}
		members = append(members, shardMember{name: rel, e: e, m: m})
		total += e.Size
		return nil
	})
	if err != nil {
		return res, err
	}
	if len(members) == 0 {
		return res, fmt.Errorf("shards of %s: no regular files below it", src)
	}
	// The directory's own read bit is not needed to read a named file,
	// but the shards list what the directory holds.
	readable &= UnixMode(top.Mode) & 0o444

	im := s.NewImporter()
	defer im.Abort()
	put := func(data []byte) (ChunkRef, error) {
		id := Sum(data)
		stored, err := im.putChunk(id, data)
		if err != nil {
			return ChunkRef{}, err
		}
		if stored {
			res.NewBytes += int64(len(data))
		}
		return ChunkRef{ID: id, Len: uint32(len(data))}, nil
	}

	idx := ShardIndex{Format: ShardIndexFormat, Source: srcClean}
	var entries []Entry
	var cur *FileManifest
	var info ShardInfo
	var lastKey string
	var done int64
	hlc, mtime := s.clock.Now(), time.Now().UnixNano()
	closeShard := func() error {
		if cur == nil {
			return nil
		}
		ref, err := put(make([]byte, 2*512)) // the tar trailer
		if err != nil {
			return err
		}
		cur.Chunks = append(cur.Chunks, ref)
		cur.Size += int64(ref.Len)
		info.Bytes = cur.Size
		id := im.PutObject(cur.Encode())
		entries = append(entries, Entry{Name: info.Name, Kind: KindFile, ID: id, Size: cur.Size,
			Mode: ModeFromUnix(readable), UID: top.UID, GID: top.GID, MTime: mtime, HLC: hlc})
		idx.Shards = append(idx.Shards, info)
		res.TarBytes += cur.Size
		cur = nil
		return nil
	}
	for _, mem := range members {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		key := sampleKey(mem.name)
		newSample := key != lastKey || cur == nil
		if newSample && cur != nil && cur.Size >= opts.ShardSize {
			if err := closeShard(); err != nil {
				return res, fmt.Errorf("shards of %s: %w", src, err)
			}
		}
		if cur == nil {
			cur = &FileManifest{Format: FormatOpaque}
			info = ShardInfo{Name: fmt.Sprintf("shard-%06d.tar", len(idx.Shards))}
			newSample = true
		}
		if newSample {
			info.Samples++
			idx.Samples++
			lastKey = key
		}
		hdr, err := tarHeader(mem)
		if err != nil {
			return res, fmt.Errorf("shards of %s: %s: %w", src, mem.name, err)
		}
		ref, err := put(hdr)
		if err != nil {
			return res, fmt.Errorf("shards of %s: %w", src, err)
		}
		cur.Chunks = append(cur.Chunks, ref)
		cur.Chunks = append(cur.Chunks, mem.m.Chunks...)
		cur.Size += int64(ref.Len) + mem.m.Size
		if pad := (512 - mem.m.Size%512) % 512; pad != 0 {
			ref, err := put(make([]byte, pad))
			if err != nil {
				return res, fmt.Errorf("shards of %s: %w", src, err)
			}
			cur.Chunks = append(cur.Chunks, ref)
			cur.Size += pad
		}
		info.Files++
		idx.Files++
		res.MemberBytes += mem.m.Size
		done += mem.m.Size
		if opts.Progress != nil {
			opts.Progress(done, total)
		}
	}
	if err := closeShard(); err != nil {
		return res, fmt.Errorf("shards of %s: %w", src, err)
	}

	// index.json: one small file of its own.
	js, err := json.MarshalIndent(idx, "", " ")
	if err != nil {
		return res, err
	}
	js = append(js, '\n')
	ref, err := put(js)
	if err != nil {
		return res, fmt.Errorf("shards of %s: %w", src, err)
	}
	im2 := &FileManifest{Format: FormatOpaque, Size: int64(ref.Len), Chunks: []ChunkRef{ref}}
	entries = append(entries, Entry{Name: ShardIndexName, Kind: KindFile, ID: im.PutObject(im2.Encode()), Size: int64(ref.Len),
		Mode: ModeFromUnix(readable), UID: top.UID, GID: top.GID, MTime: mtime, HLC: hlc})

	// The directory DEST: the directory SRC's owner, group and mode
	// (less any write bits: the shards are a snapshot).
	dm := &DirManifest{}
	for _, e := range entries {
		dm.Put(e)
	}
	dirID := im.PutObject(dm.Encode())
	// Commit the chunks and manifests, then name them, then let GC run:
	// an importer holds GC off until it is closed.
	if err := im.Flush(); err != nil {
		return res, fmt.Errorf("shards of %s: %w", src, err)
	}
	err = s.Update(func(tx *NSTx) error {
		return tx.Put(destClean, Entry{Kind: KindDir, ID: dirID, Mode: top.Mode &^ 0o222,
			UID: top.UID, GID: top.GID, MTime: mtime, HLC: hlc})
	})
	if err != nil {
		return res, fmt.Errorf("shards into %s: %w", dest, err)
	}
	if err := im.Close(); err != nil {
		return res, err
	}
	res.ShardIndex = idx
	return res, nil
}

// sampleKey is a member's WebDataset sample key: its path up to the first
// dot of the base name ("a/0001.jpg" and "a/0001.cls" share "a/0001").
// Members in path order keep a key's members adjacent: any name sorting
// between two names starting "K." starts "K." too.
func sampleKey(name string) string {
	dir, base := path.Split(name)
	if i := strings.IndexByte(base, '.'); i > 0 {
		base = base[:i]
	}
	return dir + base
}

// tarHeader returns the tar header block(s) of m: ustar, or PAX records
// before it where the name is too long for ustar.
func tarHeader(m shardMember) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	h := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     m.name,
		Size:     m.m.Size,
		Mode:     int64(UnixMode(m.e.Mode) & 0o7777),
		Uid:      int(m.e.UID),
		Gid:      int(m.e.GID),
		ModTime:  time.Unix(0, m.e.MTime).Truncate(time.Second),
	}
	if err := tw.WriteHeader(h); err != nil {
		return nil, fmt.Errorf("tar header: %w", err)
	}
	// The writer is dropped without Close: its member bytes are the
	// file's chunks, not written here.
	if buf.Len() == 0 || buf.Len()%512 != 0 {
		return nil, fmt.Errorf("tar header of %d bytes", buf.Len())
	}
	return buf.Bytes(), nil
}
