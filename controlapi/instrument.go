package controlapi

import (
	"crypto/subtle"
	"net/http"
	"strings"
	"time"
)

// PathMetrics serves the Prometheus series on the admin listener, to the
// metrics token or the admin token.
const PathMetrics = "/metrics"

// instrument records every request h serves under the pattern mux matches
// it with (never the raw path: bounded labels), "unmatched" for none.
func (s *Server) instrument(listener string, mux *http.ServeMux, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		_, route := mux.Handler(r)
		if route == "" {
			route = "unmatched"
		}
		rec := &codeRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.code == 0 {
			rec.code = http.StatusOK
		}
		s.metrics.Request(listener, route, rec.code, time.Since(start)-rec.held)
	})
}

// codeRecorder keeps the status code written, and how long the handler
// held the request on purpose (a long poll's hold), which the request's
// duration leaves out.
type codeRecorder struct {
	http.ResponseWriter
	code int
	held time.Duration
}

// heldFor records that a request was held d on purpose.
func heldFor(w http.ResponseWriter, d time.Duration) {
	if c, ok := w.(*codeRecorder); ok {
		c.held += d
	}
}

func (c *codeRecorder) WriteHeader(code int) {
	if c.code == 0 {
		c.code = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *codeRecorder) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	return c.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (c *codeRecorder) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// bearer reports whether r carries token as its bearer token (never for
// an empty token).
func bearer(r *http.Request, token string) (given, ok bool) {
	got, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	given = found && got != ""
	return given, token != "" && found && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// metricsAllowed reports a request for /metrics with the metrics token.
func (s *Server) metricsAllowed(r *http.Request) bool {
	if r.URL.Path != PathMetrics {
		return false
	}
	_, ok := bearer(r, s.o.MetricsToken)
	return ok
}
