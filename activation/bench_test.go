package activation

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"cellvisor/domain"
	"cellvisor/manifest"
)

// bigManifest publishes n artifacts of about 2 KiB each in shared-default.
func (r *rig) bigManifest(seq int64, n int) {
	pad := strings.Repeat("x", 1900)
	m := manifest.Manifest{EdgeID: edge, Sequence: seq}
	r.src.artifacts = map[string][]byte{}
	for i := 0; i < n; i++ {
		d := fmt.Sprintf("d%05d.example.com", i)
		art := domainJSON(d, domain.PoolSharedDefault, seq, fmt.Sprintf("%d %s", seq, pad))
		e := manifest.NewEntry(r.priv, edge, d, domain.PoolSharedDefault, seq, art)
		r.src.artifacts[e.SHA256] = art
		m.Entries = append(m.Entries, e)
	}
	r.src.m = m // memSource signs the header as it serves it
}

// BenchmarkActivation: Poll of a manifest of n ~2 KiB artifacts, from the
// first page to the switched release and its journaled ack; beside it, the
// floor: the same SHA-256s and Ed25519 verifications in a tight loop.
func BenchmarkActivation(b *testing.B) {
	for _, n := range []int{500, 5000, 20000} {
		b.Run(fmt.Sprintf("artifacts=%d", n), func(b *testing.B) {
			r := newRig(b)
			seq := int64(0)
			for b.Loop() {
				b.StopTimer()
				seq++
				r.bigManifest(seq, n)
				b.StartTimer()
				if err := r.a.Poll(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if r.a.Active() != seq {
					b.Fatalf("active %d, want %d", r.a.Active(), seq)
				}
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("floor/artifacts=%d", n), func(b *testing.B) {
			r := newRig(b)
			r.bigManifest(1, n)
			for b.Loop() {
				for _, e := range r.src.m.Entries {
					art := r.src.artifacts[e.SHA256]
					sum := sha256.Sum256(art)
					if hex.EncodeToString(sum[:]) != e.SHA256 {
						b.Fatal("digest")
					}
					sig, _ := decodeSig(e.Signature)
					if !ed25519.Verify(r.pub, manifest.SigningMessage(edge, e), sig) {
						b.Fatal("signature")
					}
				}
			}
		})
	}
}

// BenchmarkActivationPerCell is BenchmarkActivation with every cell of
// the rig in shared-default and half the entries restricted to cell-01:
// each cell gets its own pool runtime (cell-02 and cell-03 share one),
// against the shared one above.
func BenchmarkActivationPerCell(b *testing.B) {
	for _, n := range []int{500, 5000} {
		b.Run(fmt.Sprintf("artifacts=%d", n), func(b *testing.B) {
			r := newRig(b)
			asg := &manifest.Assignments{
				Cells: map[string]string{"cell-01": domain.PoolSharedDefault, "cell-02": domain.PoolSharedDefault, "cell-03": domain.PoolSharedDefault},
				Pools: map[string]manifest.PoolPolicy{domain.PoolSharedDefault: {Class: "shared"}},
			}
			seq := int64(0)
			for b.Loop() {
				b.StopTimer()
				seq++
				r.src.artifacts = map[string][]byte{}
				var entries []manifest.Entry
				for i := range n {
					var cells []string
					if i%2 == 0 {
						cells = []string{"cell-01"}
					}
					entries = append(entries, r.entry(fmt.Sprintf("d%05d.example.com", i), domain.PoolSharedDefault, seq, fmt.Sprintf("%d %s", seq, strings.Repeat("x", 1900)), cells...))
				}
				r.serve(seq, asg, entries...)
				b.StartTimer()
				if err := r.a.Poll(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if r.a.Active() != seq {
					b.Fatalf("active %d, want %d: %+v", r.a.Active(), seq, r.lastAck())
				}
				b.StartTimer()
			}
		})
	}
}
