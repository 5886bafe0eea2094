// Command readbench is the load generator of the FUSE benchmarks
// (test/bench/fuse.sh): sequential 1 MiB reads of files, of a file's
// extents straight from its backing packs (through the layout ioctl), of a
// whole tree of small files, and the synthetic namespaces the metadata
// benchmarks list.
//
//	readbench seq FILE...          read each file with 1 MiB preads
//	readbench extents FILE         read FILE's extents from its packs
//	readbench tree DIR             read every regular file under DIR
//	readbench mkns DATA N PERDIR   add N files (PERDIR per directory) under
//	                               bench/ in the store in DATA (no node running)
//	readbench gen FILE SIZE SEED   write SIZE pseudo-random bytes
//	readbench mutate SRC DST STEP LEN SEED
//	                               copy SRC to DST, replacing LEN bytes every STEP
//	readbench small DIR N SEED     write N files of 4-64 KiB under DIR
//	readbench stgen FILE SIZE DUPPCT CHANGEPCT SEED
//	                               write a safetensors file of 4 MiB tensors
//	                               (SIZE bytes of them): DUPPCT% of the tensors
//	                               are copies of the first, CHANGEPCT% differ
//	                               from the file with the same SEED and
//	                               CHANGEPCT 0 (a fine-tune of it)
//
// With READBENCH_DIRECT=1, seq opens with O_DIRECT (every read reaches the
// FUSE daemon instead of the page cache).
//
// Each prints one line: bytes, seconds, GB/s (and files/s for tree).
package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/safetensors"
	"github.com/kylix/kylix/fs/layout"
)

const bufSize = 1 << 20

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: readbench seq|extents|tree|mkns ARGS")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "seq":
		err = seq(os.Args[2:])
	case "extents":
		err = extents(os.Args[2])
	case "tree":
		err = tree(os.Args[2])
	case "mkns":
		err = mkns(os.Args[2:])
	case "gen":
		err = gen(os.Args[2:])
	case "mutate":
		err = mutate(os.Args[2:])
	case "small":
		err = small(os.Args[2:])
	case "stgen":
		err = stgen(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "readbench:", err)
		os.Exit(1)
	}
}

func report(n int64, d time.Duration, extra string) {
	fmt.Printf("bytes=%d seconds=%.3f GBps=%.3f%s\n", n, d.Seconds(), float64(n)/d.Seconds()/1e9, extra)
}

func readAll(f *os.File, buf []byte) (int64, error) {
	var off int64
	for {
		n, err := f.ReadAt(buf, off)
		off += int64(n)
		if err == io.EOF {
			return off, nil
		}
		if err != nil {
			return off, err
		}
	}
}

func seq(files []string) error {
	buf := make([]byte, bufSize)
	start := time.Now()
	var total int64
	flags := os.O_RDONLY
	if os.Getenv("READBENCH_DIRECT") == "1" {
		flags |= syscall.O_DIRECT
		buf = alignedBuf(bufSize)
	}
	for _, p := range files {
		f, err := os.OpenFile(p, flags, 0)
		if err != nil {
			return err
		}
		n, err := readAll(f, buf)
		f.Close()
		total += n
		if err != nil {
			return err
		}
	}
	report(total, time.Since(start), "")
	return nil
}

// extents reads the file's bytes from its packs, as the bypass library
// would: ask the layout ioctl, then 1 MiB preads of each extent.
func extents(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(f.Fd())
	var exts []layout.Extent
	for off := uint64(0); ; {
		rep, err := layout.Query(fd, off, 0)
		if err != nil {
			return err
		}
		exts = append(exts, rep.Extents...)
		if rep.NextOffset >= rep.FileSize {
			break
		}
		off = rep.NextOffset
	}
	packs := map[uint64]*os.File{}
	for _, x := range exts {
		if x.PackID == 0 {
			return fmt.Errorf("extent at %d is not local", x.FileOffset)
		}
		if packs[x.PackID] == nil {
			path, err := layout.PackPath(fd, x.PackID)
			if err != nil {
				return err
			}
			if packs[x.PackID], err = os.Open(path); err != nil {
				return err
			}
		}
	}
	buf := make([]byte, bufSize)
	start := time.Now()
	var total int64
	for _, x := range exts {
		pf := packs[x.PackID]
		for done := uint64(0); done < x.Length; {
			n := min(uint64(len(buf)), x.Length-done)
			m, err := pf.ReadAt(buf[:n], int64(x.PackOffset+done))
			if err != nil {
				return err
			}
			done += uint64(m)
			total += int64(m)
		}
	}
	report(total, time.Since(start), fmt.Sprintf(" extents=%d packs=%d", len(exts), len(packs)))
	return nil
}

func tree(dir string) error {
	buf := make([]byte, bufSize)
	start := time.Now()
	var total, files int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		n, err := readAll(f, buf)
		f.Close()
		total += n
		files++
		return err
	})
	if err != nil {
		return err
	}
	d := time.Since(start)
	report(total, d, fmt.Sprintf(" files=%d files_per_s=%.0f", files, float64(files)/d.Seconds()))
	return nil
}

// mkns makes a synthetic namespace: n files of one shared 100-byte content
// (content addressing makes that legitimate), perDir to a directory.
func mkns(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("mkns DATA N PERDIR")
	}
	n, _ := strconv.Atoi(args[1])
	perDir, _ := strconv.Atoi(args[2])
	s, err := chunkstore.Open(chunkstore.Options{Dir: args[0]})
	if err != nil {
		return err
	}
	defer s.Close()
	tmp, err := os.CreateTemp("", "mkns-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tmp.WriteString("a small file shared by every name in the synthetic namespace, 100 bytes long......................\n")
	im := s.NewImporter()
	defer im.Abort()
	r, err := im.PutFile(context.Background(), tmp, "f", nil)
	if err != nil {
		return err
	}
	if err := im.Flush(); err != nil {
		return err
	}
	start := time.Now()
	var dirs []chunkstore.Entry
	for d := 0; d*perDir < n; d++ {
		m := &chunkstore.DirManifest{}
		for i := d * perDir; i < min(n, (d+1)*perDir); i++ {
			m.Put(chunkstore.Entry{Name: fmt.Sprintf("file-%07d.bin", i), Kind: chunkstore.KindFile, Mode: 0o644, Size: r.Size, ID: r.ID, MTime: time.Now().UnixNano()})
		}
		dirs = append(dirs, chunkstore.Entry{Name: fmt.Sprintf("dir-%05d", d), Kind: chunkstore.KindDir, Mode: 0o755, ID: im.PutObject(m.Encode())})
	}
	if err := im.Flush(); err != nil {
		return err
	}
	top := &chunkstore.DirManifest{}
	for _, e := range dirs {
		top.Put(e)
	}
	err = s.Update(func(tx *chunkstore.NSTx) error {
		return tx.Put("bench", chunkstore.Entry{Kind: chunkstore.KindDir, Mode: 0o755, ID: tx.PutDir(top)})
	})
	if err != nil {
		return err
	}
	if err := im.Close(); err != nil {
		return err
	}
	fmt.Printf("files=%d dirs=%d seconds=%.1f\n", n, len(dirs), time.Since(start).Seconds())
	return nil
}

func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 4095)
	return b[off : off+n]
}

func fill(r *rand.ChaCha8, b []byte) {
	r.Read(b)
}

func gen(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("gen FILE SIZE SEED")
	}
	size, _ := strconv.ParseInt(args[1], 10, 64)
	seed, _ := strconv.ParseUint(args[2], 10, 64)
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	r := rand.NewChaCha8(key)
	f, err := os.Create(args[0])
	if err != nil {
		return err
	}
	buf := make([]byte, 4<<20)
	for done := int64(0); done < size; {
		n := min(int64(len(buf)), size-done)
		fill(r, buf[:n])
		if _, err := f.Write(buf[:n]); err != nil {
			return err
		}
		done += n
	}
	return f.Close()
}

func mutate(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("mutate SRC DST STEP LEN SEED")
	}
	b, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	step, _ := strconv.Atoi(args[2])
	n, _ := strconv.Atoi(args[3])
	seed, _ := strconv.ParseUint(args[4], 10, 64)
	var key [32]byte
	key[0] = byte(seed)
	r := rand.NewChaCha8(key)
	for off := step / 2; off+n <= len(b); off += step {
		fill(r, b[off:off+n])
	}
	return os.WriteFile(args[1], b, 0o644)
}

func small(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("small DIR N SEED")
	}
	n, _ := strconv.Atoi(args[1])
	seed, _ := strconv.ParseUint(args[2], 10, 64)
	var key [32]byte
	key[0] = byte(seed)
	r := rand.NewChaCha8(key)
	sizes := rand.New(rand.NewPCG(seed, 1))
	buf := make([]byte, 64<<10)
	for i := range n {
		d := filepath.Join(args[0], fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		sz := 4<<10 + sizes.IntN(60<<10+1)
		fill(r, buf[:sz])
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d.bin", i)), buf[:sz], 0o644); err != nil {
			return err
		}
	}
	return nil
}

func stgen(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("stgen FILE SIZE DUPPCT CHANGEPCT SEED")
	}
	size, _ := strconv.ParseInt(args[1], 10, 64)
	dupPct, _ := strconv.Atoi(args[2])
	changePct, _ := strconv.Atoi(args[3])
	seed, _ := strconv.ParseUint(args[4], 10, 64)
	const tsize = 4 << 20
	n := int(size / tsize)
	tensor := func(i int, variant byte) []byte {
		var key [32]byte
		key[0], key[1], key[2], key[3], key[4] = byte(seed), byte(seed>>8), byte(i), byte(i>>8), variant
		b := make([]byte, tsize)
		rand.NewChaCha8(key).Read(b)
		return b
	}
	var ts []safetensors.WriteTensor
	ndup, nchange := n*dupPct/100, n*changePct/100
	for i := range n {
		var d []byte
		switch {
		case i > 0 && i <= ndup: // spread would not matter: dedup is by content
			d = ts[0].Data
		case nchange > 0 && i%(n/nchange) == n/nchange/2:
			d = tensor(i, 1)
		default:
			d = tensor(i, 0)
		}
		ts = append(ts, safetensors.WriteTensor{Name: fmt.Sprintf("layer.%05d.weight", i), DType: safetensors.U8, Shape: []int64{tsize}, Data: d})
	}
	f, err := os.Create(args[0])
	if err != nil {
		return err
	}
	if err := safetensors.Write(f, ts, nil); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
