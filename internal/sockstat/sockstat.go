// Package sockstat counts the TCP sockets of a local port by state, from
// /proc/net/tcp and /proc/net/tcp6: what a cell's public port holds when the
// cell itself cannot say (every connection it could take is taken). Only
// supervisor imports it.
package sockstat

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
)

// Counts are a port's sockets by state: connections established,
// handshakes the kernel holds (SYN received), connections closed by the
// peer and not yet by the process (CLOSE_WAIT), and the rest.
type Counts struct {
	Established int `json:"established"`
	SynRecv     int `json:"syn_recv"`
	CloseWait   int `json:"close_wait"`
	Other       int `json:"other"`
}

// Total is every socket counted.
func (c Counts) Total() int { return c.Established + c.SynRecv + c.CloseWait + c.Other }

// String is the counts for a log line.
func (c Counts) String() string {
	return fmt.Sprintf("%d established, %d in handshake, %d closed by the client, %d other", c.Established, c.SynRecv, c.CloseWait, c.Other)
}

// Port counts the sockets whose local port is port, listening ones left
// out, in the files under procNet ("" for /proc/net).
func Port(procNet string, port int) (Counts, error) {
	if procNet == "" {
		procNet = "/proc/net"
	}
	var c Counts
	for _, f := range []string{"tcp", "tcp6"} {
		fd, err := os.Open(procNet + "/" + f)
		if err != nil {
			if os.IsNotExist(err) {
				continue // no IPv6
			}
			return c, err
		}
		err = count(fd, port, &c)
		fd.Close()
		if err != nil {
			return c, fmt.Errorf("%s/%s: %w", procNet, f, err)
		}
	}
	return c, nil
}

// count adds the sockets of port in one /proc/net/tcp table to c.
func count(r io.Reader, port int, c *Counts) error {
	want := []byte(fmt.Sprintf(":%04X", port))
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		f := bytes.Fields(sc.Bytes())
		if len(f) < 4 || !bytes.HasSuffix(f[1], want) {
			continue
		}
		st, err := strconv.ParseUint(string(f[3]), 16, 8)
		if err != nil {
			return fmt.Errorf("state %q: %w", f[3], err)
		}
		switch st {
		case 0x0A: // listening
		case 0x01:
			c.Established++
		case 0x03:
			c.SynRecv++
		case 0x08:
			c.CloseWait++
		default:
			c.Other++
		}
	}
	return sc.Err()
}
