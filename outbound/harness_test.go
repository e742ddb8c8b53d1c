package outbound

import (
	"context"
	"net"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"cellvisor/controlclient"
	"cellvisor/outbound/outboundtest"
	"cellvisor/testkit/corpingest"
)

// env is one control plane (fake), one edges' CA and one destination.
type env struct {
	t       testing.TB
	ca      *outboundtest.CA
	control *outboundtest.Control
	ingest  *corpingest.Server
	dest    *httptest.Server
}

func newEnv(t testing.TB, lease time.Duration) *env {
	e := &env{t: t, ca: outboundtest.NewCA(t, "edges CA"), ingest: corpingest.New()}
	e.dest = httptest.NewServer(e.ingest)
	t.Cleanup(e.dest.Close)
	e.control = outboundtest.NewControl(e.dest.URL+"/ingest", lease)
	e.control.Serve(t, e.ca)
	return e
}

// edge is one agent's send path: its identity, journal, sender and intake,
// on loopback.
type edge struct {
	id, org  string
	state    string
	identity string
	journal  *Journal
	sender   *Sender
	in       *Intake // nil without an intake
	intake   string
	ln       net.Listener
	stop     func()
}

type edgeOpts struct {
	maxBundles int
	noIntake   bool
	state      string // reuse a state directory (a restart)
	// maxConns, maxConnsPerIP and handshake bound the intake's
	// connections (zero: the defaults).
	maxConns, maxConnsPerIP int
	handshake               time.Duration
	// wrap, if set, wraps the intake's listener (to watch it).
	wrap func(net.Listener) net.Listener
}

func (e *env) startEdge(id, org string, o edgeOpts) *edge {
	t := e.t
	ed := &edge{id: id, org: org, state: o.state}
	if ed.state == "" {
		ed.state = t.TempDir()
	}
	ed.identity = e.ca.EdgeIdentity(t, id, e.ca.PEM)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if o.wrap != nil {
		ln = o.wrap(ln)
	}
	ed.ln = ln
	ed.intake = "https://" + ln.Addr().String()
	if !e.control.Known(id) {
		e.control.Add(id, org, ed.intake)
	}
	ed.start(t, e, o)
	return ed
}

func (ed *edge) start(t testing.TB, e *env, o edgeOpts) {
	log := zaptest.NewLogger(t).Named(ed.id)
	cc, err := controlclient.New(controlclient.Options{URL: e.control.URL, Dir: ed.identity, Timeout: 5 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if o.maxBundles == 0 {
		o.maxBundles = 100
	}
	ctx, cancel := context.WithCancel(context.Background())
	if ed.journal, err = OpenJournal(ctx, filepath.Join(ed.state, "egress"), o.maxBundles, 64<<20, log); err != nil {
		t.Fatal(err)
	}
	ptls, err := NewPeerTLS(filepath.Join(ed.identity, "cert.pem"), filepath.Join(ed.identity, "key.pem"), filepath.Join(ed.identity, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	ed.sender, err = NewSender(Options{EdgeID: ed.id, Org: ed.org, Control: cc, Journal: ed.journal, TLS: ptls, IntakeURL: ed.intake,
		ProbeTimeout: time.Second, SendTimeout: 3 * time.Second, MaxRenew: 10 * time.Second, MinRetry: 20 * time.Millisecond, Logger: log,
		IntakeConns: IntakeLimits{MaxConns: o.maxConns, MaxConnsPerIP: o.maxConnsPerIP, HandshakeTimeout: o.handshake}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ed.sender.Run(ctx) }()
	if !o.noIntake {
		ed.in = NewIntake(ed.sender)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ed.in.Serve(ctx, ed.ln); err != nil {
				t.Errorf("intake %s: %v", ed.id, err)
			}
		}()
	} else {
		ed.ln.Close()
	}
	var once sync.Once
	ed.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			cc.CloseIdle()
		})
	}
	t.Cleanup(ed.stop)
}

// submit makes and submits a bundle of class from ed.
func (ed *edge) submit(t testing.TB, class string) string {
	t.Helper()
	b, err := NewBundle(ed.org, ed.id, classOf(t, class), time.Now(), []Metering{{Cell: "cell-01", Requests: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ed.sender.Submit(b); err != nil {
		t.Fatal(err)
	}
	return b.ID
}
