package fleet

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/manifest"
)

// Names and reasons come from agents: the rendered pages carry them as
// text only, never as markup, and the silent edge stands out.
func TestFleetRenderingEscapesHostileText(t *testing.T) {
	const (
		script  = `<script>alert(1)</script>`
		img     = `"><img src=x onerror=alert(1)>`
		breakTd = `</td></tr></table><form action="https://evil.example/">`
	)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	seen := now.Add(-10 * time.Minute)
	long := strings.Repeat("x", 5000)
	edge := fleetEdge{
		EdgeView: adminapi.EdgeView{ID: `id" onclick="x`, Name: script, Org: img, Enrollment: adminapi.EnrollmentEnrolled, LastSeen: &seen, Sequence: 3, ActiveSequence: 2,
			Cells:   []adminapi.CellView{{Name: img, Pool: script, State: `ready" onmouseover="x`, Reason: breakTd + long, RuntimeVersion: script, RuntimeSuperseded: true}},
			Runtime: &adminapi.RuntimeView{Version: img, Superseded: 1, Upgrade: script, Reason: breakTd + long},
			Acks:    []manifest.Ack{{Sequence: 3, Status: manifest.AckRefused, Reason: script}},
			Tasks:   []adminapi.TaskView{{ID: 1, Cell: img, Action: "drain", State: "done", Result: breakTd}},
		},
		Silent: true, Ago: "10m ago", Lagging: true,
	}
	edge.Shown = edge.Cells
	pages := map[string]any{
		"fleet": fleetPage{Now: now, SilentAfter: SilentAfter, Total: 1, Silent: 1, Edges: []fleetEdge{edge},
			FailingMoves: []adminapi.MoveView{{Domain: script, From: img, To: "b", State: adminapi.MoveFailed, Reason: breakTd}},
			Refusals:     []Refusal{{EdgeID: "e1", EdgeName: img, Ack: manifest.Ack{Sequence: 3, Status: manifest.AckRefused, Reason: script + long}}},
			Runtimes: Runtimes{Versions: []RuntimeVersion{{Version: script, Edges: 1, Cells: 1}},
				Superseded: []SupersededEdge{{EdgeID: img, EdgeName: script, Cells: 1, Current: img, Upgrade: script, Reason: breakTd + long}}, SupersededTotal: 1}},
		"edge": edgePage{Now: now, SilentAfter: SilentAfter, Edge: edge, Assigned: []assignedCell{{Name: "cell-01", Pool: script, Cell: &edge.Cells[0]}}},
	}
	for name, data := range pages {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := templates.ExecuteTemplate(&buf, name, data); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			for _, bad := range []string{"<script", "<img", `onmouseover="x`, `onclick="x`, "evil.example/\">", "</td></tr></table><form"} {
				if strings.Contains(out, bad) {
					t.Errorf("page contains %q unescaped", bad)
				}
			}
			for _, want := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;", "⚠ SILENT", "behind"} {
				if !strings.Contains(out, want) {
					t.Errorf("page lacks %q", want)
				}
			}
			if strings.Contains(out, strings.Repeat("x", 301)) || !strings.Contains(out, strings.Repeat("x", 100)+"…") {
				t.Error("a 5000-character reason is not clipped to 300")
			}
			if strings.Count(out, "<form") != 1 { // sign out only
				t.Errorf("%d forms on the page, want the sign-out one only", strings.Count(out, "<form"))
			}
		})
	}
	var buf bytes.Buffer
	if err := templates.ExecuteTemplate(&buf, "fleet", pages["fleet"]); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `<tr class="edge silent"`) {
		t.Error("the silent edge's row has no silent class")
	}
	if !strings.Contains(buf.String(), `<section id="egress">`+"\n<h2>Egress holders</h2>\n"+`<p class="none">none</p>`) {
		t.Error("the egress section does not say none")
	}
}

func TestStateClassIsAFixedSet(t *testing.T) {
	for _, tc := range []struct {
		state   string
		drained bool
		want    string
	}{
		{"ready", false, "state-ready"},
		{"ready", true, "state-drained"},
		{"drained", false, "state-drained"},
		{"degraded", false, "state-degraded"},
		{"stopped", false, "state-stopped"},
		{`ready x" y`, false, "state-other"},
	} {
		if got := stateClass(tc.state, tc.drained); got != tc.want {
			t.Errorf("stateClass(%q, %v) = %q, want %q", tc.state, tc.drained, got, tc.want)
		}
	}
}

func TestSessionCookies(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := &Pages{o: Options{AdminToken: "test-admin-token-0123456789", Now: func() time.Time { return now }}}
	v, err := s.newSession(now.Add(SessionTTL))
	if err != nil {
		t.Fatal(err)
	}
	other := &Pages{o: Options{AdminToken: "another-admin-token-0123456789", Now: s.o.Now}}
	exp, rest, _ := strings.Cut(v, ".")
	for _, tc := range []struct {
		name  string
		srv   *Pages
		value string
		want  bool
	}{
		{"valid", s, v, true},
		{"another admin token", other, v, false},
		{"expiry moved", s, "9" + exp + "." + rest, false},
		{"mac cut", s, v[:len(v)-1], false},
		{"empty", s, "", false},
		{"no dots", s, "abc", false},
		{"huge", s, strings.Repeat("a", 1<<20), false},
	} {
		if got := tc.srv.validSession(tc.value); got != tc.want {
			t.Errorf("%s: valid = %v, want %v", tc.name, got, tc.want)
		}
	}
	now = now.Add(SessionTTL)
	if s.validSession(v) {
		t.Error("a session is valid at its expiry")
	}
}

// The egress section shows each holder with its edge, region, epoch and
// expiry, escaped, and says when it shows only part of them.
func TestFleetRenderingShowsHolders(t *testing.T) {
	until := time.Date(2026, 1, 2, 3, 6, 0, 0, time.UTC)
	p := fleetPage{Now: until, SilentAfter: SilentAfter, EgressTotal: 3, Egress: []EgressHolder{
		{Org: "acme", Class: "metering", EdgeID: "id-1", EdgeName: "eu-1", Region: "eu / eu-a", Epoch: 7, Until: until},
		{Org: `<b>x</b>`, Class: "siem_forwarding", EdgeID: "id-2", Epoch: 1, Until: until},
	}}
	var buf bytes.Buffer
	if err := templates.ExecuteTemplate(&buf, "fleet", p); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		`<tr class="holder" data-scope="acme/metering"><td>acme</td><td>metering</td><td><a href="/fleet/edges/id-1">eu-1</a></td><td>eu / eu-a</td><td>7</td><td>2026-01-02T03:06:00Z</td></tr>`,
		// A holder since deleted has no name: its id stands in.
		`<td>&lt;b&gt;x&lt;/b&gt;</td><td>siem_forwarding</td><td><a href="/fleet/edges/id-2">id-2</a></td>`,
		`2 of 3 shown`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if strings.Contains(out, "<b>x") {
		t.Error("an org name is not escaped")
	}
}

// The edge page says whether the edge's HTTPS keys are sealed to it or
// withheld.
func TestEdgePageShowsHTTPSKeys(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		view adminapi.EdgeView
		want string
	}{
		{adminapi.EdgeView{Name: "a", EncryptionKeyID: strings.Repeat("ab", 32)}, "sealed to key <code>abababababababab</code>"},
		{adminapi.EdgeView{Name: "b", HTTPSKeys: "withheld: the edge has registered no encryption key"}, "withheld: the edge has registered no encryption key"},
		{adminapi.EdgeView{Name: "c", Certificates: []adminapi.CellCertificates{{Cell: "cell-01", Count: 3, SoonestDomain: "<b>soon.test",
			SoonestExpiry: now.Add(72 * time.Hour)}}}, "<td>cell-01</td><td>3</td><td>&lt;b&gt;soon.test</td><td>2026-01-05T03:04:05Z</td>"},
	} {
		var buf bytes.Buffer
		if err := templates.ExecuteTemplate(&buf, "edge", edgePage{Now: now, SilentAfter: SilentAfter, Edge: fleetEdge{EdgeView: tc.view}}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("edge %s page lacks %q", tc.view.Name, tc.want)
		}
	}
}
