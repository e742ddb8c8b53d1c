package runtime

import (
	"bufio"
	"bytes"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"

	"cellvisor/domain"
	"cellvisor/internal/sysfile"
)

// LoadDomainsDir reads every *.json domain file in dir, refusing the whole
// directory if any file is invalid or two domains claim the same hostname.
func LoadDomainsDir(dir string) ([]domain.Domain, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []domain.Domain
	for _, f := range files {
		data, err := sysfile.ReadFile(f, maxDomainFile)
		if err != nil {
			return nil, err
		}
		d, err := domain.Decode(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Base(f), err)
		}
		out = append(out, d)
	}
	if _, err := CompilePools(out); err != nil {
		return nil, err
	}
	return out, nil
}

// PoolRuntime is the per-pool runtime JSON the cells' Lua reads: hostnames
// mapped to their domain's configuration.
type PoolRuntime struct {
	Pool  string                    `json:"pool"`
	Hosts map[string]*domain.Domain `json:"hosts"`
	// Docs, when set, gives each domain's canonical document for WriteJSON
	// (the activation keeps them on disk rather than in memory); nil uses
	// the domain's own Canonical encoding.
	Docs func(*domain.Domain) ([]byte, error) `json:"-"`
	// Keys are the opened private keys (PEM) of the pool's domains that
	// carry a certificate chain, by domain: the activation opens each
	// entry's sealed key. A domain with a chain and no key here is served
	// on the HTTP port only.
	Keys map[string][]byte `json:"-"`

	hashOnce sync.Once // the JSON's SHA-256 and size, computed once for every slot of the pool
	hash     string
	size     int64
	hashErr  error
}

// contentHash is the hex SHA-256 and the size of WriteJSON's output. A
// pool is not changed after it is compiled, and its slots share it.
func (p *PoolRuntime) contentHash() (string, int64, error) {
	p.hashOnce.Do(func() {
		h := sha256.New()
		cw := &countingWriter{w: h}
		p.hashErr = p.WriteJSON(cw)
		p.hash, p.size = hex.EncodeToString(h.Sum(nil)), cw.n
	})
	return p.hash, p.size, p.hashErr
}

// countingWriter counts what passes through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// WriteJSON writes the pool runtime JSON to w, hosts in name order,
// splicing in each domain's original document where there is one. With
// thousands of domains, encoding them again, or even holding the result in
// one buffer, cost more than verifying their signatures, so it streams.
func (p *PoolRuntime) WriteJSON(w io.Writer) error {
	hosts := make([]string, 0, len(p.Hosts))
	for h := range p.Hosts {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(`{"pool":`)
	bw.WriteString(strconv.Quote(p.Pool))
	// One host a line, "host":["digest",{document}]: a cell keeps what it
	// decoded of a host whose digest it already has, and decodes only the
	// lines that changed. The digest (xxhash64 of the document) only tells
	// a cell's releases apart: a tenant who forged a collision would only
	// keep its own domain's previous document.
	bw.WriteString(`,"hosts":{`)
	for i, h := range hosts {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.WriteByte('\n')
		bw.WriteString(strconv.Quote(h))
		d := p.Hosts[h]
		doc := d.Canonical()
		var err error
		switch {
		case p.Docs != nil:
			doc, err = p.Docs(d)
		case doc == nil:
			doc, err = json.Marshal(d)
		}
		if err != nil {
			return fmt.Errorf("pool %s: document of %s: %w", p.Pool, d.Domain, err)
		}
		doc = bytes.TrimSpace(doc)
		fmt.Fprintf(bw, `:["%016x",`, xxhash.Sum64(doc))
		bw.Write(doc)
		bw.WriteByte(']')
	}
	bw.WriteString("\n}}")
	return bw.Flush()
}

// MarshalJSON implements json.Marshaler through WriteJSON.
func (p *PoolRuntime) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	err := p.WriteJSON(&b)
	return b.Bytes(), err
}

// CompilePools groups domains by pool and indexes them by hostname, refusing
// a hostname claimed by two domains.
func CompilePools(domains []domain.Domain) (map[string]*PoolRuntime, error) {
	pools := map[string]*PoolRuntime{}
	owner := map[string]string{}
	for i := range domains {
		d := &domains[i]
		p := pools[d.Pool]
		if p == nil {
			p = &PoolRuntime{Pool: d.Pool, Hosts: map[string]*domain.Domain{}}
			pools[d.Pool] = p
		}
		for _, h := range d.Hostnames {
			if other, ok := owner[h]; ok {
				return nil, fmt.Errorf("%w: hostname %s is claimed by %s and %s", domain.ErrInvalid, h, other, d.Domain)
			}
			owner[h] = d.Domain
			p.Hosts[h] = d
		}
	}
	return pools, nil
}

// caches reports whether one of the pool's domains has a cache TTL.
// checksTLS reports whether a domain of the pool has an active health
// check of https servers: only then does the cell load its CA bundle for
// its Lua (lua_ssl_trusted_certificate costs each location a parse of the
// bundle, about 0.25 s of CPU at every start and reload).
func (p *PoolRuntime) checksTLS() bool {
	for _, d := range p.Hosts {
		for _, o := range d.Origins {
			if o.ChecksTLS() {
				return true
			}
		}
	}
	return false
}

// originCAs are the CA bundles of the pool's verified https origins
// (domain.Origin.CA), by name: the MD5 of the bundle as the document has
// it, which the cell's Lua computes the same way (ngx.md5) to find the
// bundle's location. A name, not a check: MD5 serves here as a digest of
// data the signed document already carries.
func (p *PoolRuntime) originCAs() map[string]string {
	var out map[string]string
	for _, d := range p.Hosts {
		for _, o := range d.Origins {
			if o.CA == "" || !o.Verified() {
				continue
			}
			if out == nil {
				out = map[string]string{}
			}
			out[OriginCAName(o.CA)] = o.CA
		}
	}
	return out
}

// OriginCAName is the name of an origin's CA bundle in a release
// (origin-ca/NAME.pem) and of its location in nginx.conf.
func OriginCAName(bundle string) string {
	sum := md5.Sum([]byte(bundle))
	return hex.EncodeToString(sum[:])
}

func (p *PoolRuntime) caches() bool {
	for _, d := range p.Hosts {
		if d.Cache != nil && d.Cache.TTLSeconds > 0 {
			return true
		}
	}
	return false
}

// CompileSlots gives every assigned slot its own pool runtime. A domain
// restricted by cells (keyed by domain name) is served by exactly those
// cells, whatever their pool: a move serves one domain from cells of two
// pools. Every other domain is served by every cell of its pool. Unassigned
// cells named in cells get nothing; the caller refuses them. A slot keeps
// its own pool (and so its pool's limits) whatever it serves. Slots whose
// selection is the same share one runtime, and so its content hash; a pool
// without restricted domains is shared whole.
func CompileSlots(pools map[string]*PoolRuntime, assign Assignments, cells map[string][]string) map[string]*PoolRuntime {
	var docs func(*domain.Domain) ([]byte, error)
	restricted := map[string]*domain.Domain{} // by name
	// Every pool's opened keys, for the runtimes made here: a release's
	// keys file holds only those of the domains its runtime serves.
	keys := map[string][]byte{}
	for _, p := range pools {
		if docs == nil {
			docs = p.Docs
		}
		maps.Copy(keys, p.Keys)
		for _, d := range p.Hosts {
			if _, ok := cells[d.Domain]; ok {
				restricted[d.Domain] = d
			}
		}
	}
	// foreign are the restricted domains each slot serves outside its pool.
	foreign := map[string][]string{}
	for name, cs := range cells {
		d := restricted[name]
		if d == nil {
			continue
		}
		for _, c := range cs {
			if pool, ok := assign[c]; ok && pool != d.Pool {
				foreign[c] = append(foreign[c], name)
			}
		}
	}
	out := map[string]*PoolRuntime{}
	byKey := map[string]*PoolRuntime{}
	for slot, pool := range assign {
		p := pools[pool]
		if p == nil {
			p = &PoolRuntime{Pool: pool, Hosts: map[string]*domain.Domain{}, Docs: docs, Keys: keys}
			pools[pool] = p
		}
		var dropped []string
		for _, d := range p.Hosts {
			if c, ok := cells[d.Domain]; ok && !slices.Contains(c, slot) {
				dropped = append(dropped, d.Domain)
			}
		}
		added := foreign[slot]
		if len(dropped) == 0 && len(added) == 0 {
			out[slot] = p
			continue
		}
		sort.Strings(dropped)
		dropped = slices.Compact(dropped)
		sort.Strings(added)
		added = slices.Compact(added)
		key := pool + "\x00-" + strings.Join(dropped, "\x00") + "\x00+" + strings.Join(added, "\x00")
		if q := byKey[key]; q != nil {
			out[slot] = q
			continue
		}
		q := &PoolRuntime{Pool: pool, Hosts: map[string]*domain.Domain{}, Docs: p.Docs, Keys: keys}
		if q.Docs == nil {
			q.Docs = docs
		}
		for h, d := range p.Hosts {
			if _, drop := slices.BinarySearch(dropped, d.Domain); !drop {
				q.Hosts[h] = d
			}
		}
		for _, name := range added {
			d := restricted[name]
			for _, h := range d.Hostnames {
				q.Hosts[h] = d
			}
		}
		byKey[key], out[slot] = q, q
	}
	return out
}
