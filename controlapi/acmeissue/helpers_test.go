package acmeissue

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/domain"
)

// memKeys is a KeyStore in memory that counts its writes.
type memKeys struct {
	mu   sync.Mutex
	key  []byte
	puts int
}

func (m *memKeys) AccountKey(context.Context) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.key, nil
}

func (m *memKeys) PutAccountKeyIfAbsent(_ context.Context, k []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.puts++
	if m.key == nil {
		m.key = k
	}
	return m.key, nil
}

// responder stands in for the cells: it serves the key authorizations
// Present gave it at /.well-known/acme-challenge/<token> on a loopback
// port, and records which hostnames the CA asked for.
type responder struct {
	port int
	// corrupt, when set, makes it answer with a wrong key authorization.
	corrupt bool

	mu       sync.Mutex
	answers  map[string]string // token → key authorization
	asked    map[string]int    // Host header → requests
	presents int
	cleanups int
}

var _ Challenges = (*responder)(nil)

func newResponder(t *testing.T) *responder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &responder{port: ln.Addr().(*net.TCPAddr).Port, answers: map[string]string{}, asked: map[string]int{}}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return r
}

func (r *responder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	token, ok := strings.CutPrefix(req.URL.Path, "/.well-known/acme-challenge/")
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	r.mu.Lock()
	r.asked[host]++
	ka, known := r.answers[token]
	r.mu.Unlock()
	if !ok || !known {
		http.NotFound(w, req)
		return
	}
	_, _ = w.Write([]byte(ka))
}

func (r *responder) Present(_ context.Context, _ string, cs []domain.ACMEChallenge) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.presents++
	for _, c := range cs {
		if len(c.KeyAuthorization) <= len(c.Token)+1 || !strings.HasPrefix(c.KeyAuthorization, c.Token+".") {
			return errors.New("not a key authorization")
		}
		ka := c.KeyAuthorization
		if r.corrupt {
			ka = c.Token + ".not-the-thumbprint"
		}
		r.answers[c.Token] = ka
	}
	return nil
}

func (r *responder) CleanUp(context.Context, string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups++
	clear(r.answers)
	return nil
}

func (r *responder) counts() (presents, cleanups, pending int, asked map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := make(map[string]int, len(r.asked))
	for k, v := range r.asked {
		a[k] = v
	}
	return r.presents, r.cleanups, len(r.answers), a
}
