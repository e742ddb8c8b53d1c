package runtime

import (
	"bytes"
	"crypto/x509"
	_ "embed"
	"encoding/json"
	"encoding/pem"
	"sort"
	"strconv"
	"sync"
)

// The release's TLS files: the private keys of the slot's certificates,
// and the placeholder certificate nginx needs to start an ssl listener.
const (
	keysFile        = "tls/keys.json"
	originCADir     = "origin-ca"
	placeholderFile = "tls/placeholder.pem"
)

// placeholderPEM is a self-signed certificate and its key for
// no-certificate.cellvisor.invalid, the same in every release: nginx
// refuses an ssl listener without a certificate, and a cell never presents
// this one (its certificate callback sets the certificate of the domain the
// client names, or refuses the handshake; an error in it fails the
// handshake). The key is public by construction and protects nothing.
//
//go:embed tls/placeholder.pem
var placeholderPEM []byte

// keysJSON is the keys file of the pool's domains that carry a certificate
// chain and whose key the activation opened: one domain a line,
// "domain":["fingerprint","PEM key",not_after], in domain order (not_after
// in Unix seconds: what the cell's status says of the certificate). A cell pairs each
// with the chain of the domain's document of that fingerprint. It is data
// (not part of the release's shape): a new certificate is loaded without a
// reload.
func (p *PoolRuntime) keysJSON() []byte {
	type entry struct {
		fp, key string
		chain   string
	}
	keys := map[string]entry{}
	if p != nil {
		for _, d := range p.Hosts {
			// The activation keeps only the fingerprint in memory (the
			// document, chain included, is on disk: Docs).
			if d.TLS == nil || d.TLS.Fingerprint == "" {
				continue
			}
			if k := p.Keys[d.Domain]; len(k) > 0 {
				keys[d.Domain] = entry{d.TLS.Fingerprint, string(k), d.TLS.Chain}
			}
		}
	}
	names := make([]string, 0, len(keys))
	for n := range keys {
		names = append(names, n)
	}
	sort.Strings(names)
	var b bytes.Buffer
	b.WriteString(`{"keys":{`)
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
		e := keys[n]
		fp, _ := json.Marshal(e.fp) // strings: cannot fail
		key, _ := json.Marshal(e.key)
		name, _ := json.Marshal(n)
		b.Write(name)
		b.WriteString(":[")
		b.Write(fp)
		b.WriteByte(',')
		b.Write(key)
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(notAfter(e.fp, e.chain), 10))
		b.WriteByte(']')
	}
	b.WriteString("\n}}\n")
	return b.Bytes()
}

// notAfters caches each leaf's expiry by fingerprint: a release build reads
// every certificate of the slot, and most are the same as the last build's.
var notAfters sync.Map

// NoteCertificate records the expiry of a chain's leaf by its fingerprint,
// for a release built from a domain kept without its chain (the
// activation's, whose documents are on disk).
func NoteCertificate(fp, chain string) { notAfter(fp, chain) }

// notAfter is the expiry of chain's leaf, in Unix seconds (0 where it does
// not parse, or chain is "" and was not noted: the document's decoding
// checked that it parses).
func notAfter(fp, chain string) int64 {
	if v, ok := notAfters.Load(fp); ok {
		return v.(int64)
	}
	var t int64
	if chain == "" {
		return 0
	}
	if b, _ := pem.Decode([]byte(chain)); b != nil {
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			t = c.NotAfter.Unix()
		}
	}
	notAfters.Store(fp, t)
	return t
}
