package supervisor

import (
	"errors"
	"net"
	"strconv"
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

func fcntl(fd, cmd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}
