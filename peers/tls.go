package peers

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"sync"
	"time"
)

// tlsConfigs returns the data plane's server and client configurations:
// TLS 1.3 only, both sides present a certificate signed by the cluster's
// authority (derived from the key) and require the other's. The node's own
// key pair is fresh at every start; only its signature comes from the key.
func tlsConfigs(k Key) (server, client *tls.Config, err error) {
	ca, err := k.caCert()
	if err != nil {
		return nil, nil, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("data plane key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, fmt.Errorf("data plane certificate: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: peerName},
		DNSNames:     []string{peerName},
		NotBefore:    now.Add(-24 * time.Hour), // members' clocks differ
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, k.caKey())
	if err != nil {
		return nil, nil, fmt.Errorf("data plane certificate: %w", err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	server = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	client = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   peerName,
	}
	return server, client, nil
}

// Plaintext data plane (Config.Plaintext, `kylix serve --data-plane
// plaintext`): for trusted networks where TLS's encryption costs more than
// it buys. Peers are still authenticated, by a challenge-response when a
// connection opens: each side proves it holds the cluster key with
// HMAC-SHA256, under a key derived from it (label "plaintext auth"), over
// both sides' fresh random nonces, with a distinct label per direction so
// that one side's proof cannot be replayed as the other's. Nothing after
// the handshake is encrypted or authenticated: chunks are checked against
// their BLAKE3 ids by the receiver, as with TLS, but an attacker on the
// path could read them, and could break a connection or swap answers
// (which then fail their hash).
//
//	client -> server  "KXA1" nonceC(32)
//	server -> client  nonceS(32) HMAC(k, "server" nonceC nonceS)
//	client -> server  HMAC(k, "client" nonceC nonceS)
const (
	plainMagic  = "KXA1"
	plainNonce  = 32
	plainMACLen = sha256.Size
)

// plainProof is one side's proof of the key over both nonces.
func plainProof(k []byte, side string, nc, ns []byte) []byte {
	m := hmac.New(sha256.New, k)
	m.Write([]byte(side))
	m.Write(nc)
	m.Write(ns)
	return m.Sum(nil)
}

// errPlainRefused: the other side did not prove it holds the cluster key.
var errPlainRefused = errors.New("the peer did not prove it holds the cluster key (every member must use the same cluster key and the same --data-plane)")

// plainClient runs the client's half of the handshake on c.
func plainClient(c net.Conn, k []byte, deadline time.Time) error {
	c.SetDeadline(deadline)
	defer c.SetDeadline(time.Time{})
	hello := make([]byte, len(plainMagic)+plainNonce)
	copy(hello, plainMagic)
	nc := hello[len(plainMagic):]
	rand.Read(nc)
	if _, err := c.Write(hello); err != nil {
		return err
	}
	ans := make([]byte, plainNonce+plainMACLen)
	if _, err := io.ReadFull(c, ans); err != nil {
		return fmt.Errorf("%w: %w", errPlainRefused, err)
	}
	ns := ans[:plainNonce]
	if !hmac.Equal(ans[plainNonce:], plainProof(k, "server", nc, ns)) {
		return errPlainRefused
	}
	_, err := c.Write(plainProof(k, "client", nc, ns))
	return err
}

// plainServer runs the server's half of the handshake on c, under the
// deadline the server set (server.serveConn: DefaultHandshakeTimeout).
func plainServer(c net.Conn, k []byte) error {
	hello := make([]byte, len(plainMagic)+plainNonce)
	if _, err := io.ReadFull(c, hello); err != nil {
		return err
	}
	if string(hello[:len(plainMagic)]) != plainMagic {
		return errors.New("not a plaintext kylix peer (does it use --data-plane tls?)")
	}
	nc := hello[len(plainMagic):]
	ans := make([]byte, plainNonce+plainMACLen)
	ns := ans[:plainNonce]
	rand.Read(ns)
	copy(ans[plainNonce:], plainProof(k, "server", nc, ns))
	if _, err := c.Write(ans); err != nil {
		return err
	}
	proof := make([]byte, plainMACLen)
	if _, err := io.ReadFull(c, proof); err != nil {
		return fmt.Errorf("%w: %w", errPlainRefused, err)
	}
	if !hmac.Equal(proof, plainProof(k, "client", nc, ns)) {
		return errPlainRefused
	}
	return nil
}

// plainConn is a server side connection of the plaintext data plane: the
// handshake runs at the first Read or Write (in the connection's own
// goroutine, as crypto/tls does), and its failure is every call's error.
type plainConn struct {
	net.Conn
	key  []byte
	once sync.Once
	err  error
}

func (c *plainConn) handshake() error {
	c.once.Do(func() { c.err = plainServer(c.Conn, c.key) })
	return c.err
}

func (c *plainConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *plainConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

type plainListener struct {
	net.Listener
	key []byte
}

func (l plainListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &plainConn{Conn: c, key: l.key}, nil
}

// security is the data plane's protection: TLS (plain nil) or the
// plaintext handshake with the key plain.
type security struct {
	server, client *tls.Config
	plain          []byte
}

func newSecurity(k Key, plaintext bool) (security, error) {
	if plaintext {
		return security{plain: k.derive("plaintext auth", 32)}, nil
	}
	st, ct, err := tlsConfigs(k)
	return security{server: st, client: ct}, err
}

func (s security) listener(ln net.Listener) net.Listener {
	if s.plain != nil {
		return plainListener{ln, s.plain}
	}
	return tls.NewListener(ln, s.server)
}

func (s security) dial(ctx context.Context, addr string) (net.Conn, error) {
	if s.plain == nil {
		d := tls.Dialer{Config: s.client}
		return d.DialContext(ctx, "tcp", addr)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	if err := plainClient(c, s.plain, deadline); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
