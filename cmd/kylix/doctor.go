package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/chunkstore/storeio"
	"github.com/kylix/kylix/cuda"
	"github.com/kylix/kylix/gpuio"
	"github.com/kylix/kylix/node"
)

func init() {
	register(&command{name: "doctor", summary: "say what this machine can do (GPU, cuFile/GDS, RDMA, io_uring, O_DIRECT, FUSE) and why not", run: runDoctor})
}

// check is one line of the doctor's report.
type check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

type doctorReport struct {
	Checks []check `json:"checks"`
	// Path is what kylix load --path auto would use on cuda:0, and why.
	Path     string `json:"gpu_path"`
	PathNote string `json:"gpu_path_note"`
}

// erasureCheck says whether the cluster of the node serving --data can
// code data cold (kylix tier, serve --cold-after), as the node sees it.
func erasureCheck(ctx context.Context, f *flags) check {
	var out node.PeersStatus
	err := f.call(ctx, node.OpPeers, nil, &out, nil)
	switch {
	case errors.Is(err, node.ErrNoNode):
		return check{Name: "erasure coding", OK: false, Detail: "no node serves " + f.data + ": asked of a running cluster member (kylix serve --listen)"}
	case err != nil:
		return check{Name: "erasure coding", OK: false, Detail: err.Error()}
	case out.StripeShape == "":
		return check{Name: "erasure coding", OK: false, Detail: out.StripeNote}
	}
	return check{Name: "erasure coding", OK: true, Detail: fmt.Sprintf("%d members: kylix tier cold codes %s stripes", len(out.Members), out.StripeShape)}
}

func runDoctor(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "doctor", "[--data DIR] [--json]", `
Checks what this machine offers Kylix and prints one line per capability: GPUs
and driver, cuFile mode (native GDS, P2PDMA, compatibility, absent) and why,
RDMA devices and nvidia-peermem, io_uring, O_DIRECT on the data directory, and
FUSE passthrough, and whether the cluster of the node serving --data can
code data cold (erasure coding). Each line says what works and, if not, why. Also names the
path kylix load would take to cuda:0.`).withJSON()
	if err := f.parse(args, 0, 0); err != nil {
		return err
	}
	rep := doctor(f.data)
	rep.Checks = append(rep.Checks, erasureCheck(ctx, f))
	if f.jsonOut {
		return f.printJSON(rep)
	}
	for _, c := range rep.Checks {
		mark := "ok "
		if !c.OK {
			mark = "no "
		}
		fmt.Fprintf(e.stdout, "%s %-18s %s\n", mark, c.Name, c.Detail)
	}
	fmt.Fprintf(e.stdout, "\nGPU path for kylix load on cuda:0: %s (%s)\n", rep.Path, rep.PathNote)
	return nil
}

func doctor(data string) doctorReport {
	var r doctorReport
	add := func(name string, ok bool, format string, a ...any) {
		r.Checks = append(r.Checks, check{Name: name, OK: ok, Detail: fmt.Sprintf(format, a...)})
	}
	// GPUs.
	gpuOK := false
	if err := cuda.Available(); err != nil {
		add("gpu", false, "%v", err)
	} else {
		n, _ := cuda.DeviceCount()
		ver, _ := cuda.DriverVersion()
		lib, _ := cuda.LibraryPath()
		add("cuda driver", true, "CUDA %d.%d (%s)", ver/1000, ver%1000/10, lib)
		for i := range n {
			d, err := cuda.GetDevice(i)
			if err != nil {
				add(fmt.Sprintf("gpu %d", i), false, "%v", err)
				continue
			}
			info, err := d.Info()
			if err != nil {
				add(fmt.Sprintf("gpu %d", i), false, "%v", err)
				continue
			}
			gpuOK = true
			kind := "discrete (bounce or gds path)"
			if info.Integrated {
				kind = "integrated: CPU and GPU share memory (unified path)"
			}
			add(fmt.Sprintf("gpu cuda:%d", i), true, "%s, %.1f GiB, sm_%d%d, PCI %s, %d copy engines, %s",
				info.Name, float64(info.TotalMem)/(1<<30), info.Major, info.Minor, info.PCIBusID, info.AsyncEngines, kind)
		}
		if n == 0 {
			add("gpu", false, "the CUDA driver loads but reports no device")
		}
	}
	// cuFile.
	info, err := cuda.CuFileStatus()
	switch {
	case err != nil:
		add("cufile", false, "%v", err)
	case info.Mode == cuda.CuFileAbsent:
		add("cufile", false, "absent: %s", info.Reason)
	default:
		native := info.Mode == cuda.CuFileNative || info.Mode == cuda.CuFileP2PDMA
		add("cufile", native, "mode %s (%s): %s", info.Mode, info.Library, info.Reason)
		dir := existingDir(filepath.Join(data, "packs"))
		if perr := cuda.CuFileProbe(dir); perr != nil {
			add("cufile on data", false, "cannot register files in %s: %v", dir, perr)
		} else {
			add("cufile on data", true, "files in %s register with cuFile", dir)
		}
	}
	// RDMA.
	ibs, _ := filepath.Glob("/sys/class/infiniband/*")
	if len(ibs) == 0 {
		add("rdma", false, "no RDMA devices (/sys/class/infiniband is empty): peers use TCP, one copy into pinned memory")
	} else {
		var names []string
		for _, p := range ibs {
			names = append(names, filepath.Base(p))
		}
		add("rdma", true, "devices: %s", strings.Join(names, ", "))
	}
	if _, err := os.Stat("/sys/module/nvidia_peermem"); err == nil {
		add("nvidia-peermem", true, "loaded: GPUDirect RDMA can target GPU memory")
	} else {
		add("nvidia-peermem", false, "module not loaded: no GPUDirect RDMA (NIC -> GPU); network data bounces through pinned host memory")
	}
	// io_uring.
	if err := storeio.Probe(); err != nil {
		add("io_uring", false, "%v: every storage read uses the pread pool", err)
	} else {
		add("io_uring", true, "available (kylix load --reader io_uring, bench-read); the store's page-cache reads use the pread pool, which copies on every core")
	}
	// O_DIRECT on the data directory (or, before it exists, the nearest
	// directory above it: where it will be created).
	probeDir := existingDir(data)
	if err := storeio.ProbeDirect(probeDir); err != nil {
		add("o_direct", false, "%s: %v: cold reads go through the page cache", probeDir, err)
	} else {
		add("o_direct", true, "%s accepts O_DIRECT reads", probeDir)
	}
	// FUSE and passthrough.
	var uts unix.Utsname
	unix.Uname(&uts)
	rel := unix.ByteSliceToString(uts.Release[:])
	var major, minor int
	fmt.Sscanf(rel, "%d.%d", &major, &minor)
	fuseOK, fuseDetail := fuseUsable("/dev/fuse") // as the calling user (doctor_fuse.go)
	add("fuse", fuseOK, "%s", fuseDetail)
	if fuseOK {
		if major > 6 || (major == 6 && minor >= 9) {
			if os.Geteuid() == 0 {
				add("fuse passthrough", true, "kernel %s >= 6.9 and running as root: large contiguous files are served by the kernel from their pack", rel)
			} else {
				add("fuse passthrough", false, "kernel %s supports it, but it needs root (CAP_SYS_ADMIN): files are served by the daemon", rel)
			}
		} else {
			add("fuse passthrough", false, "kernel %s < 6.9: files are served by the daemon", rel)
		}
	}
	// What checks the bytes passthrough reads return (the kernel reads the
	// pack; no Kylix code sees them).
	name, ok, detail := passthroughGuarantee(existingDir(filepath.Join(data, "packs")))
	add(name, ok, "%s", detail)
	name, ok, detail = pinDoctor() // pin.go
	add(name, ok, "%s", detail)
	// The path kylix load would take.
	r.Path, r.PathNote = "none", "no GPU"
	if gpuOK {
		dev, err := gpuio.NewCUDADevice(0)
		if err == nil {
			defer dev.Close()
			dir := existingDir(filepath.Join(data, "packs"))
			p, note := gpuio.ResolvePath(dev, dir, gpuio.PathAuto)
			r.Path, r.PathNote = string(p), note
		} else {
			r.PathNote = err.Error()
		}
	}
	return r
}

// existingDir returns dir or its nearest existing ancestor.
func existingDir(dir string) string {
	for {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		dir = parent
	}
}

// passthroughGuarantee says which guarantee holds for passthrough reads of
// packs in dir: fs-verity where the file system has it, else a check at
// first open plus the scrub. Never more than what holds.
func passthroughGuarantee(dir string) (name string, ok bool, detail string) {
	err := chunkstore.ProbeVerity(dir)
	if err == nil {
		return "passthrough check", true, "fs-verity: whole-file packs are sealed at their first passthrough open and the kernel checks every page read (read, passthrough, mmap)"
	}
	return "passthrough check", true, fmt.Sprintf("verified at first open + scrub at %s/s by default (kylix serve --scrub-rate): "+
		"a pack is proven (hashed whole, or every chunk read and hashed by the node) before its first passthrough open after each boot or change of the pack file; "+
		"a byte flipped on disk later is caught by the scrub or the next change, not by every read (%v)",
		human(chunkstore.DefaultScrubRate), err)
}
