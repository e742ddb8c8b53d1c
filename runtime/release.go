package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"cellvisor/domain"
	"cellvisor/internal/atomicfile"
	"cellvisor/internal/buildid"
	"cellvisor/internal/safefile"
)

// ErrNoRelease is returned when a slot has no active release.
var ErrNoRelease = errors.New("no active release")

const (
	releasesDir = "releases"
	currentLink = "current"
	metaFile    = "release.json"
)

// ReleaseMeta describes a release; it is written last into the release.
type ReleaseMeta struct {
	// ID names the release directory: sequence and content (see releaseID).
	ID       string `json:"id"`
	Sequence int64  `json:"sequence"`
	Pool     string `json:"pool"`
	// Digest identifies what the release does: the SHA-256 of its files with
	// nginx.conf rendered without its sequence and directory, so equal
	// content compares equal across sequences.
	Digest string `json:"digest"`
	// Shape identifies what the release does but for its data (the pool
	// runtime): the digest of every other file. A running cell whose
	// configuration has the shape of a new release loads that release's
	// data without a reload.
	Shape string `json:"shape,omitempty"`
	// Files maps every file of the release to its SHA-256, to verify the
	// release on disk (VerifyRelease).
	Files map[string]string `json:"files"`
	// Listen is the address the release's public listeners bind, as its
	// nginx.conf says: AllAddresses for every address, "" where a release
	// (an older agent's) does not say, and its nginx.conf is read for it.
	Listen string `json:"listen,omitempty"`
}

// AllAddresses is ReleaseMeta.Listen for listeners bound to every address.
const AllAddresses = "*"

// Release is one complete runtime for a slot.
type Release struct {
	Meta  ReleaseMeta
	Files map[string][]byte // relative path -> content
	// pool is written as pools/<pool>.json by streaming (it can be tens of
	// megabytes); its hash is in Meta.Files like every other file's.
	pool     *PoolRuntime
	poolFile string
}

// releaseID names a release directory: the zero-padded sequence, so names
// sort, and the start of the content digest, so that two releases of one
// sequence (a configuration change, or an install a crash interrupted)
// never share a directory and the active one is never overwritten.
func releaseID(seq int64, digest string) string { return fmt.Sprintf("%012d-%s", seq, digest[:16]) }

// idSequence reads the sequence back from a release directory's name.
func idSequence(name string) (int64, bool) {
	prefix, _, ok := strings.Cut(name, "-")
	if !ok {
		return 0, false
	}
	seq, err := strconv.ParseInt(prefix, 10, 64)
	return seq, err == nil
}

// luaHashes are the embedded Lua modules' hashes, the same in every
// release: computed once, not for each slot's release.
var luaHashes = sync.OnceValue(func() map[string]string {
	return map[string]string{
		"lua/cellvisor.lua": hashOf(cellLua),
		"lua/frontdoor.lua": hashOf(frontDoorLua),
		"lua/cvfile.lua":    hashOf(fileLua),
		"lua/cvdns.lua":     hashOf(dnsLua),
		placeholderFile:     hashOf(placeholderPEM),
	}
})

// hashOf returns the hex SHA-256 of data.
func hashOf(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// MaxSequence is the largest release sequence a cell holds exactly (its Lua
// numbers are doubles): manifest.MaxSequence.
const MaxSequence = 1<<53 - 1

// BuildRelease assembles the files of a slot's release for sequence seq: its
// pool runtime JSON, the cell Lua and the rendered nginx.conf.
func BuildRelease(p RenderParams, pool *PoolRuntime) (Release, error) {
	r, hashes, p, sum, shape, err := identify(p, pool)
	if err != nil {
		return Release{}, err
	}
	id := releaseID(p.Sequence, sum)
	p.ReleaseDir = filepath.Join(p.Slot.RuntimeDir(), releasesDir, id)
	conf, err := RenderConf(p)
	if err != nil {
		return Release{}, err
	}
	r.Files["nginx.conf"] = conf
	hashes["nginx.conf"] = hashOf(conf)
	listen := p.Address
	if listen == "" {
		listen = AllAddresses
	}
	r.Meta = ReleaseMeta{ID: id, Sequence: p.Sequence, Pool: p.Pool, Digest: sum, Shape: shape, Files: hashes, Listen: listen}
	return r, nil
}

// ReleaseDigest is the Digest BuildRelease gives a release of p and pool,
// without rendering the release itself: enough to tell that the active
// release already does the same (Activate would keep it).
func ReleaseDigest(p RenderParams, pool *PoolRuntime) (string, error) {
	_, _, _, sum, _, err := identify(p, pool)
	return sum, err
}

// ReleaseInputs identifies everything a release of p and pool is made of,
// without rendering it: the render parameters as the digest renders them
// (without the sequence and directory, completed with the pool's cache
// TTLs), the hashes of the files beside nginx.conf (the Lua modules, the
// pool's runtime), and the agent's build, whose Go build ID covers the
// template, the Lua modules and the renderer. Equal inputs make releases
// of equal Digest; unequal ones may still (the digest tells). "" where the
// running binary has no build ID: nothing can be told without rendering.
func ReleaseInputs(p RenderParams, pool *PoolRuntime) (string, error) {
	build := buildID()
	if build == "" {
		return "", nil
	}
	_, hashes, p, err := prepare(p, pool)
	if err != nil {
		return "", err
	}
	params, err := json.Marshal(neutral(p))
	if err != nil {
		return "", fmt.Errorf("release inputs: %w", err)
	}
	ident := maps.Clone(hashes)
	ident["build"], ident["params"] = build, hashOf(params)
	return digest(ident), nil
}

// buildID is the running agent's build ID (a variable for tests).
var buildID = buildid.Self

// identify starts a release of p and pool: its files but nginx.conf, their
// hashes, p completed from the pool (whether it caches), the release's
// digest and its shape (the digest without the pool runtime).
func identify(p RenderParams, pool *PoolRuntime) (Release, map[string]string, RenderParams, string, string, error) {
	r, hashes, p, err := prepare(p, pool)
	if err != nil {
		return Release{}, nil, p, "", "", err
	}
	nconf, err := RenderConf(neutral(p))
	if err != nil {
		return Release{}, nil, p, "", "", err
	}
	ident := maps.Clone(hashes)
	ident["nginx.conf"] = hashOf(nconf)
	sum := digest(ident)
	delete(ident, r.poolFile)
	delete(ident, keysFile)
	return r, hashes, p, sum, digest(ident), nil
}

// neutral is p without where its release lives: the digest covers what
// the release does, nginx.conf rendered without its sequence and
// directory, so that equal content compares equal across sequences (and
// so do ReleaseInputs).
func neutral(p RenderParams) RenderParams {
	p.Sequence, p.ReleaseDir = 0, "/release"
	return p
}

// prepare starts a release of p and pool: its files but nginx.conf, their
// hashes, and p completed with the pool's cache TTLs.
func prepare(p RenderParams, pool *PoolRuntime) (Release, map[string]string, RenderParams, error) {
	if p.Sequence < 0 || p.Sequence > MaxSequence {
		return Release{}, nil, p, fmt.Errorf("build release: sequence %d is not 0–%d: the cells' Lua holds sequences as doubles", p.Sequence, int64(MaxSequence))
	}
	keys := pool.keysJSON()
	r := Release{Files: map[string][]byte{"lua/cellvisor.lua": cellLua, "lua/frontdoor.lua": frontDoorLua, "lua/cvfile.lua": fileLua, "lua/cvdns.lua": dnsLua,
		placeholderFile: placeholderPEM, keysFile: keys}}
	hashes := maps.Clone(luaHashes())
	hashes[keysFile] = hashOf(keys)
	if p.Pool != "" {
		if !domain.ValidPoolName(p.Pool) {
			// Joined into pools/<pool>.json and rendered into the cell's
			// configuration: held to the control plane's rule whoever
			// signed it.
			return Release{}, nil, p, fmt.Errorf("build release: pool %q is not a valid pool name (lowercase letters, digits, inner '-' and '.', at most %d)", p.Pool, domain.MaxPoolName)
		}
		if pool == nil {
			pool = &PoolRuntime{Pool: p.Pool, Hosts: map[string]*domain.Domain{}}
		}
		sum, size, err := pool.contentHash()
		if err != nil {
			return Release{}, nil, p, err
		}
		if size > p.MaxData() {
			// A cell would refuse to load it (and to start on it): refused
			// here, before anything is written, with the reason.
			return Release{}, nil, p, fmt.Errorf("build release for %s: the data of pool %s is %d bytes, more than a cell reads (%d): %w", p.Slot.Name, p.Pool, size, p.MaxData(), ErrTooBig)
		}
		r.pool, r.poolFile = pool, "pools/"+p.Pool+".json"
		hashes[r.poolFile] = sum
		p.Cache = pool.caches()
		p.ChecksTLS = pool.checksTLS()
		// Each CA bundle is a file of the release and a location of its
		// configuration: part of the shape (a new one reloads the cells).
		p.OriginCAs = nil
		for name, bundle := range pool.originCAs() {
			f := originCADir + "/" + name + ".pem"
			r.Files[f] = []byte(bundle)
			hashes[f] = hashOf([]byte(bundle))
			p.OriginCAs = append(p.OriginCAs, name)
		}
		sort.Strings(p.OriginCAs)
	}
	return r, hashes, p, nil
}

// digest hashes file names and their hashes in name order.
func digest(hashes map[string]string) string {
	names := make([]string, 0, len(hashes))
	for n := range hashes {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00%s\n", n, hashes[n])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Install writes a release into the slot's releases directory: every file is
// written and fsynced in a staging directory, release.json last, the staging
// directory is renamed into place and the parent fsynced. It does not switch.
func Install(s Slot, r Release) (string, error) {
	root := filepath.Join(s.RuntimeDir(), releasesDir)
	final := filepath.Join(root, r.Meta.ID)
	if cur, err := Current(s); err == nil && cur.ID == r.Meta.ID {
		return "", fmt.Errorf("install release %s for %s: it is the active release", r.Meta.ID, s.Name)
	}
	// A directory left by an install that crashed before its switch is not
	// active (the check above) and is replaced whole.
	if err := os.RemoveAll(final); err != nil {
		return "", fmt.Errorf("install release %d: remove stale: %w", r.Meta.Sequence, err)
	}
	stage, err := os.MkdirTemp(root, ".stage-")
	if err != nil {
		return "", fmt.Errorf("install release %d: %w", r.Meta.Sequence, err)
	}
	defer os.RemoveAll(stage) // no-op once renamed
	meta, err := json.Marshal(r.Meta)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(r.Files)+2)
	for n := range r.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	if r.pool != nil {
		names = append(names, r.poolFile)
	}
	dirs := map[string]bool{stage: true}
	for _, n := range append(names, metaFile) {
		path := filepath.Join(stage, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return "", err
		}
		dirs[filepath.Dir(path)] = true
		var err error
		switch {
		case n == metaFile:
			err = writeSynced(path, func(w io.Writer) error { _, err := w.Write(meta); return err }, "")
		case r.pool != nil && n == r.poolFile:
			err = writeSynced(path, r.pool.WriteJSON, r.Meta.Files[n])
		default:
			data := r.Files[n]
			err = writeSynced(path, func(w io.Writer) error { _, err := w.Write(data); return err }, r.Meta.Files[n])
		}
		if err != nil {
			return "", fmt.Errorf("install release %d: %s: %w", r.Meta.Sequence, n, err)
		}
	}
	for d := range dirs {
		if err := os.Chmod(d, 0o755); err != nil { // whatever the umask, as the files
			return "", err
		}
		if err := atomicfile.SyncDir(d); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(stage, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(stage, final); err != nil {
		return "", fmt.Errorf("install release %d: %w", r.Meta.Sequence, err)
	}
	return final, atomicfile.SyncDir(root)
}

// writeSynced creates path with what write produces, hashing it on the way
// and refusing it unless it hashes to want ("" skips the check), then fsyncs.
func writeSynced(path string, write func(io.Writer) error, want string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	h := sha256.New()
	if err := write(io.MultiWriter(f, h)); err != nil {
		f.Close()
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); want != "" && got != want {
		f.Close()
		return fmt.Errorf("%w: wrote content hashing to %s, expected %s", ErrCorrupt, got, want)
	}
	// 0644 whatever the agent's umask (the unit's 0027): a cell that runs
	// as its slot's own user reads it as "other" (its group is the agent's).
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Switch points the slot's current link at release id atomically: a new
// link is created beside it and renamed over it (rename(2) replaces the old
// link in one step), then the directory is fsynced.
func Switch(s Slot, id string) error {
	dir := s.RuntimeDir()
	target := filepath.Join(releasesDir, id)
	if _, err := os.Stat(filepath.Join(dir, target, metaFile)); err != nil {
		return fmt.Errorf("switch %s to release %s: %w", s.Name, id, err)
	}
	tmp := filepath.Join(dir, ".current.tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("switch %s to release %s: %w", s.Name, id, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, currentLink)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("switch %s to release %s: %w", s.Name, id, err)
	}
	return atomicfile.SyncDir(dir)
}

// currentID is the directory the current link names, "" without one.
func currentID(s Slot) string {
	target, err := os.Readlink(filepath.Join(s.RuntimeDir(), currentLink))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

// releaseDirs lists the slot's release directories, newest sequence first.
func releaseDirs(s Slot) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.RuntimeDir(), releasesDir))
	if err != nil {
		return nil, err
	}
	type rel struct {
		id  string
		seq int64
	}
	var rels []rel
	for _, e := range ents {
		if seq, ok := idSequence(e.Name()); ok && e.IsDir() {
			rels = append(rels, rel{e.Name(), seq})
		}
	}
	sort.Slice(rels, func(i, j int) bool {
		if rels[i].seq != rels[j].seq {
			return rels[i].seq > rels[j].seq
		}
		return rels[i].id > rels[j].id
	})
	out := make([]string, len(rels))
	for i, r := range rels {
		out[i] = r.id
	}
	return out, nil
}

// Current reads the active release's metadata.
func Current(s Slot) (ReleaseMeta, error) {
	if m, ok := currentMetas.get(s); ok {
		return m, nil
	}
	data, err := readMeta(filepath.Join(s.RuntimeDir(), currentLink, metaFile))
	if os.IsNotExist(err) {
		return ReleaseMeta{}, ErrNoRelease
	}
	if err != nil {
		return ReleaseMeta{}, err
	}
	var m ReleaseMeta
	if err := json.Unmarshal(data, &m); err != nil {
		return ReleaseMeta{}, fmt.Errorf("read release of %s: %w", s.Name, err)
	}
	currentMetas.put(s, m)
	return m, nil
}

// currentMetas holds, for each slot, the release.json of the release it
// had active when it was last read or verified. A release directory does
// not change once installed (its ID is its sequence and content), so while
// the slot's current link names that ID, Current answers from here after a
// readlink instead of reading and decoding release.json again: a start
// read it three times for every slot, at 20–40 µs each
// (docs/performance.md, round 12). One entry per slot: a new release
// replaces its slot's entry.
var currentMetas = metaCache{m: map[string]ReleaseMeta{}}

type metaCache struct {
	mu sync.Mutex
	m  map[string]ReleaseMeta // by the slot's runtime directory
}

// get is the slot's cached metadata if its current release is still the
// one cached; the caller gets its own copy of the file hashes.
func (c *metaCache) get(s Slot) (ReleaseMeta, bool) {
	c.mu.Lock()
	m, ok := c.m[s.RuntimeDir()]
	c.mu.Unlock()
	if !ok || currentID(s) != m.ID {
		return ReleaseMeta{}, false
	}
	m.Files = maps.Clone(m.Files)
	return m, true
}

// put caches m, read from or verified in the slot's release directory
// named m.ID.
func (c *metaCache) put(s Slot, m ReleaseMeta) {
	if m.ID == "" {
		return
	}
	m.Files = maps.Clone(m.Files)
	c.mu.Lock()
	c.m[s.RuntimeDir()] = m
	c.mu.Unlock()
}

// Prune removes every release but the current one and the newest other one
// (kept for rollback), and leftover staging directories.
func Prune(s Slot) error {
	root := filepath.Join(s.RuntimeDir(), releasesDir)
	cur := currentID(s)
	if cur == "" {
		return ErrNoRelease
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".stage-") {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
	ids, err := releaseDirs(s)
	if err != nil {
		return err
	}
	kept := 0
	for _, id := range ids {
		if id == cur {
			continue
		}
		if kept++; kept == 1 {
			continue // the rollback
		}
		if err := os.RemoveAll(filepath.Join(root, id)); err != nil {
			return err
		}
	}
	return nil
}

// Activate installs r and switches to it unless the active release already
// has the same content, in which case it returns the active metadata and false.
func Activate(s Slot, r Release) (ReleaseMeta, bool, error) {
	if cur, err := Current(s); err == nil && cur.Digest == r.Meta.Digest && cur.Pool == r.Meta.Pool {
		return cur, false, nil
	} else if err == nil && r.Meta.Sequence <= cur.Sequence {
		return ReleaseMeta{}, false, fmt.Errorf("activate release %d for %s: active sequence is %d; sequences never go backwards", r.Meta.Sequence, s.Name, cur.Sequence)
	}
	return installSwitch(s, r)
}

// Replace is Activate for a slot whose active release failed verification
// and had no intact older one to roll back to: r is installed and switched
// to even where it does what the damaged one should (the same digest).
func Replace(s Slot, r Release) (ReleaseMeta, bool, error) {
	if last, ok := CurrentSequence(s); ok && r.Meta.Sequence <= last {
		return ReleaseMeta{}, false, fmt.Errorf("replace release %d for %s: active sequence is %d; sequences never go backwards", r.Meta.Sequence, s.Name, last)
	}
	return installSwitch(s, r)
}

// CurrentSequence is the active release's sequence, read from the name of
// its directory (which a damaged release.json does not take with it); false
// without an active release.
func CurrentSequence(s Slot) (int64, bool) {
	id := currentID(s)
	if id == "" {
		return 0, false
	}
	return idSequence(id)
}

// installSwitch installs r, switches the slot to it and prunes the others.
func installSwitch(s Slot, r Release) (ReleaseMeta, bool, error) {
	if _, err := Install(s, r); err != nil {
		return ReleaseMeta{}, false, err
	}
	if err := Switch(s, r.Meta.ID); err != nil {
		return ReleaseMeta{}, false, err
	}
	if err := Prune(s); err != nil {
		return r.Meta, true, fmt.Errorf("prune releases of %s: %w", s.Name, err)
	}
	return r.Meta, true, nil
}

// Clear leaves the slot with an empty runtime, as an unassigned slot has:
// its current link goes first (so no half-removed release is ever active),
// then every release.
func Clear(s Slot) error {
	if err := Withdraw(s); err != nil {
		return fmt.Errorf("clear runtime of %s: %w", s.Name, err)
	}
	root := filepath.Join(s.RuntimeDir(), releasesDir)
	ents, err := os.ReadDir(root)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("clear runtime of %s: %w", s.Name, err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			return fmt.Errorf("clear runtime of %s: %w", s.Name, err)
		}
	}
	return nil
}

// Withdraw leaves the slot without an active release: its current link is
// removed (durably), its release directories stay. A slot whose active
// release is damaged beyond rollback is withdrawn so that no cell starts on
// it; installing the same release again replaces its directory whole.
func Withdraw(s Slot) error {
	if err := os.Remove(filepath.Join(s.RuntimeDir(), currentLink)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("withdraw the release of %s: %w", s.Name, err)
	}
	if err := atomicfile.SyncDir(s.RuntimeDir()); err != nil {
		return fmt.Errorf("withdraw the release of %s: %w", s.Name, err)
	}
	return nil
}

// ErrTooBig marks a release whose data is more than a cell reads.
var ErrTooBig = errors.New("release data too big for a cell")

// ErrCorrupt marks a release whose files do not match its release.json.
var ErrCorrupt = errors.New("release corrupt")

// VerifyRelease re-reads a release directory and checks every file against
// the hashes in its release.json: an offline start serves only a release
// that is whole.
func VerifyRelease(dir string) (ReleaseMeta, error) {
	d, err := safefile.OpenDir(dir)
	if err != nil {
		return ReleaseMeta{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, dir, err)
	}
	defer d.Close()
	data, err := d.ReadFile(context.Background(), metaFile, maxMeta)
	if err != nil {
		return ReleaseMeta{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, dir, err)
	}
	var m ReleaseMeta
	if err := json.Unmarshal(data, &m); err != nil || len(m.Files) == 0 {
		return ReleaseMeta{}, fmt.Errorf("%w: %s: unreadable release.json", ErrCorrupt, dir)
	}
	bp := hashBufs.Get().(*[]byte)
	defer hashBufs.Put(bp)
	buf := *bp
	for name, want := range m.Files {
		if strings.Contains(name, "..") || filepath.IsAbs(name) {
			return ReleaseMeta{}, fmt.Errorf("%w: %s: bad file name %q", ErrCorrupt, dir, name)
		}
		got, err := hashFile(d, filepath.FromSlash(name), buf)
		if err != nil {
			return ReleaseMeta{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, dir, err)
		}
		if got != want {
			return ReleaseMeta{}, fmt.Errorf("%w: %s: %s does not match its hash", ErrCorrupt, dir, name)
		}
	}
	return m, nil
}

// Bounds of what is read of a release on disk. Its files are the agent's
// own, but a start must not hang on one that a damaged or tampered host
// turned into a FIFO, a link or something huge: they are read with
// safefile's rules, and a release.json (a name and a hash per file) is
// small.
const (
	maxMeta        = 1 << 20
	maxReleaseFile = 1 << 30
)

// readMeta reads a release.json.
func readMeta(path string) ([]byte, error) {
	return safefile.ReadFile(context.Background(), path, maxMeta)
}

// hashBufs are the buffers releases' files stream through to be hashed:
// one for a release's files, where io.Copy would take a new one for each,
// and the same one for the next release verified (a start verifies every
// slot's, before any garbage is collected).
var hashBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// hashFile is the hex SHA-256 of the file name of a release's directory d,
// read as it streams through buf; a file that grows past its bound while
// it is read fails.
func hashFile(d *safefile.Dir, name string, buf []byte) (string, error) {
	h := sha256.New()
	if _, err := d.Copy(h, name, maxReleaseFile, buf); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// VerifyCurrent verifies the slot's active release; if it is damaged (a
// file does not match its hash, or release.json is gone) it switches to the
// newest other release that verifies, and says so. It returns the release
// now active.
func VerifyCurrent(s Slot) (meta ReleaseMeta, rolledBack bool, err error) {
	cur := currentID(s)
	if cur == "" {
		return ReleaseMeta{}, false, ErrNoRelease
	}
	m, cerr := VerifyRelease(filepath.Join(s.RuntimeDir(), releasesDir, cur))
	if cerr == nil && m.ID == cur {
		currentMetas.put(s, m)
	}
	if cerr == nil {
		return m, false, nil
	}
	ids, err := releaseDirs(s)
	if err != nil {
		return ReleaseMeta{}, false, err
	}
	for _, id := range ids {
		if id == cur {
			continue
		}
		m, err := VerifyRelease(filepath.Join(s.RuntimeDir(), releasesDir, id))
		if err != nil {
			continue
		}
		if err := Switch(s, id); err != nil {
			return ReleaseMeta{}, false, err
		}
		if m.ID == id {
			currentMetas.put(s, m)
		}
		return m, true, nil
	}
	return ReleaseMeta{}, false, fmt.Errorf("%s: no intact release (%v)", s.Name, cerr)
}
