package node

// STAT and PACKS (docs/design/client.md, docs/design/preload.md): what a
// client learns of a file it opened, and the pack fds it is handed. With
// flags, PACKS also hands out shared packs (the LD_PRELOAD shim asks for
// them), so that a deduplicated fine-tune's chunks in its base's pack are
// read without FUSE.

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/clientproto"
	kfs "github.com/kylix/kylix/fs"
	"github.com/kylix/kylix/fs/layout"
)

// opPacksFlags answers PACKS. Without flags (version 1's empty body) only
// the whole-file pack (opPacks). With PacksShared, every pack of the
// file's table (up to MaxFds), each under its own rule:
//   - the file's whole-file pack: the passthrough check (opPacks);
//   - any other pack: only if the caller may read every file with bytes
//     in it (kfs.PackReadableBy, the caller's uid and groups), the pack
//     takes no more appends (Store.SealForHandout), the file's chunks in
//     it pass their check (OpenCheckedChunks), and every byte of the fd
//     handed out is a live file's, padding, a hole or zero
//     (kfs.PackHandableTo, on the fd itself, after the seal).
//
// A pack that fails a rule is left out (its chunks are read through the
// mount); the reply's message says which were left out and why.
func (c *clientServer) opPacksFlags(sf *chunkstore.File, body []byte, p peer) reply {
	flags, err := clientproto.ParsePacksRequest(body)
	if err != nil {
		return refuse(err)
	}
	if flags&clientproto.PacksShared == 0 {
		return c.opPacks(sf)
	}
	whole, _, hasWhole := sf.PassthroughCandidate()
	var es []clientproto.PackEntry
	var fds []*os.File
	var why []string
	cred, credErr := kfs.CredOfPeer(p.pid, p.uid, p.gid)
	for i, pack := range kfs.PackTable(sf) {
		if len(es) == clientproto.MaxFds {
			why = append(why, fmt.Sprintf("more than %d packs", clientproto.MaxFds))
			break
		}
		var pf *os.File
		var fl uint32
		err = chunkstore.ErrNotWholeFile
		if hasWhole && pack == whole {
			pf, err = c.s.OpenPassthrough(c.ctx, sf)
			fl = clientproto.PackWholeFile | clientproto.PackChecked
		}
		// Not the file's whole-file pack (a base's pack is the candidate
		// of a fine-tune that keeps most of its bytes in place, and fails
		// the whole-file check): the rule for shared packs.
		if errors.Is(err, chunkstore.ErrNotWholeFile) {
			fl = clientproto.PackShared | clientproto.PackChecked
			err = credErr
			if err == nil {
				// Cheap refusal first (a cached map lookup), before any
				// hashing or sealing for a caller who may not have it.
				var ok bool
				ok, err = c.fsys.PackReadableBy(pack, cred)
				if err == nil && !ok {
					err = fmt.Errorf("it holds bytes of a file uid %d may not read", p.uid)
				}
			}
			if err == nil {
				// Nothing is appended to a pack once its fd is out:
				// the fd reads only bytes there now, which the rule
				// below checks (docs/design/client.md).
				err = c.s.SealForHandout(pack)
			}
			if err == nil {
				pf, err = c.s.OpenCheckedChunks(c.ctx, sf, pack)
			}
			if err == nil {
				if err = c.fsys.PackHandableTo(pack, pf, cred); err != nil {
					pf.Close()
					pf = nil
				}
			}
		}
		if err != nil {
			if errors.Is(err, chunkstore.ErrCorrupt) {
				c.log.Warn("client asked for a pack that failed its check; not handed out", "file", sf.ID.Short(), "err", err)
			}
			why = append(why, fmt.Sprintf("pack %d: %v", i, err))
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(pf.Fd()), &st); err != nil {
			pf.Close()
			why = append(why, fmt.Sprintf("pack %d: %v", i, err))
			continue
		}
		c.packFdBytes.Add(st.Size)
		es = append(es, clientproto.PackEntry{PackIndex: uint32(i), Flags: fl,
			Generation: layout.Generation(st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()), Size: uint64(st.Size)})
		fds = append(fds, pf)
	}
	c.packFds.Add(int64(len(fds)))
	msg := ""
	if len(why) > 0 {
		msg = fmt.Sprintf("%d pack(s) not handed out, their chunks read through the mount: %v", len(why), why)
		if len(msg) > 1000 {
			msg = msg[:1000]
		}
	}
	return reply{msg: msg, fields: clientproto.AppendPacks(nil, es), fds: fds}
}

func (c *clientServer) opStat(sf *chunkstore.File) reply {
	r := clientproto.StatReply{Size: uint64(sf.Size()), FileID: sf.ID, NChunks: uint32(len(sf.M.Chunks))}
	if plan, err := sf.Plan(0, sf.Size()); err == nil {
		for _, pc := range plan.Pieces {
			if pc.Local() {
				r.LocalChunks++
			}
		}
		plan.Release()
	} else {
		return refuse(err)
	}
	return reply{fields: r.Append(nil)}
}

// opPacks hands out the file's whole-file pack if it passes the very check
// passthrough opens pass (chunkstore.Store.OpenPassthrough): such a pack
// holds nothing but this file's bytes, so the caller, who may read the
// file, learns nothing else; and its bytes were proven against the
// manifest since the pack last changed. Any other pack (shared with other
// files, or failing its check) stays private: n = 0 and the caller reads
// through the mount, where every chunk is verified.
func (c *clientServer) opPacks(sf *chunkstore.File) reply {
	pf, err := c.s.OpenPassthrough(c.ctx, sf)
	switch {
	case errors.Is(err, chunkstore.ErrNotWholeFile):
		return reply{msg: "no whole-file pack: read through the mount", fields: clientproto.AppendPacks(nil, nil)}
	case errors.Is(err, chunkstore.ErrCorrupt):
		c.log.Warn("client asked for a pack that failed its check; not handed out", "file", sf.ID.Short(), "err", err)
		return reply{msg: "the file's pack failed its check; read through the mount, which verifies every chunk", fields: clientproto.AppendPacks(nil, nil)}
	case err != nil:
		return refuse(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(pf.Fd()), &st); err != nil {
		pf.Close()
		return refuse(err)
	}
	e := clientproto.PackEntry{PackIndex: 0, Flags: clientproto.PackWholeFile | clientproto.PackChecked,
		Generation: layout.Generation(st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()), Size: uint64(st.Size)}
	c.packFds.Add(1)
	c.packFdBytes.Add(st.Size)
	return reply{fields: clientproto.AppendPacks(nil, []clientproto.PackEntry{e}), fds: []*os.File{pf}}
}
