package main

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cellvisor/controlapi/adminapi"
	"cellvisor/internal/testcert"
)

func TestCert(t *testing.T) {
	ep := startControl(t)
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := testcert.New(t, testcert.Options{Names: []string{"shop.example.test", "*.shop.example.test"}})
	weak := testcert.New(t, testcert.Options{Names: []string{"shop.example.test"}, Key: "rsa-1024"})
	chain, key := write("chain.pem", c.PEM()), write("key.pem", c.Key)
	body := strings.Split(string(c.Key), "\n")[1]
	var outs []string
	add := func(args ...string) string {
		out := mustCtl(t, ep, append([]string{"cert"}, args...)...)
		outs = append(outs, out)
		return out
	}

	e := createEdge(t, ep, "fra-1")
	if out := mustCtl(t, ep, "edge", "show", e.Edge.ID); !strings.Contains(out, "https keys: withheld: the edge has registered no encryption key") {
		t.Fatalf("edge show of an edge with no encryption key:\n%s", out)
	}
	_, err := ctl(t, ep, "cert", "add", "shop", "--cert", write("weak.pem", weak.PEM()), "--key", write("weak-key.pem", weak.Key))
	var ae *adminapi.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "key type: RSA 1024 bits") {
		t.Fatalf("RSA 1024: %v", err)
	}
	if _, err := ctl(t, ep, "cert", "add", "shop", "--cert", chain); err == nil || !strings.Contains(err.Error(), "--key") {
		t.Fatalf("no --key: %v", err)
	}
	text := add("add", "shop", "--cert", chain, "--key", key)
	if !strings.Contains(text, "certificate shop\n") || !strings.Contains(text, "fingerprint") || !strings.Contains(text, "*.shop.example.test") ||
		!strings.Contains(text, "days left") {
		t.Fatalf("cert add printed:\n%s", text)
	}
	cfg := write("shop.json", []byte(`{"hostnames":["shop.example.test"],"routes":[{"prefix":"/","respond":{"status":200}}],"tls":{"certificate":"shop"}}`))
	mustCtl(t, ep, "domain", "publish", "shop.example.test", "--pool", "shared-default", "--file", cfg)
	if out := add("list"); !strings.Contains(out, "shop") || !strings.Contains(out, "shop.example.test") {
		t.Fatalf("cert list:\n%s", out)
	}
	if out := add("show", "shop", "-o", "json"); !strings.Contains(out, `"used_by"`) {
		t.Fatalf("cert show:\n%s", out)
	}
	_, err = ctl(t, ep, "cert", "delete", "shop")
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, "used by shop.example.test") {
		t.Fatalf("delete while used: %v", err)
	}
	if out := add("add", "shop", "--cert", chain, "--key", key, "--replace"); !strings.Contains(out, "republished  shop.example.test at revision 2") {
		t.Fatalf("cert add --replace printed:\n%s", out)
	}
	mustCtl(t, ep, "domain", "delete", "shop.example.test")
	if out := add("delete", "shop"); out != "deleted certificate shop\n" {
		t.Fatalf("cert delete printed %q", out)
	}
	for _, out := range outs {
		if strings.Contains(out, body) {
			t.Fatalf("the CLI printed the private key:\n%s", out)
		}
	}
}
