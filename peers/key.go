package peers

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"fmt"
	"math/big"
	"os"
	"strings"
	"time"
)

// KeySize is the length of a cluster key in bytes.
const KeySize = 32

// Key is the secret every member of a cluster holds. The gossip key and the
// data plane's certificate authority are derived from it (HKDF-SHA256 with
// distinct labels), so the key itself is never sent anywhere.
type Key [KeySize]byte

// NewKey returns a fresh random cluster key.
func NewKey() (Key, error) {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return k, fmt.Errorf("cluster key: %w", err)
	}
	return k, nil
}

// String encodes the key as base64 (what `kylix cluster-key` prints and a
// key file holds).
func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// ParseKey decodes a key written by String (surrounding space ignored).
func ParseKey(s string) (Key, error) {
	var k Key
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return k, fmt.Errorf("cluster key: not base64: %w (make one with kylix cluster-key)", err)
	}
	if len(b) != KeySize {
		return k, fmt.Errorf("cluster key: %d bytes, want %d (make one with kylix cluster-key)", len(b), KeySize)
	}
	copy(k[:], b)
	return k, nil
}

// LoadKey reads a key file. The file must not be readable by other users:
// whoever has the key is a member.
func LoadKey(path string) (Key, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Key{}, fmt.Errorf("cluster key file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return Key{}, fmt.Errorf("cluster key file %s is readable by other users (mode %04o): chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Key{}, fmt.Errorf("cluster key file: %w", err)
	}
	k, err := ParseKey(string(b))
	if err != nil {
		return k, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// derive returns n bytes derived from the key for one purpose.
func (k Key) derive(label string, n int) []byte {
	b, err := hkdf.Key(sha256.New, k[:], nil, "kylix peers v1 "+label, n)
	if err != nil {
		panic(err) // only for n out of range: a programming error
	}
	return b
}

// gossipKey is serf's keyring key (AES-256-GCM in memberlist).
func (k Key) gossipKey() []byte { return k.derive("gossip", 32) }

// caKey is the data plane's certificate authority key. Every member derives
// the same one, so every member can sign its own certificate and check a
// peer's; a process without the cluster key can do neither.
func (k Key) caKey() ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(k.derive("tls ca", ed25519.SeedSize))
}

// peerName is the name in every member's certificate (the TLS server name).
const peerName = "kylix-peer"

// caCert returns the authority's certificate: the same subject and key on
// every member (the serial and times are fixed too, so it is identical).
func (k Key) caCert() (*x509.Certificate, error) {
	priv := k.caKey()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kylix cluster CA"},
		NotBefore:             time.Unix(0, 0),
		NotAfter:              time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, priv.Public(), priv)
	if err != nil {
		return nil, fmt.Errorf("cluster CA certificate: %w", err)
	}
	return x509.ParseCertificate(der)
}
