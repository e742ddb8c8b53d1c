package frontdoor

import "testing"

func TestNormalizeRefusesInvalidUTF8(t *testing.T) {
	// Not in the JSON fixture: JSON cannot carry invalid UTF-8.
	_, err := Normalize("https://shop\xff.example.com")
	if r, ok := IsRefusal(err); !ok || r != Malformed {
		t.Fatalf("normalize of invalid UTF-8 = %v, want a malformed refusal", err)
	}
}

func TestResolveNeverAnswersForMalformed(t *testing.T) {
	rows := []Row{{Edge: "edge-a", URL: "https://shop.example.com:443"}}
	for _, raw := range []string{"https://user@shop.example.com", "shop.example.com", "https://shop.example.com:99999"} {
		edge, err := Resolve(raw, rows)
		if r, _ := IsRefusal(err); edge != "" || r != Malformed {
			t.Errorf("resolve(%q) = %q, %v; want a malformed refusal", raw, edge, err)
		}
	}
}
