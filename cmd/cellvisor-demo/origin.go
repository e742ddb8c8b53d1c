package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// The sample domain's /origin/ route goes to an origin on loopback given by
// name: the demo runs that origin and a DNS server that answers its name,
// and both agents' cells resolve it through that server
// (openresty.resolvers), as they would a customer's origin through the
// host's resolver.
const (
	originName  = "origin.demo.test"
	originRoute = "/origin/"
)

// originBody is what the demo's origin answers for path.
func originBody(path string) string {
	return fmt.Sprintf("hello from the origin %s, which the cell resolved by name: %s\n", originName, path)
}

// startOrigin serves the demo's origin on addr until stop.
func startOrigin(addr string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("the demo's origin on %s: %w", addr, err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, originBody(r.URL.Path))
	})}
	go srv.Serve(ln)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}

// startDNS answers originName with 127.0.0.1 (a 30 s TTL) on the UDP
// address addr until stop; any other name is NXDOMAIN.
func startDNS(addr string) (stop func(), err error) {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("the demo's DNS server on %s: %w", addr, err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		switch {
		case len(q.Question) != 1 || !strings.EqualFold(strings.TrimSuffix(q.Question[0].Name, "."), originName):
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
				A: net.IPv4(127, 0, 0, 1)})
		}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	return func() { srv.Shutdown() }, nil
}
