package pebbletest

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// StartDNS serves DNS over TCP on 127.0.0.1 (Pebble's resolver asks over
// TCP) until the test ends: an A record of 127.0.0.1 for each of hostnames,
// no AAAA, NXDOMAIN for any other name. It returns host:port.
func StartDNS(t testing.TB, hostnames []string) string {
	t.Helper()
	known := make(map[string]bool, len(hostnames))
	for _, h := range hostnames {
		known[dns.Fqdn(strings.ToLower(h))] = true
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{Listener: ln, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Authoritative = true
		switch {
		case len(q.Question) != 1 || !known[strings.ToLower(q.Question[0].Name)]:
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1},
				A:   net.IPv4(127, 0, 0, 1),
			})
		}
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan error, 1)
	go func() { done <- srv.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("pebbletest: dns server: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.ShutdownContext(ctx)
		<-done
	})
	return ln.Addr().String()
}
