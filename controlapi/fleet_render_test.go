package controlapi

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi/store"
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
		EdgeView: EdgeView{ID: `id" onclick="x`, Name: script, Org: img, Enrollment: EnrollmentEnrolled, LastSeen: &seen, Sequence: 3, ActiveSequence: 2,
			Cells: []CellView{{Name: img, Pool: script, State: `ready" onmouseover="x`, Reason: breakTd + long}},
			Acks:  []manifest.Ack{{Sequence: 3, Status: manifest.AckRefused, Reason: script}},
			Tasks: []TaskView{{ID: 1, Cell: img, Action: "drain", State: "done", Result: breakTd}},
		},
		Silent: true, Ago: "10m ago", Lagging: true,
	}
	edge.Shown = edge.Cells
	pages := map[string]any{
		"fleet": fleetPage{Now: now, SilentAfter: SilentAfter, Total: 1, Silent: 1, Edges: []fleetEdge{edge},
			FailingMoves: []MoveView{{Domain: script, From: img, To: "b", State: store.MoveFailed, Reason: breakTd}},
			Refusals:     []store.EdgeAck{{EdgeID: "e1", EdgeName: img, Ack: manifest.Ack{Sequence: 3, Status: manifest.AckRefused, Reason: script + long}}}},
		"edge": edgePage{Now: now, SilentAfter: SilentAfter, Edge: edge, Assigned: []assignedCell{{Name: "cell-01", Pool: script, Cell: &edge.Cells[0]}}},
	}
	for name, data := range pages {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := fleetTemplates.ExecuteTemplate(&buf, name, data); err != nil {
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
	if err := fleetTemplates.ExecuteTemplate(&buf, "fleet", pages["fleet"]); err != nil {
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
	s := &Server{o: Options{AdminToken: "test-admin-token-0123456789", Now: func() time.Time { return now }}}
	v, err := s.newSession(now.Add(SessionTTL))
	if err != nil {
		t.Fatal(err)
	}
	other := &Server{o: Options{AdminToken: "another-admin-token-0123456789", Now: s.o.Now}}
	exp, rest, _ := strings.Cut(v, ".")
	for _, tc := range []struct {
		name  string
		srv   *Server
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
