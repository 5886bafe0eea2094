package main

// How commands reach a running node (node/adminproto.go): node-only
// commands send a typed request (f.call); store commands that work with or
// without a node forward their command line (forwardToNode), which the
// node runs with execInNode against its open store.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kylix/kylix/chunkstore"
	"github.com/kylix/kylix/node"
)

// changesNamespace names the forwarded commands after which the mount is
// told of a namespace change (the others only read).
var changesNamespace = map[string]bool{"rm": true, "gc": true, "import": true, "shards": true}

// forwardToNode runs the command line in a node serving dataDir, if one
// answers on its socket, and returns the node's exit status.
func forwardToNode(e *env, dataDir string) (int, bool) {
	if e.args == nil {
		return 0, false
	}
	c, err := node.Dial(dataDir)
	if err != nil {
		return 0, false // no node: open the store here
	}
	cwd, err := os.Getwd()
	if err != nil {
		c.Close()
		fmt.Fprintf(e.stderr, "kylix: %v\n", err)
		return exitFailure, true
	}
	ctx := e.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	code, err := c.Exec(ctx, node.ExecRequest{Args: e.args, Cwd: cwd, TTY: e.tty}, e.stdout, e.stderr)
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(e.stderr, "kylix: interrupted\n")
		return exitInterrupted, true
	case err != nil:
		fmt.Fprintf(e.stderr, "kylix: %v\n", err)
	}
	return code, true
}

// execInNode is the node's Config.Exec: it runs a forwarded command line
// as this process would, with the node in its env.
func execInNode(ctx context.Context, n *node.Node, req node.ExecRequest, stdout, stderr io.Writer) int {
	name := commandName(req.Args)
	if name == "serve" {
		fmt.Fprintf(stderr, "kylix: bad request: a node already serves %s\n", n.Store().Dir())
		return exitUsage
	}
	e := &env{
		stdin:  strings.NewReader(""),
		stdout: stdout,
		stderr: stderr,
		tty:    req.TTY,
		getenv: os.Getenv,
		node:   n,
	}
	code := run(ctx, e, req.Args)
	if changesNamespace[name] {
		n.Reconcile() // show the change in the mount
	}
	return code
}

// call sends a typed request to the node serving --data. node.ErrNoNode:
// none answers.
func (f *flags) call(ctx context.Context, op string, req, reply any, onEvent func(node.Event)) error {
	c, err := node.Dial(f.data)
	if err != nil {
		if err := f.checkDataDir(); err != nil {
			return err
		}
		return err
	}
	return c.Call(ctx, op, req, reply, onEvent)
}

// callProgress is call with a progress bar on stderr for the events.
func (f *flags) callProgress(ctx context.Context, op string, req, reply any) error {
	prog, finish := f.e.progressBar()
	defer finish()
	return f.call(ctx, op, req, reply, func(ev node.Event) {
		if ev.Label != "" {
			prog(ev.Label, ev.Done, ev.Total)
		}
	})
}

// progressBar is a node.Progress drawn as a progress bar on stderr (a
// terminal only), and the func that clears it at the end.
func (e *env) progressBar() (node.Progress, func()) {
	var p *progress
	return func(label string, done, total int64) {
			if p == nil {
				p = newProgress(e, label)
			}
			p.label = label
			p.update(done, total)
		}, func() {
			if p != nil {
				p.finish()
			}
		}
}

// noNode words ErrNoNode for a command that needs a node.
func noNode(err error, msg string) error {
	if errors.Is(err, node.ErrNoNode) {
		return errors.New(msg)
	}
	return err
}

// pinView is the pins for ls and stat: the node's when the command runs in
// one, else the data directory's record.
func (e *env) pinView(s *chunkstore.Store) *node.PinView {
	if e.node != nil {
		return e.node.PinView()
	}
	return node.RecordedPins(s.Dir())
}
