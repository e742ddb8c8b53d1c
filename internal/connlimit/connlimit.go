// Package connlimit bounds what the connections of one listener may cost:
// a cap on the connections open at once, a smaller one on those not yet
// established (not through their handshake, or through it without a client
// certificate), a cap per source address, and a short handshake deadline.
// At a cap it drops the OLDEST connection not yet established rather than
// refusing the new one, so that a flood of half-open connections evicts
// itself and a real peer's handshake, which takes milliseconds, still gets
// through; a new connection is refused only when every connection it would
// displace is established (issue 32 §1). With a TLS configuration it runs
// the server handshakes itself, concurrently and under the deadline, and
// Accept returns only connections through theirs.
//
// The agent's egress intake (outbound), metrics endpoint (agentmetrics)
// and listener statistics (agent), and the control API's listeners
// (controlapi) and their series (controlapi/metrics) use it.
// golang.org/x/net's netutil.LimitListener was not enough: it stops
// accepting at its cap, so a flood holding the cap locks out every real
// peer.
package connlimit

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// DefaultHandshakeTimeout is Options.HandshakeTimeout's default.
const DefaultHandshakeTimeout = 3 * time.Second

// Options configure a Listener.
type Options struct {
	// Name names the listener in logs ("intake", "metrics", "edge").
	Name string
	// Max bounds the connections open at once (accepted by the kernel and
	// taken, not yet closed). Required, > 0.
	Max int
	// MaxPending bounds those not yet established; zero means Max.
	MaxPending int
	// MaxPerIP bounds one source address's connections; zero means no
	// bound per address (peers many, or behind shared addresses).
	MaxPerIP int
	// HandshakeTimeout closes a connection not through its handshake (TLS,
	// or the first request's headers on a plain listener) within it; zero
	// means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// TLS, or nil for a plain listener. With it the listener runs the
	// server handshake and Accept returns *tls.Conn through it; a
	// connection whose handshake fails is closed and counted.
	TLS *tls.Config
	// Established reports whether a completed TLS handshake establishes
	// its connection; nil means a verified client certificate chain. A
	// connection through its handshake but not established (an enrollment
	// without a certificate) stays droppable, without the deadline. On a
	// plain listener (or for such a connection) ConnState establishes a
	// connection at its first request.
	Established func(tls.ConnectionState) bool
	// Logger, or nil for none.
	Logger *zap.Logger
}

// Stats are a listener's connections now and what it refused, dropped or
// timed out since it started.
type Stats struct {
	Open    int // connections open
	Pending int // of which not yet established
	Max     int // Options.Max

	Accepted uint64 // connections taken from the kernel
	// RefusedPerIP: new connections closed at once, their address at
	// MaxPerIP with every one of its connections established.
	RefusedPerIP uint64
	// RefusedFull: new connections closed at once, the listener at Max
	// with every connection established.
	RefusedFull uint64
	// DroppedPerIP, DroppedPending, DroppedFull: the oldest pending
	// connection closed to make room for a new one, at MaxPerIP (of the
	// same address), at MaxPending, at Max.
	DroppedPerIP, DroppedPending, DroppedFull uint64
	// HandshakeTimeouts: closed at the handshake deadline;
	// HandshakeFailures: TLS handshakes that failed (no or a bad client
	// certificate where one is required, not TLS at all).
	HandshakeTimeouts, HandshakeFailures uint64
}

// Listener is a net.Listener with the bounds of its Options.
type Listener struct {
	inner net.Listener
	o     Options
	log   *zap.Logger

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	ready  chan net.Conn // connections for Accept
	wg     sync.WaitGroup
	once   sync.Once
	err    atomic.Pointer[error] // why the accept loop ended

	accepted, refusedIP, refusedFull                           atomic.Uint64
	droppedIP, droppedPending, droppedFull, timeouts, failures atomic.Uint64

	mu      sync.Mutex // guards the following fields
	open    int
	pending *list.List              // of *conn not established, oldest first
	byIP    map[netip.Addr]*ipConns // per source address
	warned  map[string]time.Time    // last warning by kind, to bound the log
}

// ipConns are one source address's connections.
type ipConns struct {
	n       int
	pending *list.List // of *conn not established, oldest first
}

var _ net.Listener = (*Listener)(nil)

// New bounds inner's connections; it starts the accept loop, which ends
// with Close.
func New(inner net.Listener, o Options) (*Listener, error) {
	if o.Max <= 0 {
		return nil, fmt.Errorf("connlimit %s: Max must be > 0, got %d", o.Name, o.Max)
	}
	if o.MaxPending <= 0 || o.MaxPending > o.Max {
		o.MaxPending = o.Max
	}
	if o.MaxPerIP < 0 {
		return nil, fmt.Errorf("connlimit %s: MaxPerIP must be >= 0, got %d", o.Name, o.MaxPerIP)
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.Established == nil {
		o.Established = func(cs tls.ConnectionState) bool { return len(cs.VerifiedChains) > 0 }
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{inner: inner, o: o, log: o.Logger.Named("connlimit").With(zap.String("listener", o.Name)),
		ctx: ctx, cancel: cancel, ready: make(chan net.Conn),
		pending: list.New(), byIP: map[netip.Addr]*ipConns{}, warned: map[string]time.Time{}}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Accept returns the next connection: through its TLS handshake on a TLS
// listener. It returns net.ErrClosed (wrapped) once the listener is closed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.ctx.Done():
		if p := l.err.Load(); p != nil {
			return nil, *p
		}
		return nil, fmt.Errorf("connlimit %s: %w", l.o.Name, net.ErrClosed)
	}
}

// Close stops accepting and closes every connection not yet returned by
// Accept; those returned are their server's to close. It waits for the
// accept loop and the handshakes.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		l.cancel()
		err = l.inner.Close()
		l.wg.Wait()
	})
	return err
}

// Addr is the inner listener's.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Stats returns the listener's counts.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	open, pending := l.open, l.pending.Len()
	l.mu.Unlock()
	return Stats{Open: open, Pending: pending, Max: l.o.Max, Accepted: l.accepted.Load(),
		RefusedPerIP: l.refusedIP.Load(), RefusedFull: l.refusedFull.Load(),
		DroppedPerIP: l.droppedIP.Load(), DroppedPending: l.droppedPending.Load(), DroppedFull: l.droppedFull.Load(),
		HandshakeTimeouts: l.timeouts.Load(), HandshakeFailures: l.failures.Load()}
}

// ConnState is an http.Server's ConnState hook: a connection that starts a
// request (its headers read) is established. Plain listeners need it; on
// a TLS listener it establishes a connection through its handshake
// without a client certificate once it sends a request (HTTP/1 only: the
// server does not call the hook for HTTP/2).
func (l *Listener) ConnState(nc net.Conn, st http.ConnState) {
	if st != http.StateActive {
		return
	}
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if c, ok := nc.(*conn); ok && c.l == l {
		l.establish(c)
	}
}

// acceptLoop takes connections from the kernel until Close; a temporary
// failure (out of file descriptors) is retried after a growing pause.
func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var pause time.Duration
	for {
		raw, err := l.inner.Accept()
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				l.warn("accept", "accept failed; retrying", zap.Error(err), zap.Duration("pause", pause))
				t := time.NewTimer(pause)
				select {
				case <-t.C:
					continue
				case <-l.ctx.Done():
					t.Stop()
					return
				}
			}
			err = fmt.Errorf("connlimit %s: accept: %w", l.o.Name, err)
			l.err.Store(&err)
			l.cancel()
			return
		}
		pause = 0
		l.accepted.Add(1)
		c := l.admit(raw)
		if c == nil {
			continue
		}
		if l.o.TLS != nil {
			l.wg.Add(1)
			go l.handshake(c)
			continue
		}
		c.timer = time.AfterFunc(l.o.HandshakeTimeout, func() { l.expire(c) })
		l.deliver(c)
	}
}

// isTemporary reports an accept error worth retrying: out of file
// descriptors or buffers, or a connection reset before it was taken.
func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// handshake runs c's TLS handshake under the deadline, then hands it to
// Accept.
func (l *Listener) handshake(c *conn) {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(l.ctx, l.o.HandshakeTimeout)
	defer cancel()
	tc := tls.Server(c, l.o.TLS)
	err := tc.HandshakeContext(ctx)
	if err != nil {
		tc.Close()
		switch {
		case c.dropped():
			// made room for a newer one: counted then
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			l.timeouts.Add(1)
		case l.ctx.Err() == nil:
			l.failures.Add(1)
			l.log.Debug("tls handshake failed", zap.String("remote", c.RemoteAddr().String()), zap.Error(err))
		}
		return
	}
	if l.o.Established(tc.ConnectionState()) {
		l.establish(c)
	}
	l.deliver(tc)
}

// deliver hands nc to Accept, or closes it when the listener closes first.
func (l *Listener) deliver(nc net.Conn) {
	select {
	case l.ready <- nc:
	case <-l.ctx.Done():
		nc.Close()
	}
}

// expire closes c, on a plain listener, if its first request has not come
// within the handshake deadline.
func (l *Listener) expire(c *conn) {
	l.mu.Lock()
	late := !c.established && !c.gone
	l.mu.Unlock()
	if late {
		l.timeouts.Add(1)
		c.Close()
	}
}

// admit decides on a new connection: it takes it, dropping older pending
// ones as the caps require, or refuses it (closed, nil).
func (l *Listener) admit(raw net.Conn) *conn {
	c := &conn{Conn: raw, l: l, ip: remoteIP(raw)}
	var victims []*conn
	refuse := func(counter *atomic.Uint64, kind, msg string) *conn {
		l.mu.Unlock()
		counter.Add(1)
		raw.Close()
		closeAll(victims)
		l.warn(kind, msg, zap.String("remote", raw.RemoteAddr().String()), zap.Int("max", l.o.Max),
			zap.Int("max_per_ip", l.o.MaxPerIP))
		return nil
	}
	// evict drops the oldest pending connection of q for the new one,
	// counting it in n; false when q has none to drop.
	evict := func(q *list.List, n *atomic.Uint64) bool {
		v := front(q)
		if v == nil {
			return false
		}
		l.forgetLocked(v, true)
		victims = append(victims, v)
		n.Add(1)
		return true
	}
	l.mu.Lock()
	ipc := l.byIP[c.ip]
	if l.o.MaxPerIP > 0 && ipc != nil && ipc.n >= l.o.MaxPerIP && !evict(ipc.pending, &l.droppedIP) {
		return refuse(&l.refusedIP, "refused_per_ip", "connection refused: its address holds as many established connections as it may")
	}
	if l.pending.Len() >= l.o.MaxPending {
		evict(l.pending, &l.droppedPending)
	}
	if l.open >= l.o.Max && !evict(l.pending, &l.droppedFull) {
		return refuse(&l.refusedFull, "refused_full", "connection refused: the listener holds as many established connections as it may")
	}
	l.open++
	if ipc = l.byIP[c.ip]; ipc == nil {
		ipc = &ipConns{pending: list.New()}
		l.byIP[c.ip] = ipc
	}
	ipc.n++
	c.el = l.pending.PushBack(c)
	c.ipEl = ipc.pending.PushBack(c)
	l.mu.Unlock()
	if len(victims) > 0 {
		closeAll(victims)
		l.warn("dropped", "oldest pending connections dropped to make room: a flood of connections that do not complete their handshake?",
			zap.Int("dropped", len(victims)), zap.Int("max", l.o.Max), zap.Int("max_pending", l.o.MaxPending))
	}
	return c
}

func front(ls *list.List) *conn {
	if e := ls.Front(); e != nil {
		return e.Value.(*conn)
	}
	return nil
}

func closeAll(cs []*conn) {
	for _, c := range cs {
		c.Conn.Close()
		if c.timer != nil {
			c.timer.Stop()
		}
	}
}

// establish takes c off the pending lists: it is no longer dropped to make
// room.
func (l *Listener) establish(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.gone || c.established {
		return
	}
	c.established = true
	l.unlistLocked(c)
	if c.timer != nil {
		c.timer.Stop()
	}
}

func (l *Listener) unlistLocked(c *conn) {
	if c.el != nil {
		l.pending.Remove(c.el)
		c.el = nil
	}
	if c.ipEl != nil {
		l.byIP[c.ip].pending.Remove(c.ipEl)
		c.ipEl = nil
	}
}

// forgetLocked stops counting c (closed, or dropped).
func (l *Listener) forgetLocked(c *conn, drop bool) {
	if c.gone {
		return
	}
	c.gone, c.wasDropped = true, drop
	l.unlistLocked(c)
	l.open--
	if ipc := l.byIP[c.ip]; ipc != nil {
		if ipc.n--; ipc.n == 0 {
			delete(l.byIP, c.ip)
		}
	}
}

// warnEvery bounds the log to a line per kind of refusal in this interval:
// a flood must not turn into a flood of log lines.
const warnEvery = 10 * time.Second

func (l *Listener) warn(kind, msg string, fields ...zap.Field) {
	now := time.Now()
	l.mu.Lock()
	last, ok := l.warned[kind]
	if ok && now.Sub(last) < warnEvery {
		l.mu.Unlock()
		return
	}
	l.warned[kind] = now
	l.mu.Unlock()
	st := l.Stats()
	l.log.Warn(msg, append(fields, zap.Int("open", st.Open), zap.Int("pending", st.Pending),
		zap.Uint64("refused_total", st.RefusedPerIP+st.RefusedFull), zap.Uint64("dropped_total", st.DroppedPerIP+st.DroppedPending+st.DroppedFull))...)
}

// remoteIP is the connection's source address, IPv4-in-IPv6 unmapped; the
// zero address when it has none (a unix socket in a test).
func remoteIP(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// conn is one connection the listener counts until it is closed.
type conn struct {
	net.Conn
	l     *Listener
	ip    netip.Addr
	timer *time.Timer // a plain listener's handshake deadline

	// guarded by l.mu
	el, ipEl    *list.Element // on the pending lists while not established
	established bool
	gone        bool // closed or dropped: no longer counted
	wasDropped  bool
}

func (c *conn) Close() error {
	c.l.mu.Lock()
	c.l.forgetLocked(c, false)
	c.l.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	return c.Conn.Close()
}

func (c *conn) dropped() bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.wasDropped
}
