package domain

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkDecodeDomain decodes one ~2 KiB domain document.
func BenchmarkDecodeDomain(b *testing.B) {
	doc := []byte(fmt.Sprintf(`{"domain":"d1.example.com","pool":"shared-default","revision":1,"hostnames":["d1.example.com"],"routes":[{"prefix":"/","respond":{"status":200,"body":%q}}]}`, strings.Repeat("x", 1900)))
	b.SetBytes(int64(len(doc)))
	for b.Loop() {
		if _, err := Decode(doc); err != nil {
			b.Fatal(err)
		}
	}
}
