package domain

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"cellvisor/internal/testcert"
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
		"unknown field":              strings.Replace(goodDomain, `"revision"`, `"rev":1,"revision"`, 1),
		"truncated":                  goodDomain[:40],
		"trailing data":              goodDomain + "{}",
		"upper-case host":            strings.Replace(goodDomain, `"shop.example.com","*`, `"Shop.example.com","*`, 1),
		"unknown pool":               strings.Replace(goodDomain, "shared-default", "premium", 1),
		"zero revision":              strings.Replace(goodDomain, `"revision":3`, `"revision":0`, 1),
		"unknown origin":             strings.Replace(goodDomain, `"origin":"app"`, `"origin":"db"`, 1),
		"origin with path":           strings.Replace(goodDomain, `:9000"`, `:9000/x"`, 1),
		"relative prefix":            strings.Replace(goodDomain, `"prefix":"/health"`, `"prefix":"health"`, 1),
		"bad status":                 strings.Replace(goodDomain, `"status":200`, `"status":42`, 1),
		"wildcard as domain":         strings.Replace(goodDomain, `"domain":"shop.example.com"`, `"domain":"*.example.com"`, 1),
		"revision past 2^53-1":       strings.Replace(goodDomain, `"revision":3`, `"revision":9007199254740992`, 1),
		"origin with user-info":      strings.Replace(goodDomain, `http://127.0.0.1:9000`, `http://user:secret@127.0.0.1:9000`, 1),
		"origin with fragment":       strings.Replace(goodDomain, `http://127.0.0.1:9000`, `http://127.0.0.1:9000#x`, 1),
		"origin with empty fragment": strings.Replace(goodDomain, `http://127.0.0.1:9000`, `http://127.0.0.1:9000#`, 1),
		"origin with query":          strings.Replace(goodDomain, `http://127.0.0.1:9000`, `http://127.0.0.1:9000?a=b`, 1),
		"origin name with space":     strings.Replace(goodDomain, `"name":"app"`, `"name":"my app"`, 1),
		"content type with CR LF":    strings.Replace(goodDomain, `"body":"ok"`, `"body":"ok","content_type":"text/plain\r\nSet-Cookie: x=1"`, 1),
		"content type with NUL":      strings.Replace(goodDomain, `"body":"ok"`, `"body":"ok","content_type":"text/plain\u0000"`, 1),
		"content type too long":      strings.Replace(goodDomain, `"body":"ok"`, `"body":"ok","content_type":"`+strings.Repeat("a", MaxContentType+1)+`"`, 1),
		"prefix with newline":        strings.Replace(goodDomain, `"prefix":"/health"`, `"prefix":"/health\n"`, 1),
		"hostname listed twice":      strings.Replace(goodDomain, `"*.shop.example.com"`, `"shop.example.com"`, 1),
		"101 hostnames":              strings.Replace(goodDomain, `"*.shop.example.com"`, manyHostnames(100), 1),
		"257 routes":                 strings.Replace(goodDomain, `{"prefix":"/","origin":"app"}`, manyRoutes(256), 1),
	}
	for name, doc := range bad {
		if _, err := Decode([]byte(doc)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
	// At the bounds, not past them: accepted.
	for name, doc := range map[string]string{
		"100 hostnames":        strings.Replace(goodDomain, `"*.shop.example.com"`, manyHostnames(99), 1),
		"256 routes":           strings.Replace(goodDomain, `{"prefix":"/","origin":"app"}`, manyRoutes(255), 1),
		"revision 2^53-1":      strings.Replace(goodDomain, `"revision":3`, `"revision":9007199254740991`, 1),
		"content type charset": strings.Replace(goodDomain, `"body":"ok"`, `"body":"ok","content_type":"text/html; charset=utf-8"`, 1),
		"https origin on port": strings.Replace(goodDomain, `http://127.0.0.1:9000`, `https://origin.example.com:8443`, 1),
	} {
		if _, err := Decode([]byte(doc)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestRefusalNamesTheRule: an operator reading the refusal learns the rule.
func TestRefusalNamesTheRule(t *testing.T) {
	for doc, want := range map[string]string{
		strings.Replace(goodDomain, `http://127.0.0.1:9000`, `http://u:p@127.0.0.1:9000`, 1): "no user-info",
		strings.Replace(goodDomain, `"*.shop.example.com"`, manyHostnames(100), 1):           "at most 100",
		strings.Replace(goodDomain, `"body":"ok"`, `"body":"ok","content_type":"a\tb"`, 1):   "printable ASCII",
	} {
		_, err := Decode([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err %v, want it to say %q", err, want)
		}
	}
}

// manyHostnames is n distinct hostnames as JSON strings, comma-separated.
func manyHostnames(n int) string {
	hs := make([]string, n)
	for i := range hs {
		hs[i] = fmt.Sprintf("%q", fmt.Sprintf("h%d.shop.example.com", i))
	}
	return strings.Join(hs, ",")
}

// manyRoutes is n respond routes as JSON objects, comma-separated.
func manyRoutes(n int) string {
	rs := make([]string, n)
	for i := range rs {
		rs[i] = fmt.Sprintf(`{"prefix":"/r%d","respond":{"status":200,"body":""}}`, i)
	}
	return strings.Join(rs, ",")
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

// Pool names are held to the control plane's rule at the edge too: a
// class prefix and nothing special to Lua, nginx or a path.
func TestPoolClassHoldsTheControlPlanesRule(t *testing.T) {
	for _, tc := range []struct {
		name  string
		class string
	}{
		{"shared-default", ClassShared},
		{"quarantine", ClassQuarantine},
		{"reserved-eu.west-1", ClassReserved},
		{"shared-x\", os.exit(1) --", ""},
		{"shared-../../etc", ""},
		{"shared-a/b", ""},
		{"shared-Upper", ""},
		{"shared-", ""},
		{"shared-a.", ""},
		{"shared-" + strings.Repeat("a", MaxPoolName-6), ""},
		{"premium-x", ""},
	} {
		got, ok := PoolClass(tc.name)
		if got != tc.class || ok != (tc.class != "") {
			t.Errorf("PoolClass(%q) = %q, %v; want %q", tc.name, got, ok, tc.class)
		}
	}
}

// The origin settings, per-domain options and cache cookies each refuse
// what the cells could not serve as asked, naming the rule; at their
// bounds they are accepted.
func TestOriginAndOptionRefusals(t *testing.T) {
	origin := func(o string) string {
		return strings.Replace(goodDomain, `{"name":"app","url":"http://127.0.0.1:9000"}`, o, 1)
	}
	for name, c := range map[string]struct{ doc, rule string }{
		"url and servers":       {origin(`{"name":"app","url":"http://127.0.0.1:9000","servers":[{"url":"http://127.0.0.1:9001"}]}`), "exactly one of url and servers"},
		"neither":               {origin(`{"name":"app"}`), "exactly one of url and servers"},
		"17 servers":            {origin(`{"name":"app","servers":[` + manyServers(17) + `]}`), "at most 16"},
		"two schemes":           {origin(`{"name":"app","servers":[{"url":"http://127.0.0.1:9000"},{"url":"https://127.0.0.1:9001"}]}`), "one scheme for all"},
		"server twice":          {origin(`{"name":"app","servers":[{"url":"http://127.0.0.1:9000"},{"url":"http://127.0.0.1:9000"}]}`), "twice"},
		"weight 101":            {origin(`{"name":"app","servers":[{"url":"http://127.0.0.1:9000","weight":101}]}`), "weight"},
		"host not a name":       {origin(`{"name":"app","url":"http://app_server:9000"}`), "neither an IP address nor a DNS name"},
		"upper-case host":       {origin(`{"name":"app","url":"http://App.example.com"}`), "neither an IP address nor a DNS name"},
		"port 0":                {origin(`{"name":"app","url":"http://127.0.0.1:0"}`), "port must be 1–65535"},
		"sni on http":           {origin(`{"name":"app","url":"http://127.0.0.1:9000","sni":"a.example"}`), "for https origins"},
		"tls_verify on http":    {origin(`{"name":"app","url":"http://127.0.0.1:9000","tls_verify":false}`), "for https origins"},
		"sni not a name":        {origin(`{"name":"app","url":"https://127.0.0.1:9000","sni":"a b"}`), "must be a DNS name"},
		"connect 50 ms":         {origin(`{"name":"app","url":"http://127.0.0.1:9000","timeouts":{"connect_ms":50}}`), "timeouts.connect_ms must be 100–60000"},
		"read 601 s":            {origin(`{"name":"app","url":"http://127.0.0.1:9000","timeouts":{"read_ms":601000}}`), "timeouts.read_ms must be 100–600000"},
		"cookie name with =":    {strings.Replace(goodDomain, `"revision":3`, `"revision":3,"cache":{"ttl_seconds":60,"ignore_cookies":["a=b"]}`, 1), "is not a cookie name"},
		"33 cookies to ignore":  {strings.Replace(goodDomain, `"revision":3`, `"revision":3,"cache":{"ttl_seconds":60,"ignore_cookies":[`+manyCookies(33)+`]}`, 1), "at most 32"},
		"an unknown option key": {strings.Replace(goodDomain, `"revision":3`, `"revision":3,"trust_proxies":true`, 1), "unknown field"},
		"ca on http":            {origin(`{"name":"app","url":"http://127.0.0.1:9000","ca":` + caJSON + `}`), "for https origins"},
		"ca, no verify":         {origin(`{"name":"app","url":"https://127.0.0.1:9000","tls_verify":false,"ca":` + caJSON + `}`), "verifies nothing"},
		"ca not PEM":            {origin(`{"name":"app","url":"https://127.0.0.1:9000","ca":"not a certificate"}`), "no PEM certificate"},
		"ca with a key":         {origin(`{"name":"app","url":"https://127.0.0.1:9000","ca":` + jsonString(pemBlock("PRIVATE KEY", []byte("k"))) + `}`), "want only CERTIFICATE blocks"},
		"ca not parsed":         {origin(`{"name":"app","url":"https://127.0.0.1:9000","ca":` + jsonString(pemBlock("CERTIFICATE", []byte("not DER"))) + `}`), "certificate 1:"},
		"ca then text":          {origin(`{"name":"app","url":"https://127.0.0.1:9000","ca":` + jsonString(testCA+"trailing words") + `}`), "not a PEM certificate"},
		"ca over 64 KiB":        {origin(`{"name":"app","url":"https://127.0.0.1:9000","ca":` + jsonString(strings.Repeat(testCA, MaxOriginCA/len(testCA)+1)) + `}`), "at most 65536"},
		"ca of 101":             {origin(`{"name":"app","url":"https://127.0.0.1:9000","ca":` + jsonString(strings.Repeat(smallCA, 101)) + `}`), "at most 100"},
	} {
		_, err := Decode([]byte(c.doc))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.rule) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", name, err, c.rule)
		}
	}
	for name, doc := range map[string]string{
		"16 servers, weights":   origin(`{"name":"app","servers":[` + manyServers(16) + `]}`),
		"https with its own ca": origin(`{"name":"app","url":"https://127.0.0.1:9000","ca":` + jsonString(strings.Repeat(smallCA, 100)) + `}`),
		"https, sni, no verify": origin(`{"name":"app","url":"https://[::1]:8443","sni":"origin.example.com","tls_verify":false,"timeouts":{"connect_ms":100,"send_ms":600000,"read_ms":600000}}`),
		"options":               strings.Replace(goodDomain, `"revision":3`, `"revision":3,"trust_forwarded":true,"case_insensitive":true,"raw_path":true,"cache":{"ttl_seconds":60,"ignore_cookies":["consent","_ga"]}`, 1),
	} {
		if _, err := Decode([]byte(doc)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// manyServers is n servers of one origin, on ports 9000 on, weights 1–100.
func manyServers(n int) string {
	ss := make([]string, n)
	for i := range ss {
		ss[i] = fmt.Sprintf(`{"url":"http://127.0.0.1:%d","weight":%d}`, 9000+i, 1+i*99/max(n-1, 1))
	}
	return strings.Join(ss, ",")
}

// manyCookies is n cookie names as JSON strings, comma-separated.
func manyCookies(n int) string {
	cs := make([]string, n)
	for i := range cs {
		cs[i] = fmt.Sprintf(`"c%d"`, i)
	}
	return strings.Join(cs, ",")
}

// A domain's tls and an origin's health check refuse what the cells could
// not serve, naming the rule; at their bounds they are accepted.
func TestTLSAndHealthCheckRefusals(t *testing.T) {
	chain := string(testcert.New(t, testcert.Options{Names: []string{"a.example"}}).Leaf)
	fp, err := ChainFingerprint(chain)
	if err != nil {
		t.Fatal(err)
	}
	withTLS := func(tl string) string {
		return strings.Replace(goodDomain, `"revision":3`, `"revision":3,"tls":`+tl, 1)
	}
	check := func(hc string) string {
		return strings.Replace(goodDomain, `{"name":"app","url":"http://127.0.0.1:9000"}`, `{"name":"app","url":"http://127.0.0.1:9000","health_check":`+hc+`}`, 1)
	}
	quoted, _ := json.Marshal(chain)
	for name, c := range map[string]struct{ doc, rule string }{
		"both":              {withTLS(`{"certificate":"c","acme":true}`), "certificate and acme are exclusive"},
		"neither":           {withTLS(`{"redirect_http":true}`), "name a certificate or set acme"},
		"bad name":          {withTLS(`{"certificate":"a.b"}`), "must be 1–64 of lowercase"},
		"hsts too long":     {withTLS(`{"acme":true,"hsts":{"max_age_seconds":63072001}}`), "max_age_seconds must be 0–63072000"},
		"chain alone":       {withTLS(`{"certificate":"c","chain":` + string(quoted) + `}`), "chain and fingerprint come together"},
		"wrong fingerprint": {withTLS(`{"certificate":"c","chain":` + string(quoted) + `,"fingerprint":"` + strings.Repeat("0", 64) + `"}`), "is not the chain's leaf"},
		"not a chain":       {withTLS(`{"certificate":"c","chain":"junk","fingerprint":"` + fp + `"}`), "not a PEM certificate chain"},
		"key in the chain":  {withTLS(`{"certificate":"c","chain":"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n","fingerprint":"` + fp + `"}`), "only certificates"},
		"bad token":         {withTLS(`{"acme":true,"acme_challenges":[{"token":"a/b","key_authorization":"a/b.x"}]}`), "base64url"},
		"foreign key auth":  {withTLS(`{"acme":true,"acme_challenges":[{"token":"tok","key_authorization":"other.x"}]}`), "token.thumbprint"},
		"check path":        {check(`{"path":"healthz"}`), "health_check.path must start with /"},
		"check interval 1":  {check(`{"path":"/h","interval_seconds":1}`), "interval_seconds must be 2–300"},
		"check timeout 20s": {check(`{"path":"/h","timeout_ms":20000}`), "timeout_ms must be 100–10000"},
	} {
		_, err := Decode([]byte(c.doc))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.rule) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", name, err, c.rule)
		}
	}
	for name, doc := range map[string]string{
		"certificate with its chain": withTLS(`{"certificate":"c","chain":` + string(quoted) + `,"fingerprint":"` + fp + `","redirect_http":true,"hsts":{"max_age_seconds":63072000,"include_subdomains":true,"preload":true}}`),
		"acme with a challenge":      withTLS(`{"acme":true,"acme_challenges":[{"token":"tok-1_A","key_authorization":"tok-1_A.thumb"}]}`),
		"check at its bounds":        check(`{"path":"/h?x=1","interval_seconds":300,"timeout_ms":10000}`),
	} {
		if _, err := Decode([]byte(doc)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// testCA and smallCA are PEM certificates for origins' CA bundles
// (self-signed; smallCA's key is an ECDSA one, to make 100 of them fit the
// bound), caJSON testCA as a JSON string.
var testCA, smallCA, caJSON = func() (string, string, string) {
	mk := func(key crypto.Signer) string {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "origin CA"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
		if err != nil {
			panic(err)
		}
		return pemBlock("CERTIFICATE", der)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	ca := mk(rk)
	return ca, mk(ek), jsonString(ca)
}()

func pemBlock(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
