package controlapi_test

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/fleet"
	"cellvisor/manifest"
)

// fleetGet fetches a fleet page with the given header set and follows no
// redirect.
func fleetGet(t *testing.T, e *env, path string, set func(*http.Request)) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx(t), http.MethodGet, e.admin.URL+path, nil)
	if set != nil {
		set(req)
	}
	return fleetDo(t, req)
}

func fleetDo(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

func login(t *testing.T, e *env, token string, set func(*http.Request)) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, e.admin.URL+fleet.Login, strings.NewReader(url.Values{"token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if set != nil {
		set(req)
	}
	resp, _ := fleetDo(t, req)
	return resp
}

func withCookie(c *http.Cookie) func(*http.Request) { return func(r *http.Request) { r.AddCookie(c) } }

// An operator signs in with the admin token for a session cookie; nothing
// else opens the fleet page, and the cookie opens nothing but it.
func TestFleetPageSignIn(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	key := make([]byte, 32)
	rand.Read(key)
	e := serveWith(t, filepath.Join(t.TempDir(), "control.db"), key, func(o *controlapi.Options) { o.Now = func() time.Time { return time.Unix(0, now.Load()) } })
	e.createEdge(t, "fra-1")

	resp, _ := fleetGet(t, e, fleet.Path, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != fleet.Login {
		t.Fatalf("no session: %s to %q, want 303 to the sign-in form", resp.Status, resp.Header.Get("Location"))
	}
	resp, _ = fleetGet(t, e, fleet.Path, func(r *http.Request) { r.Header.Set("Authorization", "Bearer wrong-token-0123456789") })
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong bearer: %s", resp.Status)
	}
	resp, body := fleetGet(t, e, fleet.Path, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+e.admin.Token) })
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `data-edge="fra-1"`) {
		t.Fatalf("bearer: %s\n%s", resp.Status, body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("content security policy %q", csp)
	}

	if resp := login(t, e, "wrong-token-0123456789", nil); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Fatalf("wrong token: %s, cookies %v", resp.Status, resp.Cookies())
	}
	if resp := login(t, e, e.admin.Token, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }); resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
		t.Fatalf("cross-site sign-in: %s, cookies %v", resp.Status, resp.Cookies())
	}
	resp = login(t, e, e.admin.Token, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "same-origin") })
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("sign-in: %s, cookies %v", resp.Status, resp.Cookies())
	}
	c := resp.Cookies()[0]
	if c.Name != fleet.SessionCookie || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure || c.Path != fleet.Path ||
		c.MaxAge != int(fleet.SessionTTL/time.Second) {
		t.Fatalf("session cookie %+v", c)
	}
	if resp, body := fleetGet(t, e, fleet.Path, withCookie(c)); resp.StatusCode != http.StatusOK || !strings.Contains(body, `data-edge="fra-1"`) {
		t.Fatalf("with the session: %s", resp.Status)
	}
	// The session opens the fleet page only, not the admin API.
	if resp, _ := fleetGet(t, e, adminapi.PathEdges, withCookie(c)); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("admin API with the session cookie: %s", resp.Status)
	}
	forged := *c
	forged.Value = c.Value[:len(c.Value)-2] + "AA"
	if resp, _ := fleetGet(t, e, fleet.Path, withCookie(&forged)); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("forged cookie: %s", resp.Status)
	}
	now.Add(int64(fleet.SessionTTL))
	if resp, _ := fleetGet(t, e, fleet.Path, withCookie(c)); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("expired session: %s", resp.Status)
	}
}

// The page is bounded and paged, silent edges stand out and can be listed
// alone, and an edge's refusal shows with its (hostile) reason escaped.
func TestFleetPageContent(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		bearer := func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+e.admin.Token) }
		for i := range 5 {
			e.createEdge(t, fmt.Sprintf("edge-%d", i))
		}
		created := e.createEdge(t, "live")
		publish(t, e, "app.test", "v1")
		c, _, _ := e.enroll(t, created.Token)
		const hostile = `<script>alert("refused")</script>`
		if _, err := c.Page(ctx(t), 0, ""); err != nil {
			t.Fatal(err)
		}
		if err := c.Ack(ctx(t), manifest.Ack{Sequence: 1, Status: manifest.AckRefused, Reason: hostile, At: time.Now()}); err != nil {
			t.Fatal(err)
		}

		var seen []string
		next := fleet.Path + "?limit=2"
		for pages := 0; next != ""; pages++ {
			if pages > 3 {
				t.Fatal("more than 3 pages of 2 for 6 edges")
			}
			resp, body := fleetGet(t, e, next, bearer)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %s", next, resp.Status)
			}
			if n := strings.Count(body, `<tr class="edge`); n > 2 {
				t.Fatalf("%s: %d edges on a page of 2", next, n)
			}
			for _, line := range strings.Split(body, "\n") {
				if _, rest, ok := strings.Cut(line, `data-edge="`); ok {
					seen = append(seen, rest[:strings.IndexByte(rest, '"')])
				}
			}
			next = ""
			if _, rest, ok := strings.Cut(body, `<a id="next" href="`); ok {
				next = strings.ReplaceAll(rest[:strings.IndexByte(rest, '"')], "&amp;", "&")
			}
		}
		if got := strings.Join(seen, ","); got != "edge-0,edge-1,edge-2,edge-3,edge-4,live" {
			t.Fatalf("edges over the pages: %s", got)
		}

		resp, body := fleetGet(t, e, fleet.Path, bearer)
		if resp.StatusCode != http.StatusOK {
			t.Fatal(resp.Status)
		}
		if strings.Contains(body, "<script>") || !strings.Contains(body, "&lt;script&gt;alert(&#34;refused&#34;)&lt;/script&gt;") {
			t.Fatalf("the refusal's reason is not shown escaped:\n%s", body)
		}
		// Just seen: not silent. The pending edges are never silent.
		if strings.Contains(body, `class="edge silent"`) || !strings.Contains(body, `<span id="silent">0</span>`) {
			t.Fatalf("a silent edge right after its poll:\n%s", body)
		}
		if !strings.Contains(body, `<span id="total">6</span>`) {
			t.Fatal("total edges not 6")
		}

		// Three minutes on, the enrolled edge has gone silent.
		later := serveWith(t, e.dsn, e.sealKey, func(o *controlapi.Options) {
			o.Now = func() time.Time { return time.Now().Add(fleet.SilentAfter + time.Minute) }
		})
		_, body = fleetGet(t, later, fleet.Path, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+later.admin.Token) })
		if !strings.Contains(body, `<tr class="edge silent" data-edge="live">`) || !strings.Contains(body, "⚠ SILENT") || !strings.Contains(body, `<span id="silent">1</span>`) {
			t.Fatalf("the silent edge does not stand out:\n%s", body)
		}
		_, body = fleetGet(t, later, fleet.Path+"?silent=1", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+later.admin.Token) })
		if strings.Count(body, `<tr class="edge`) != 1 || !strings.Contains(body, `data-edge="live"`) {
			t.Fatalf("silent edges only:\n%s", body)
		}

		resp, body = fleetGet(t, e, fleet.Edges+"/"+created.Edge.ID, bearer)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `<tr data-cell="cell-01">`) || !strings.Contains(body, "shared-default") ||
			!strings.Contains(body, `<tr class="ack-refused">`) {
			t.Fatalf("edge page: %s\n%s", resp.Status, body)
		}
		if resp, _ := fleetGet(t, e, fleet.Edges+"/no-such-edge", bearer); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("unknown edge: %s", resp.Status)
		}
		if resp, _ := fleetGet(t, e, fleet.Path+"?limit=100000", bearer); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("limit 100000: %s", resp.Status)
		}
	})
}
