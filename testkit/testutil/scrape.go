package testutil

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Get GETs url (with a bearer token unless empty), bounded to 10 s, and
// returns the status code and the body; a request that fails fails the
// test.
func Get(t testing.TB, url, token string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// Scrape GETs a Prometheus endpoint (Get) and returns the body and its
// parsed families; any error, or an answer other than 200, fails the test.
func Scrape(t testing.TB, url, token string) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	code, body := Get(t, url, token)
	if code != http.StatusOK {
		t.Fatalf("scrape %s: HTTP %d\n%s", url, code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse scrape: %v\n%s", err, body)
	}
	return body, fams
}
