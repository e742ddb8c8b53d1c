package runtime

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"

	"cellvisor/internal/atomicfile"
	"cellvisor/internal/sysfile"
)

// ensureSecret creates a 256-bit random secret, hex-encoded, mode 0600, once.
func ensureSecret(path string) error {
	if st, err := os.Stat(path); err == nil {
		if st.Mode().Perm() != 0o600 {
			return os.Chmod(path, 0o600)
		}
		return nil
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), 0o600)
}

// Secret reads the slot's private-endpoint secret.
func (s Slot) Secret() ([]byte, error) {
	b, err := sysfile.ReadFile(s.SecretFile(), maxStateFile)
	if err != nil {
		return nil, fmt.Errorf("read secret of %s: %w", s.Name, err)
	}
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b, nil
}

// Drained reports the slot's persisted drained state.
func (s Slot) Drained() bool {
	_, err := os.Stat(s.DrainedMarker())
	return err == nil
}

// SetDrained persists the slot's drained state and rewrites its keepalive
// include to match; the cell picks the include up on its next reload.
func SetDrained(s Slot, drained bool) error {
	if drained {
		if err := atomicfile.WriteFile(s.DrainedMarker(), []byte("drained\n"), 0o600); err != nil {
			return fmt.Errorf("mark %s drained: %w", s.Name, err)
		}
	} else if err := os.Remove(s.DrainedMarker()); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("mark %s undrained: %w", s.Name, err)
	}
	return WriteDrainConf(s, drained)
}

// WriteDrainConf writes the keepalive include: no keep-alive while drained,
// so that connections close after their current request.
func WriteDrainConf(s Slot, drained bool) error {
	return atomicfile.WriteFile(s.DrainConf(), drainConf(drained), 0o644)
}

// syncDrainConf makes the keepalive include follow the drained marker,
// writing it only when it says otherwise: an agent start rewrote and
// fsynced all of them, one after another (~70 ms for 8 slots on a busy
// disk), before any cell could start.
func syncDrainConf(s Slot) error {
	drained := s.Drained()
	if cur, err := sysfile.ReadFile(s.DrainConf(), maxStateFile); err == nil && bytes.Equal(cur, drainConf(drained)) {
		return nil
	}
	return WriteDrainConf(s, drained)
}

func drainConf(drained bool) []byte {
	if drained {
		return []byte("# written by cellvisor: drained\nkeepalive_timeout 0;\n")
	}
	return []byte("# written by cellvisor: serving\nkeepalive_timeout 75s;\n")
}
