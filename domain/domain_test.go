package domain

import (
	"errors"
	"strings"
	"testing"
)

const goodDomain = `{"domain":"shop.example.com","pool":"shared-default","revision":3,
 "hostnames":["shop.example.com","*.shop.example.com"],
 "origins":[{"name":"app","url":"http://127.0.0.1:9000"}],
 "routes":[{"prefix":"/","origin":"app"},{"prefix":"/health","respond":{"status":200,"body":"ok"}}],
 "cache":{"ttl_seconds":60}}`

func TestDecodeDomain(t *testing.T) {
	d, err := Decode([]byte(goodDomain))
	if err != nil {
		t.Fatal(err)
	}
	if d.Revision != 3 || len(d.Hostnames) != 2 || d.Routes[1].Respond.Body != "ok" {
		t.Errorf("decoded %+v", d)
	}
	bad := map[string]string{
		"unknown field":      strings.Replace(goodDomain, `"revision"`, `"rev":1,"revision"`, 1),
		"truncated":          goodDomain[:40],
		"trailing data":      goodDomain + "{}",
		"upper-case host":    strings.Replace(goodDomain, `"shop.example.com","*`, `"Shop.example.com","*`, 1),
		"unknown pool":       strings.Replace(goodDomain, "shared-default", "premium", 1),
		"zero revision":      strings.Replace(goodDomain, `"revision":3`, `"revision":0`, 1),
		"unknown origin":     strings.Replace(goodDomain, `"origin":"app"`, `"origin":"db"`, 1),
		"origin with path":   strings.Replace(goodDomain, `:9000"`, `:9000/x"`, 1),
		"relative prefix":    strings.Replace(goodDomain, `"prefix":"/health"`, `"prefix":"health"`, 1),
		"bad status":         strings.Replace(goodDomain, `"status":200`, `"status":42`, 1),
		"wildcard as domain": strings.Replace(goodDomain, `"domain":"shop.example.com"`, `"domain":"*.example.com"`, 1),
	}
	for name, doc := range bad {
		if _, err := Decode([]byte(doc)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
}

func TestValidHostname(t *testing.T) {
	for h, want := range map[string]bool{
		"example.com": true, "a.b-c.d1": true, "*.example.com": true, "x": true, "xn--bcher-kva.example": true,
		strings.Repeat("a", 63) + ".com": true, strings.Repeat("a", 64) + ".com": false,
		"": false, "Example.com": false, "a..b": false, ".a": false, "a.": false, "-a.com": false, "a-.com": false,
		"a.-b": false, "*.": false, "a.*.b": false, "*": false, "a_b.com": false, "a b": false,
		strings.Repeat("a.", 126) + "aa": false,
	} {
		if got := ValidHostname(h); got != want {
			t.Errorf("ValidHostname(%q) = %v, want %v", h, got, want)
		}
	}
}
