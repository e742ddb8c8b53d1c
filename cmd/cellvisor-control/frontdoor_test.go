package main

import (
	"strings"
	"testing"

	"cellvisor/controlapi/adminapi"
	"cellvisor/internal/cli"
)

func TestFrontDoorCommands(t *testing.T) {
	ep := startControl(t)
	a, b := createEdge(t, ep, "fra-1"), createEdge(t, ep, "fra-2")
	out := mustCtl(t, ep, "frontdoor", "set", a.Edge.ID, "HTTPS://Shop.Example.COM./x")
	if want := "front door of edge " + a.Edge.ID + " (https): https://shop.example.com:443\n"; out != want {
		t.Fatalf("set printed %q, want %q", out, want)
	}
	if _, err := ctl(t, ep, "frontdoor", "set", b.Edge.ID, "https://shop.example.com"); err == nil || !strings.Contains(err.Error(), "holds it") {
		t.Fatalf("second edge: %v", err)
	}
	out = mustCtl(t, ep, "frontdoor", "resolve", "https://shop.example.com:443/cart")
	if want := "https://shop.example.com:443/cart -> edge " + a.Edge.ID + " (org acme, front door https://shop.example.com:443)\n"; out != want {
		t.Fatalf("resolve printed %q, want %q", out, want)
	}
	for u, reason := range map[string]string{"https://nobody.example.com": "unmapped", "gopher://shop.example.com": "malformed"} {
		if _, err := ctl(t, ep, "frontdoor", "resolve", u); err == nil || !strings.Contains(err.Error(), "refused ("+reason+")") {
			t.Errorf("resolve %s: %v, want refused (%s)", u, err, reason)
		}
	}
	// A refused URL's CR/LF reach the terminal escaped (main prints
	// errors through cli.Printable): no forged line of output.
	_, err := ctl(t, ep, "frontdoor", "resolve", "https://shop.example.com\r\nrefused (unmapped): forged")
	if err == nil {
		t.Fatal("a URL with CR/LF resolved")
	}
	if shown := cli.Printable(err.Error()); strings.ContainsAny(shown, "\r\n") || !strings.Contains(shown, `\r\n`) {
		t.Errorf("the refusal as printed: %q", shown)
	}
	list := decodeJSON[[]adminapi.FrontDoorView](t, mustCtl(t, ep, "frontdoor", "list", "-o", "json"))
	if len(list) != 1 || list[0].EdgeID != a.Edge.ID || list[0].URL != "https://shop.example.com:443" {
		t.Fatalf("list: %+v", list)
	}
	if table := mustCtl(t, ep, "frontdoor", "list", "--org", "acme"); !strings.Contains(table, "https://shop.example.com:443  "+a.Edge.ID) {
		t.Fatalf("list table:\n%s", table)
	}
	if out := mustCtl(t, ep, "frontdoor", "clear", a.Edge.ID); out != "front door of edge "+a.Edge.ID+" cleared\n" {
		t.Fatalf("clear printed %q", out)
	}
	if _, err := ctl(t, ep, "frontdoor", "resolve", "https://shop.example.com"); err == nil || !strings.Contains(err.Error(), "refused (unmapped)") {
		t.Fatalf("resolve after clear: %v", err)
	}
}
