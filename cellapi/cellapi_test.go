package cellapi

import "testing"

func TestSummarize(t *testing.T) {
	tl := TLS{Certificates: map[string]Certificate{
		"b.test": {Fingerprint: "b", NotAfter: 200},
		"a.test": {Fingerprint: "a", NotAfter: 100},
		"c.test": {Fingerprint: "c", NotAfter: 100},
	}}
	tl.Summarize()
	if tl.Count != 3 || tl.Soonest == nil || tl.Soonest.Domain != "a.test" || tl.Soonest.NotAfter != 100 || tl.Certificates != nil {
		t.Errorf("summarized: %+v %+v", tl, tl.Soonest)
	}
	none := TLS{}
	none.Summarize()
	if none.Count != 0 || none.Soonest != nil {
		t.Errorf("no certificates: %+v", none)
	}
}
