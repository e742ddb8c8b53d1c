package certcheck

import (
	"errors"
	"strings"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/internal/testcert"
)

func TestCheck(t *testing.T) {
	now := time.Now()
	good := testcert.New(t, testcert.Options{Names: []string{"example.com", "*.example.com"}})
	other := testcert.New(t, testcert.Options{})
	for _, tc := range []struct {
		name       string
		chain, key []byte
		rule       string // "" for accepted
	}{
		{"ecdsa p-256", good.PEM(), good.Key, ""},
		{"leaf alone", good.Leaf, good.Key, ""},
		{"rsa 2048", nil, nil, ""},
		{"ed25519", nil, nil, ""},
		{"ecdsa p-384", nil, nil, ""},
		{"rsa 1024", nil, nil, "key type: RSA 1024 bits"},
		{"ecdsa p-521", nil, nil, "key type: ECDSA P-521"},
		{"wrong key", good.PEM(), other.Key, "key match"},
		{"out of order", append(append([]byte{}, good.Intermediate...), good.Leaf...), good.Key, "chain order: the key's certificate is number 2"},
		{"intermediate not the issuer", append(append([]byte{}, good.Leaf...), other.Intermediate...), good.Key, "chain order"},
		{"root after leaf", append(append([]byte{}, good.Leaf...), good.Root...), good.Key, "chain order"},
		{"expired", nil, nil, "validity: the leaf expired"},
		{"not yet valid", nil, nil, "validity: the leaf is not valid before"},
		{"key in the chain", append(good.PEM(), good.Key...), good.Key, "pem: the chain holds a \"PRIVATE KEY\" block"},
		{"not pem", []byte("hello"), good.Key, "pem: the chain is not PEM certificates"},
		{"key not pem", good.PEM(), []byte("hello"), "pem: the key is not a PEM private key"},
		{"chain too big", make([]byte, domain.MaxChainBytes+1), good.Key, "size"},
		{"key too big", good.PEM(), make([]byte, MaxKeyBytes+1), "size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.chain == nil {
				o := testcert.Options{}
				switch tc.name {
				case "rsa 2048":
					o.Key = "rsa-2048"
				case "rsa 1024":
					o.Key = "rsa-1024"
				case "ed25519":
					o.Key = "ed25519"
				case "ecdsa p-384":
					o.Key = "ecdsa-p384"
				case "ecdsa p-521":
					o.Key = "ecdsa-p521"
				case "expired":
					o.NotBefore, o.NotAfter = now.Add(-48*time.Hour), now.Add(-time.Hour)
				case "not yet valid":
					o.NotBefore, o.NotAfter = now.Add(time.Hour), now.Add(48*time.Hour)
				}
				c := testcert.New(t, o)
				tc.chain, tc.key = c.PEM(), c.Key
			}
			chain, info, err := Check(tc.chain, tc.key, now)
			if tc.rule == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				fp, ferr := domain.ChainFingerprint(chain)
				if ferr != nil || fp != info.Fingerprint || len(info.Names) == 0 || info.Issuer == "" {
					t.Fatalf("info %+v, chain fingerprint %s %v", info, fp, ferr)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.rule) {
				t.Fatalf("got %v, want a refusal naming %q", err, tc.rule)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY-----") {
				t.Fatal("the refusal quotes the key")
			}
		})
	}
}

func TestCovers(t *testing.T) {
	for _, tc := range []struct {
		names, hosts []string
		miss         string
	}{
		{[]string{"example.com"}, []string{"example.com"}, ""},
		{[]string{"*.example.com"}, []string{"a.example.com", "B.example.com"}, ""},
		{[]string{"*.example.com"}, []string{"example.com"}, "example.com"},
		{[]string{"*.example.com"}, []string{"a.b.example.com"}, "a.b.example.com"},
		{[]string{"*.example.com", "example.com"}, []string{"example.com", "www.example.com"}, ""},
		{[]string{"a.example.com"}, []string{"*.example.com"}, "*.example.com"},
		{[]string{"*.example.com"}, []string{"*.example.com"}, ""},
		{[]string{"example.com"}, []string{"example.com", "example.org"}, "example.org"},
	} {
		if got := Covers(tc.names, tc.hosts); got != tc.miss {
			t.Errorf("Covers(%q, %q) = %q, want %q", tc.names, tc.hosts, got, tc.miss)
		}
	}
}

func TestBoundsAreTheEdges(t *testing.T) {
	if MaxChainBytes != domain.MaxChainBytes || MaxChainCerts != domain.MaxChainCerts {
		t.Fatal("the upload's chain bounds differ from what an edge takes")
	}
}
