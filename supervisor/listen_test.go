package supervisor

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// The agent's listeners are bound where nginx's listen directive says,
// listening, non-blocking (the flag nginx's copies share), named to nginx
// from fd 3 on, and free the port once closed.
func TestBindListeners(t *testing.T) {
	free := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	a, b := free(), free()
	ln, err := bindListeners("127.0.0.1", a, b)
	if err != nil {
		t.Fatal(err)
	}
	if got := ln.env(); got != "NGINX=3;4;" {
		t.Errorf("env %q, want NGINX=3;4;", got)
	}
	for i, port := range []int{a, b} {
		sa, err := syscall.Getsockname(int(ln.files[i].Fd()))
		if err != nil {
			t.Fatal(err)
		}
		if in4, ok := sa.(*syscall.SockaddrInet4); !ok || in4.Port != port || in4.Addr != [4]byte{127, 0, 0, 1} {
			t.Errorf("listener %d bound to %+v, want 127.0.0.1:%d", i, sa, port)
		}
		fl, err := fcntl(int(ln.files[i].Fd()), syscall.F_GETFL)
		if err != nil || fl&syscall.O_NONBLOCK == 0 {
			t.Errorf("listener %d flags %#x (%v): want O_NONBLOCK", i, fl, err)
		}
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d does not accept while held: %v", port, err)
		}
		c.Close()
	}
	if _, err := bindListeners("127.0.0.1", a); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("second bind of a held port: %v, want EADDRINUSE", err)
	}
	ln.close()
	if _, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(a)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial after close: %v, want connection refused", err)
	}
	again, err := bindListeners("127.0.0.1", a, b)
	if err != nil {
		t.Fatalf("rebind after close: %v", err)
	}
	again.close()
	if _, err := bindListeners("not-an-address", a); err == nil {
		t.Error("a malformed address was bound")
	}

	// A port the first bind cannot take leaves nothing of the others bound.
	hold, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(b))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	if _, err := bindListeners("127.0.0.1", a, b); err == nil {
		t.Fatal("bound a port another listener holds")
	}
	if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(a)); err != nil {
		t.Errorf("a failed bind left port %d bound: %v", a, err)
	} else {
		l.Close()
	}
}

// An IPv6 address binds an IPv6-only socket, as nginx's listen [addr]:port
// does (ipv6only=on).
func TestBindListenersIPv6(t *testing.T) {
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ln, err := bindListeners("::1", port)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.close()
	sa, err := syscall.Getsockname(int(ln.files[0].Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if in6, ok := sa.(*syscall.SockaddrInet6); !ok || in6.Port != port || in6.Addr != [16]byte{15: 1} {
		t.Errorf("bound to %+v, want [::1]:%d", sa, port)
	}
	v6only, err := syscall.GetsockoptInt(int(ln.files[0].Fd()), syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY)
	if err != nil || v6only != 1 {
		t.Errorf("IPV6_V6ONLY %d (%v), want 1", v6only, err)
	}
}

func fcntl(fd, cmd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// The agent binds where the cell's nginx.conf listens, and holds nothing
// (nginx binds its own) for a file it cannot read so.
func TestConfListen(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, conf string
		addr       string
		ok         bool
	}{
		{"every address", "server {\n    listen 8081 default_server;\n}\nserver {\n    listen 8091 ssl default_server;\n}\nserver { listen unix:/run/x.sock; }\n", "", true},
		{"ipv4", "listen 127.0.0.1:8081 default_server;\nlisten 127.0.0.1:8091 ssl default_server;\n", "127.0.0.1", true},
		{"ipv6", "listen [::1]:8081 default_server;\nlisten [::1]:8091 ssl default_server;\n", "::1", true},
		{"host name", "listen localhost:8081;\nlisten localhost:8091 ssl;\n", "", false},
		{"ports disagree", "listen 127.0.0.1:8081;\nlisten 127.0.0.2:8091 ssl;\n", "", false},
		{"a port missing", "listen 127.0.0.1:8081;\n", "", false},
		{"a port twice", "listen 127.0.0.1:8081;\nlisten 127.0.0.2:8081;\nlisten 127.0.0.1:8091 ssl;\n", "", false},
		{"over the bound", "listen 8081;\nlisten 8091 ssl;\n" + strings.Repeat("#", maxConf), "", false},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".conf")
		if err := os.WriteFile(path, []byte(tc.conf), 0o644); err != nil {
			t.Fatal(err)
		}
		if addr, ok := confListen(path, 8081, 8091); addr != tc.addr || ok != tc.ok {
			t.Errorf("%s: %q %v, want %q %v", tc.name, addr, ok, tc.addr, tc.ok)
		}
	}
	if _, ok := confListen(filepath.Join(dir, "missing.conf"), 8081); ok {
		t.Error("a missing file reads as a listen address")
	}
	// A FIFO in the file's place is refused at once, not waited on.
	fifo := filepath.Join(dir, "fifo.conf")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := confListen(fifo, 8081); ok {
		t.Error("a FIFO reads as a listen address")
	}
}
