package manifest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"strings"
	"testing"
)

const edge = "5f0c2a8e-7b3d-4e21-9a6f-1c2d3e4f5a6b"

func key(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	seed := sha256.Sum256([]byte(t.Name()))
	priv := ed25519.NewKeyFromSeed(seed[:])
	return priv.Public().(ed25519.PublicKey), priv
}

func artifact(domain string) []byte {
	return []byte(fmt.Sprintf(`{"domain":%q,"pool":"shared-default","revision":1,"hostnames":[%q],"routes":[{"prefix":"/","respond":{"status":200,"body":"hi"}}]}`, domain, domain))
}

func TestVerify(t *testing.T) {
	pub, priv := key(t)
	_, otherPriv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	art := artifact("a.example.com")
	good := NewEntry(priv, edge, "a.example.com", "shared-default", 1, art)
	if err := good.Verify(pub, edge, art); err != nil {
		t.Fatalf("good entry: %v", err)
	}
	tampered := bytes.Clone(art)
	tampered[10] ^= 1
	noSig := good
	noSig.Signature = ""
	badSig := good
	badSig.Signature = NewEntry(priv, edge, "b.example.com", "shared-default", 1, art).Signature
	otherKey := NewEntry(otherPriv, edge, "a.example.com", "shared-default", 1, art)
	bumped := good
	bumped.Revision = 2 // a field the signature covers
	tests := []struct {
		name  string
		e     Entry
		edge  string
		bytes []byte
		want  error
	}{
		{"tampered bytes", good, edge, tampered, ErrDigest},
		{"wrong size", good, edge, append(bytes.Clone(art), ' '), ErrSize},
		{"missing signature", noSig, edge, art, ErrSignature},
		{"signature of another entry", badSig, edge, art, ErrSignature},
		{"signed by another key", otherKey, edge, art, ErrSignature},
		{"entry signed for another edge", good, "another-edge", art, ErrSignature},
		{"field changed after signing", bumped, edge, art, ErrSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.e.Verify(pub, tc.edge, tc.bytes); !errors.Is(err, tc.want) {
				t.Errorf("err %v, want %v", err, tc.want)
			}
		})
	}
}

func manifestOf(t testing.TB, priv ed25519.PrivateKey, seq int64, n int) Manifest {
	m := Manifest{EdgeID: edge, Sequence: seq}
	for i := 0; i < n; i++ {
		d := fmt.Sprintf("d%d.example.com", i)
		m.Entries = append(m.Entries, NewEntry(priv, edge, d, "shared-default", 1, artifact(d)))
	}
	return Sign(priv, m, nil)
}

func encode(t testing.TB, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodePageRefusals(t *testing.T) {
	_, priv := key(t)
	good := Paginate(manifestOf(t, priv, 7, 3), 500)[0]
	if _, err := DecodePage(encode(t, good)); err != nil {
		t.Fatalf("good page: %v", err)
	}
	big := Paginate(manifestOf(t, priv, 7, 501), 501)[0]
	dup := good
	dup.Entries = append(append([]Entry{}, good.Entries...), good.Entries[0])
	unknownPool := good
	unknownPool.Entries = append([]Entry{}, good.Entries...)
	unknownPool.Entries[1].Pool = "premium"
	badHost := good
	badHost.Entries = append([]Entry{}, good.Entries...)
	badHost.Entries[2].Domain = "Bad_Host"
	tests := []struct {
		name string
		data []byte
		want error
	}{
		{"501 entries", encode(t, big), ErrTooMany},
		{"duplicate domain", encode(t, dup), ErrDuplicate},
		{"unknown pool", encode(t, unknownPool), ErrInvalid},
		{"invalid hostname", encode(t, badHost), ErrInvalid},
		{"truncated JSON", encode(t, good)[:40], ErrInvalid},
		{"malformed JSON", []byte(`{"edge_id": 5}`), ErrInvalid},
		{"unknown field", []byte(`{"edge_id":"e","sequence":1,"entries":[],"extra":1}`), ErrInvalid},
		{"zero sequence", []byte(`{"edge_id":"e","sequence":0,"entries":[]}`), ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodePage(tc.data); !errors.Is(err, tc.want) {
				t.Errorf("err %v, want %v", err, tc.want)
			}
		})
	}
}

// pager serves pages like the control API would.
func pager(pages []Page) Fetch {
	return func(_ context.Context, _ int64, cursor string) (Page, error) {
		for i, p := range pages {
			if (i == 0 && cursor == "") || (i > 0 && pages[i-1].Next == cursor) {
				return p, nil
			}
		}
		return Page{}, fmt.Errorf("no page at cursor %q", cursor)
	}
}

func TestCollect(t *testing.T) {
	_, priv := key(t)
	m := manifestOf(t, priv, 9, 1234)
	pages := Paginate(m, MaxEntries)
	if len(pages) != 3 {
		t.Fatalf("%d pages", len(pages))
	}
	got, err := Collect(context.Background(), pager(pages), edge, 8)
	if err != nil {
		t.Fatal(err)
	}
	if got.Sequence != 9 || len(got.Entries) != 1234 || got.Entries[1233].Domain != m.Entries[1233].Domain {
		t.Fatalf("collected sequence %d with %d entries", got.Sequence, len(got.Entries))
	}
	if _, err := Collect(context.Background(), pager(pages), edge, 9); !errors.Is(err, ErrStale) {
		t.Errorf("same sequence as active: %v, want ErrStale", err)
	}
	if _, err := Collect(context.Background(), pager(pages), edge, 12); !errors.Is(err, ErrStale) {
		t.Errorf("sequence going backwards: %v, want ErrStale", err)
	}
	if _, err := Collect(context.Background(), pager(pages), "other-edge", 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("pages for another edge: %v", err)
	}
	split := Paginate(m, MaxEntries)
	split[1].Sequence = 10
	if _, err := Collect(context.Background(), pager(split), edge, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("pages disagreeing on the sequence: %v", err)
	}
	dup := Paginate(m, MaxEntries)
	dup[2].Entries = append([]Entry{dup[0].Entries[0]}, dup[2].Entries[1:]...)
	if _, err := Collect(context.Background(), pager(dup), edge, 0); !errors.Is(err, ErrDuplicate) {
		t.Errorf("duplicate across pages: %v", err)
	}
	loop := Paginate(m, MaxEntries)
	loop[2].Next = loop[0].Next
	if _, err := Collect(context.Background(), pager(loop), edge, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("cursor loop: %v", err)
	}
}

func snapshotBytes(t testing.TB, s Snapshot) []byte {
	var b bytes.Buffer
	if err := WriteSnapshot(&b, s); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func snapshotOf(t testing.TB, priv ed25519.PrivateKey, n int) Snapshot {
	m := manifestOf(t, priv, 3, n)
	s := Snapshot{Manifest: m, Artifacts: map[string][]byte{}}
	for i, e := range m.Entries {
		s.Artifacts[e.SHA256] = artifact(fmt.Sprintf("d%d.example.com", i))
	}
	return s
}

// rawTar builds a gzip'd tar from headers and contents.
func rawTar(t testing.TB, entries ...any) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	for i := 0; i < len(entries); i += 2 {
		h := entries[i].(*tar.Header)
		data := entries[i+1].([]byte)
		h.Size = int64(len(data))
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
			data = nil
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	tw.Close()
	zw.Close()
	return b.Bytes()
}

// readSnapshot reads data into a staging directory under t.TempDir, and
// checks that a refusal leaves nothing staged.
func readSnapshot(t testing.TB, r io.Reader, limit int64) (*StagedSnapshot, error) {
	parent := t.TempDir()
	s, err := ReadSnapshot(context.Background(), r, limit, parent)
	if err != nil {
		if ents, _ := os.ReadDir(parent); len(ents) != 0 {
			t.Errorf("a refused snapshot left %d staging entries", len(ents))
		}
		return nil, err
	}
	t.Cleanup(func() { s.Close() })
	return s, nil
}

func TestReadSnapshot(t *testing.T) {
	pub, priv := key(t)
	s := snapshotOf(t, priv, 20)
	got, err := readSnapshot(t, bytes.NewReader(snapshotBytes(t, s)), SnapshotLimit)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range got.Manifest.Entries {
		data, err := got.Artifact(context.Background(), e.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Verify(pub, edge, data); err != nil {
			t.Fatalf("snapshot artifact: %v", err)
		}
	}
	if err := got.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(got.dir); !os.IsNotExist(err) {
		t.Errorf("staging directory left after Close: %v", err)
	}

	man := encode(t, s.Manifest)
	e0 := s.Manifest.Entries[0]
	art0 := s.Artifacts[e0.SHA256]
	one := s.Manifest
	one.Entries = one.Entries[:1]
	man1 := encode(t, one)
	sum := hex.EncodeToString(make([]byte, 32))
	reg := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg} }
	tests := []struct {
		name string
		data []byte
		want error
	}{
		{"dot-dot name", rawTar(t, reg("manifest.json"), man, reg("artifacts/../../etc/passwd"), []byte("x")), ErrSnapshot},
		{"absolute name", rawTar(t, reg("/etc/cron.d/x"), []byte("x")), ErrSnapshot},
		{"symlink", rawTar(t, &tar.Header{Name: "artifacts/" + sum, Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}, []byte{}), ErrSnapshot},
		{"hard link", rawTar(t, &tar.Header{Name: "artifacts/" + sum, Typeflag: tar.TypeLink, Linkname: "manifest.json"}, []byte{}), ErrSnapshot},
		{"fifo", rawTar(t, &tar.Header{Name: "artifacts/" + sum, Typeflag: tar.TypeFifo}, []byte{}), ErrSnapshot},
		{"unexpected name", rawTar(t, reg("nginx.conf"), []byte("x")), ErrSnapshot},
		{"no manifest", rawTar(t, reg("artifacts/"+sum), []byte("x")), ErrSnapshot},
		{"artifact before the manifest", rawTar(t, reg("artifacts/"+e0.SHA256), art0, reg("manifest.json"), man1), ErrSnapshot},
		{"artifact missing", rawTar(t, reg("manifest.json"), man), ErrSnapshot},
		{"manifest twice", rawTar(t, reg("manifest.json"), man1, reg("manifest.json"), man1, reg("artifacts/"+e0.SHA256), art0), ErrSnapshot},
		{"artifact twice", rawTar(t, reg("manifest.json"), man1, reg("artifacts/"+e0.SHA256), art0, reg("artifacts/"+e0.SHA256), art0), ErrSnapshot},
		{"artifact named by no entry", rawTar(t, reg("manifest.json"), man1, reg("artifacts/"+e0.SHA256), art0, reg("artifacts/"+sum), []byte("x")), ErrSnapshot},
		{"artifact of another size", rawTar(t, reg("manifest.json"), man1, reg("artifacts/"+e0.SHA256), append(art0, ' ')), ErrSize},
		{"artifact bytes that hash otherwise", rawTar(t, reg("manifest.json"), man1, reg("artifacts/"+e0.SHA256), bytes.ToUpper(art0)), ErrDigest},
		{"unknown manifest field", rawTar(t, reg("manifest.json"), []byte(`{"edge_id":"e","sequence":1,"entries":[],"extra":1}`)), ErrSnapshot},
		{"not gzip", []byte("plain text"), ErrSnapshot},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := readSnapshot(t, bytes.NewReader(tc.data), SnapshotLimit); !errors.Is(err, tc.want) || !IsRefusal(err) {
				t.Errorf("err %v, want %v", err, tc.want)
			}
		})
	}
}

// rawHeader is a gzip'd tar whose header declares size bytes and holds
// none: what a reader that allocates from the header would trust.
func rawHeader(t testing.TB, pre []byte, name string, size int64) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	if pre != nil {
		tw.WriteHeader(&tar.Header{Name: "manifest.json", Typeflag: tar.TypeReg, Size: int64(len(pre))})
		tw.Write(pre)
	}
	tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: size})
	tw.Flush()
	zw.Close()
	return b.Bytes()
}

// A gzip bomb: a small download that expands past the bound is refused
// before it is held in memory whole, and a header declaring a size is
// never what memory is allocated from.
func TestReadSnapshotRefusesBombs(t *testing.T) {
	zeros := make([]byte, 100<<20) // 100 MiB of zeros compress to ~100 KiB
	_, priv := key(t)
	s := snapshotOf(t, priv, 1)
	man := encode(t, s.Manifest)
	bomb := rawTar(t, &tar.Header{Name: "manifest.json", Typeflag: tar.TypeReg}, man, &tar.Header{Name: "artifacts/" + s.Manifest.Entries[0].SHA256, Typeflag: tar.TypeReg}, zeros)
	if len(bomb) > 1<<20 {
		t.Fatalf("bomb is %d bytes compressed", len(bomb))
	}
	if _, err := readSnapshot(t, bytes.NewReader(bomb), SnapshotLimit); !errors.Is(err, ErrTooLarge) {
		t.Errorf("expansion past 96 MiB: %v, want ErrTooLarge", err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"manifest.json declaring 90 MiB", rawHeader(t, nil, "manifest.json", 90<<20), ErrTooLarge},
		{"artifact declaring 90 MiB", rawHeader(t, man, "artifacts/"+s.Manifest.Entries[0].SHA256, 90<<20), ErrSize},
		{"artifact declaring more than the bound", rawHeader(t, man, "artifacts/"+s.Manifest.Entries[0].SHA256, 1<<40), ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after goruntime.MemStats
			goruntime.ReadMemStats(&before)
			_, err := readSnapshot(t, bytes.NewReader(tc.data), SnapshotLimit)
			goruntime.ReadMemStats(&after)
			if !errors.Is(err, tc.want) {
				t.Errorf("err %v, want %v", err, tc.want)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("allocated %d MiB reading a header", grew>>20)
			}
		})
	}
	// Download bound: a stream longer than the limit is cut off.
	data := snapshotBytes(t, snapshotOf(t, priv, 50))
	if _, err := readSnapshot(t, bytes.NewReader(data), int64(len(data)/2)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("download over the bound: %v, want ErrTooLarge", err)
	}
	if !strings.Contains(fmt.Sprint(ErrTooLarge), "bound") {
		t.Error("ErrTooLarge should say it is a bound")
	}
}

func FuzzDecodePage(f *testing.F) {
	_, priv := key(f)
	f.Add(encode(f, Paginate(manifestOf(f, priv, 2, 2), 500)[0]))
	f.Add([]byte(`{"edge_id":"e","sequence":1,"entries":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := DecodePage(data)
		if err != nil {
			return
		}
		if err := p.Validate(); err != nil || len(p.Entries) > MaxEntries {
			t.Fatalf("decoded an invalid page: %v", err)
		}
	})
}

func FuzzReadSnapshot(f *testing.F) {
	_, priv := key(f)
	f.Add(snapshotBytes(f, snapshotOf(f, priv, 2)))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := readSnapshot(t, bytes.NewReader(data), 1<<20)
		if err != nil {
			return
		}
		for _, e := range s.Manifest.Entries {
			got, err := s.Artifact(context.Background(), e.SHA256)
			if err != nil || int64(len(got)) != e.Size {
				t.Fatalf("accepted a snapshot missing an artifact: %v", err)
			}
		}
	})
}

// brokenReader fails after n bytes, as a download cut short does.
type brokenReader struct {
	r io.Reader
	n int
}

func (b *brokenReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, errors.New("connection reset by peer")
	}
	if len(p) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= n
	return n, err
}

// A download cut short is a failure to retry, not a refusal of the snapshot.
func TestBrokenSnapshotDownloadIsNotARefusal(t *testing.T) {
	var buf bytes.Buffer
	_, priv := key(t)
	if err := WriteSnapshot(&buf, snapshotOf(t, priv, 1)); err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{0, 10, buf.Len() / 2, buf.Len() - 1} {
		_, err := readSnapshot(t, &brokenReader{r: bytes.NewReader(buf.Bytes()), n: cut}, SnapshotLimit)
		if err == nil || IsRefusal(err) {
			t.Errorf("cut at %d of %d bytes: %v, want a failure that is not a refusal", cut, buf.Len(), err)
		}
	}
}
