package supervisor

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"cellvisor/internal/safefile"
	"cellvisor/runtime"
)

// The agent binds each cell's public TCP ports itself and hands the
// listening sockets to the cell's master, which nginx takes over from the
// NGINX environment variable ("3;4;": the fds it inherits) instead of
// binding its own. The agent keeps its copy while the cell runs and across
// a restart at once (a crash, a failed liveness check), so:
//
//   - a crashed cell's port never closes: connections that arrive before the
//     new master runs wait in the listen backlog and are answered by it,
//     rather than refused; and the new master need not wait for the kernel
//     to tear the killed processes down to bind the port again;
//   - the readiness probe sends one request, which waits in the backlog until
//     a worker answers it, instead of dialling a refusing port every
//     millisecond while eight cells compete for the CPU.
//
// The agent never accepts on them. It closes its copy whenever the cell is
// not coming back at once (a stop, a restart with backoff, an unassignment,
// the agent stopping or leaving the cells to its successor), so a port
// nobody will serve soon refuses connections, as before. A master adopted
// from a previous agent holds the only copy of its sockets: when it exits,
// its group is emptied and the ports bound anew, as before.

// listenBacklog is nginx's default listen backlog on Linux; nginx applies
// its own (listen ... backlog=) when its configuration says otherwise.
const listenBacklog = 511

// listeners are a cell's public listening sockets, bound by the agent.
type listeners struct {
	files []*os.File
}

// bindListeners binds addr ("" for every IPv4 address, as nginx's `listen
// PORT`) on each port. The sockets are non-blocking (the flag is shared with
// the master's copies, and nginx expects its listeners so) and close on
// exec (cellCmd hands them over explicitly).
func bindListeners(addr string, ports ...int) (*listeners, error) {
	l := &listeners{}
	for _, port := range ports {
		f, err := bindTCP(addr, port)
		if err != nil {
			l.close()
			return nil, err
		}
		l.files = append(l.files, f)
	}
	return l, nil
}

// maxConf bounds the read of a cell's nginx.conf (rendered by the agent:
// a few kilobytes).
const maxConf = 1 << 20

// confListen reads where a cell's nginx.conf listens on ports: "" for
// `listen PORT` (every IPv4 address), or the IP of `listen IP:PORT` and
// `listen [IPv6]:PORT`. nginx takes an inherited socket only for a listen
// line with the same address, so the agent binds exactly that. It is not
// ok (the agent holds nothing, and nginx binds its own ports) when the file
// cannot be read as a regular file of at most maxConf (safefile's rules: no
// link, FIFO or device), a port has no listen line or two disagree, or the
// address is a host name, which nginx resolves itself.
func confListen(path string, ports ...int) (addr string, ok bool) {
	// A FIFO put in the file's place must not hold the start until a
	// writer comes: only a regular file is read, never blocking.
	data, err := safefile.ReadFile(context.Background(), path, maxConf)
	if err != nil {
		return "", false
	}
	found := map[int][]string{}
	for rest := string(data); rest != ""; {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		// Only a listen directive is split into fields: the file is read
		// whole at every start (and at the agent's, to bind early).
		if t := strings.TrimLeft(line, " \t"); !strings.HasPrefix(t, "listen") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "listen" {
			continue
		}
		arg := strings.TrimSuffix(fields[1], ";")
		host, port := "", arg
		if _, err := strconv.Atoi(arg); err != nil {
			if host, port, err = net.SplitHostPort(arg); err != nil {
				continue // unix:… and the like
			}
		}
		if n, err := strconv.Atoi(port); err == nil {
			found[n] = append(found[n], host)
		}
	}
	for i, port := range ports {
		hosts := found[port]
		if len(hosts) != 1 || (i > 0 && hosts[0] != addr) {
			return "", false
		}
		addr = hosts[0]
	}
	if addr != "" {
		if _, err := netip.ParseAddr(addr); err != nil {
			return "", false
		}
	}
	return addr, true
}

func bindTCP(addr string, port int) (*os.File, error) {
	ip := netip.IPv4Unspecified()
	if addr != "" {
		var err error
		if ip, err = netip.ParseAddr(addr); err != nil {
			return nil, fmt.Errorf("bind port %d: address %q: %w", port, addr, err)
		}
	}
	ip = ip.Unmap()
	var family int
	var sa syscall.Sockaddr
	if ip.Is4() {
		family, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: port, Addr: ip.As4()}
	} else {
		family, sa = syscall.AF_INET6, &syscall.SockaddrInet6{Port: port, Addr: ip.As16()}
	}
	name := fmt.Sprintf("%s:%d", ip, port)
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("bind %s: socket: %w", name, err)
	}
	fail := func(step string, err error) (*os.File, error) {
		syscall.Close(fd)
		return nil, fmt.Errorf("bind %s: %s: %w", name, step, err)
	}
	// As nginx does for its own listeners.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		return fail("SO_REUSEADDR", err)
	}
	if family == syscall.AF_INET6 {
		if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 1); err != nil {
			return fail("IPV6_V6ONLY", err)
		}
	}
	if err := syscall.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	if err := syscall.Listen(fd, listenBacklog); err != nil {
		return fail("listen", err)
	}
	return os.NewFile(uintptr(fd), "cell listener "+name), nil
}

// env is the NGINX variable naming the fds the master receives them as:
// cellCmd passes them first among its extra files, from fd 3 on.
func (l *listeners) env() string {
	var b strings.Builder
	b.WriteString("NGINX=")
	for i := range l.files {
		b.WriteString(strconv.Itoa(3 + i))
		b.WriteByte(';')
	}
	return b.String()
}

func (l *listeners) close() {
	for _, f := range l.files {
		f.Close()
	}
	l.files = nil
}

// holdListeners makes sure the slot holds its cell's listeners, bound
// where the nginx.conf about to be started listens. Call it only with
// nothing of the cell running (the ports are otherwise taken). A file the
// agent cannot read so (see confListen) is left to bind its own ports.
func (c *slot) holdListeners() error {
	if c.ln != nil {
		return nil
	}
	early := c.early
	c.early = nil
	if early != nil && c.earlySeq >= 0 {
		// Bound for the release active when the agent began: the one about
		// to start, unless the start-up built or rolled back to another
		// (another sequence), which is read for where it listens.
		if seq, ok := runtime.CurrentSequence(c.spec); ok && seq == c.earlySeq {
			c.ln = early
			return nil
		}
	}
	_, addr, ok := c.activeListen()
	if early != nil {
		if ok && c.earlyAddr == addr {
			c.ln = early
			return nil
		}
		early.close()
	}
	if !ok {
		return nil
	}
	ln, err := bindListeners(addr, c.spec.HTTPPort, c.spec.HTTPSPort)
	if err != nil {
		return fmt.Errorf("bind the cell's ports: %w", err)
	}
	c.ln = ln
	return nil
}

// bindEarly binds the ports where the slot's active release listens, ahead
// of its first start (Prepare): from then on a connection waits in the
// backlog for the cell rather than being refused, as it does across a
// restart. Nothing is bound where the ports are taken (a master left
// running by a previous agent holds them; recovery adopts it) or the
// release cannot be read; the start then binds as it always does.
func (c *slot) bindEarly() {
	seq, addr, ok := c.activeListen()
	if !ok {
		return
	}
	ln, err := bindListeners(addr, c.spec.HTTPPort, c.spec.HTTPSPort)
	if err != nil {
		c.log.Debug("ports not bound ahead of the start", zap.Error(err))
		return
	}
	c.early, c.earlyAddr, c.earlySeq = ln, addr, seq
}

// activeListen is the sequence of the slot's active release (-1 where it
// cannot be told) and the address its public listeners bind: from its
// metadata where that says so in a form it binds (runtime.Current, which a
// start has verified and holds: every address, or an IP address), else
// read from its nginx.conf. Not ok where neither tells.
func (c *slot) activeListen() (seq int64, addr string, ok bool) {
	if m, err := runtime.Current(c.spec); err == nil {
		if m.Listen == runtime.AllAddresses {
			return m.Sequence, "", true
		}
		if _, err := netip.ParseAddr(m.Listen); err == nil {
			return m.Sequence, m.Listen, true
		}
	}
	// The sequence first: a release switched to meanwhile reads as another
	// one at the start, never the other way round.
	seq, known := runtime.CurrentSequence(c.spec)
	if !known {
		seq = -1
	}
	addr, ok = confListen(c.spec.ConfPath(), c.spec.HTTPPort, c.spec.HTTPSPort)
	return seq, addr, ok
}

// dropEarly closes the listeners bindEarly bound, if the slot's start did
// not take them: a port nobody will serve soon refuses connections.
func (c *slot) dropEarly() {
	if c.early != nil {
		c.early.close()
		c.early = nil
	}
}

// dropListeners closes the slot's copy of its cell's listeners, and ends
// its spare, which holds copies of them too: once the master's copies are
// closed as well, the ports refuse connections. The slot's routine calls
// it whenever its cell is not coming back at once.
func (c *slot) dropListeners() {
	c.discardSpare()
	if c.ln != nil {
		c.ln.close()
		c.ln = nil
		c.log.Debug("cell listeners closed")
	}
}
