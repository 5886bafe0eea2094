// Package unixsock makes and serves the node's Unix-domain sockets (the
// admin socket in the data directory, the client socket): a socket that no
// one can reach before it has its mode, a stale one left by a killed
// process replaced but a live one refused, paths longer than a sockaddr_un
// holds reached through /proc/self/fd, and an accept loop that outlives
// running out of descriptors instead of ending the service.
package unixsock

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrInUse: a live process listens on the socket's path.
var ErrInUse = errors.New("another process listens on it")

// maxPath is the longest path bound or dialled as it is: a sockaddr_un
// holds 108 bytes with the NUL, and a few are kept spare.
const maxPath = 100

// ShortPath returns a path for dir/name that fits in a sockaddr_un however
// long dir is: dir/name itself when it is short, else
// /proc/self/fd/N/name through an open descriptor N of dir, which release
// closes (call it once the socket is bound or dialled).
func ShortPath(dir, name string) (path string, release func(), err error) {
	p := filepath.Join(dir, name)
	if len(p) < maxPath {
		return p, func() {}, nil
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("socket %s: %w", p, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, name), func() { unix.Close(fd) }, nil
}

// Dial connects to the socket at path (network "unix", "unixpacket" or
// "unixgram"), however long path is.
func Dial(network, path string) (*net.UnixConn, error) {
	short, release, err := ShortPath(filepath.Dir(path), filepath.Base(path))
	if err != nil {
		return nil, err
	}
	defer release()
	return net.DialUnix(network, nil, &net.UnixAddr{Name: short, Net: network})
}

// Listener is a listening socket made by Listen. Close also removes its
// path.
type Listener struct {
	*net.UnixListener
	path string
	// made is the socket file made, so Close removes only that one; held
	// open (O_PATH) so that its inode number is not given to another file
	// meanwhile.
	made   unix.Stat_t
	madeFd int
	once   sync.Once
	err    error
}

// Path is the socket's path, as given to Listen.
func (l *Listener) Path() string { return l.path }

// Close stops listening and removes the socket file, unless another one
// has replaced it since (a process that took over the path).
func (l *Listener) Close() error {
	l.once.Do(func() {
		l.err = l.UnixListener.Close()
		var st unix.Stat_t
		if unix.Lstat(l.path, &st) == nil && st.Dev == l.made.Dev && st.Ino == l.made.Ino {
			os.Remove(l.path)
		}
		unix.Close(l.madeFd)
	})
	return l.err
}

// Listen makes a socket of network ("unix", "unixpacket") at path with
// permissions mode, and listens on it. The socket is bound in a fresh
// directory of mode 0700 beside path, given its mode there and renamed
// into place, so no one can connect before it has its mode, and the
// process umask is left alone (it is shared with every goroutine). A
// socket already at path is replaced when no one answers on it (left by a
// killed process), and refused with ErrInUse when someone does; anything
// else at path is refused. Paths of any length work (ShortPath).
func Listen(network, path string, mode os.FileMode) (*Listener, error) {
	dir, name := filepath.Dir(path), filepath.Base(path)
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket %s: the path exists and is not a socket", path)
		}
		if c, err := Dial(network, path); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s: %w", path, ErrInUse)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("socket %s: removing a stale socket: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	tmp, err := os.MkdirTemp(dir, "."+name+".")
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	defer os.RemoveAll(tmp)
	short, release, err := ShortPath(tmp, name)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix(network, &net.UnixAddr{Name: short, Net: network})
	release()
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false) // its bound name is the temporary one
	bound := filepath.Join(tmp, name)
	l := &Listener{UnixListener: ln, path: path, madeFd: -1}
	err = os.Chmod(bound, mode)
	if err == nil {
		l.madeFd, err = unix.Open(bound, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err == nil {
		err = unix.Fstat(l.madeFd, &l.made)
	}
	if err == nil {
		err = os.Rename(bound, path)
	}
	if err != nil {
		if l.madeFd >= 0 {
			unix.Close(l.madeFd)
		}
		ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return l, nil
}

// Acceptor is what Serve accepts connections from (*net.UnixListener,
// *Listener).
type Acceptor interface {
	AcceptUnix() (*net.UnixConn, error)
}

// The back-off after a temporary accept error, as net/http's Server.Serve:
// 5 ms, doubling, at most a second; reset by the next connection.
const (
	firstDelay = 5 * time.Millisecond
	maxDelay   = time.Second
)

// Serve accepts connections on ln and passes each to handle, in Serve's
// goroutine: handle must not block (it starts the conversation's
// goroutine). An accept that fails for want of descriptors or memory
// (EMFILE, ENFILE, ENOBUFS, ENOMEM) or an aborted connection is retried
// after a back-off, logged at Warn on log (nil: not logged): a node that
// ran out of descriptors serves again once some are freed. Serve returns
// nil when ln is closed, or the first other error.
func Serve(ln Acceptor, handle func(*net.UnixConn), log *slog.Logger) error {
	return serve(ln.AcceptUnix, handle, log, time.Sleep)
}

// ServeListener is Serve for any net.Listener (the data plane's TCP
// listener): the same back-off on the same errors.
func ServeListener(ln net.Listener, handle func(net.Conn), log *slog.Logger) error {
	return serve(ln.Accept, handle, log, time.Sleep)
}

func serve[C any](accept func() (C, error), handle func(C), log *slog.Logger, sleep func(time.Duration)) error {
	var delay time.Duration
	for {
		conn, err := accept()
		if err == nil {
			delay = 0
			handle(conn)
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if !Temporary(err) {
			return err
		}
		delay = min(max(2*delay, firstDelay), maxDelay)
		if log != nil {
			log.Warn("accepting a connection failed; trying again", "err", err, "retry_in", delay)
		}
		sleep(delay)
	}
}

// Temporary says whether an accept error passes by itself: the process or
// the system is out of descriptors or buffers, or the peer went away.
func Temporary(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.EINTR, syscall.EAGAIN, syscall.EPROTO} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
