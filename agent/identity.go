package agent

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"

	"cellvisor/controlclient"
)

// Identity is what an enrolled edge knows about itself and its control
// plane: its id and the control plane's signing key, pinned at enrollment.
type Identity = controlclient.Identity

// LoadIdentity reads and checks an identity file.
func LoadIdentity(path string) (Identity, ed25519.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Identity{}, nil, fmt.Errorf("identity: %w (enroll this edge first)", err)
	}
	var id Identity
	if err := json.Unmarshal(data, &id); err != nil {
		return Identity{}, nil, fmt.Errorf("identity %s: %w", path, err)
	}
	key, err := base64.StdEncoding.DecodeString(id.ControlPublicKey)
	if err != nil || len(key) != ed25519.PublicKeySize || id.EdgeID == "" {
		return Identity{}, nil, fmt.Errorf("identity %s: needs an edge_id and a %d-byte base64 control_public_key", path, ed25519.PublicKeySize)
	}
	return id, ed25519.PublicKey(key), nil
}
