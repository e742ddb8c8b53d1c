package sockstat

import (
	"net"
	"strings"
	"testing"
	"time"
)

const table = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D2A2 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:D2A4 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:1F90 0100007F:D2A6 03 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 20 4 30 10 -1
   4: 0100007F:1F90 0100007F:D2A8 08 00000000:00000000 00:00000000 00000000     0        0 5 1 0000000000000000 20 4 30 10 -1
   5: 0100007F:1F91 0100007F:D2AA 01 00000000:00000000 00:00000000 00000000     0        0 6 1 0000000000000000 20 4 30 10 -1
   6: 0100007F:D2AC 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 7 1 0000000000000000 20 4 30 10 -1
`

func TestCountByLocalPort(t *testing.T) {
	var c Counts
	if err := count(strings.NewReader(table), 8080, &c); err != nil {
		t.Fatal(err)
	}
	if want := (Counts{Established: 2, SynRecv: 1, CloseWait: 1}); c != want {
		t.Errorf("counts %+v, want %+v (the listener, another port and a client's end left out)", c, want)
	}
}

// The real tables hold a loopback listener's accepted connections.
func TestPortOnThisHost(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	var conns []net.Conn
	for range 3 {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, s)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	c, err := Port("", port)
	if err != nil {
		t.Fatal(err)
	}
	if c.Established != 3 {
		t.Errorf("counts %+v, want 3 established", c)
	}
}
