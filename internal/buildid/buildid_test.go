package buildid

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestSelfIsTheGoToolsBuildID(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to compare with:", err)
	}
	out, err := exec.Command(gotool, "tool", "buildid", os.Args[0]).Output()
	if err != nil {
		t.Skip("go tool buildid:", err)
	}
	want := strings.TrimSpace(string(out))
	if got := Self(); got == "" || got != want {
		t.Fatalf("Self() = %q, want %q", got, want)
	}
}

func TestFromELFRefusesWhatIsNotANote(t *testing.T) {
	head, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Skip(err)
	}
	head = head[:4096]
	for name, b := range map[string][]byte{
		"empty":      nil,
		"not ELF":    []byte(strings.Repeat("x", 4096)),
		"cut short":  head[:100],
		"32-bit":     append([]byte{0x7f, 'E', 'L', 'F', 1}, head[5:]...),
		"big-endian": append([]byte{0x7f, 'E', 'L', 'F', 2, 2}, head[6:]...),
	} {
		if id := FromELF(b); id != "" {
			t.Errorf("%s: %q", name, id)
		}
	}
	if FromELF(head) == "" {
		t.Error("no ID in this binary's own first page")
	}
}
