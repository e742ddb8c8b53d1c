package controlclient

import (
	"context"
	"crypto/ecdh"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"cellvisor/edgeapi"
	"cellvisor/internal/atomicfile"
	"cellvisor/tlsseal"
)

// Encryption key files in the identity directory: the X25519 key that
// certificates' keys are sealed to (0600), and the one an unfinished
// enrollment generated, so that a retry is an exact retry.
const (
	EncKeyFile    = "encryption-key.pem"
	pendingEncKey = "pending-encryption-key.pem"
)

// LoadEncryptionKey reads the edge's encryption key from the identity
// directory; an error wrapping os.ErrNotExist when it has none.
func LoadEncryptionKey(dir string) (*ecdh.PrivateKey, error) {
	data, err := os.ReadFile(filepath.Join(dir, EncKeyFile))
	if err != nil {
		return nil, fmt.Errorf("encryption key: %w", err)
	}
	return tlsseal.DecodePrivate(data)
}

// EnsureEncryptionKey reads the edge's encryption key, or makes and
// writes one (0600, atomically) when it has none: an edge enrolled before
// encryption keys were.
func EnsureEncryptionKey(dir string) (*ecdh.PrivateKey, error) {
	k, err := LoadEncryptionKey(dir)
	if !errors.Is(err, os.ErrNotExist) {
		return k, err
	}
	return newKeyFile(filepath.Join(dir, EncKeyFile))
}

// pendingEncryptionKey is the unfinished enrollment's encryption key, or
// a new one written as pending.
func pendingEncryptionKey(dir string) (*ecdh.PrivateKey, error) {
	data, err := os.ReadFile(filepath.Join(dir, pendingEncKey))
	if err == nil {
		if k, err := tlsseal.DecodePrivate(data); err == nil {
			return k, nil
		}
	}
	return newKeyFile(filepath.Join(dir, pendingEncKey))
}

func newKeyFile(path string) (*ecdh.PrivateKey, error) {
	k, err := tlsseal.GenerateKey()
	if err != nil {
		return nil, err
	}
	data, err := tlsseal.EncodePrivate(k)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
		return nil, fmt.Errorf("write encryption key: %w", err)
	}
	return k, nil
}

// RegisterEncryptionKey sends the edge's encryption public key to the
// control API (idempotent: the same key again changes nothing).
func (c *Client) RegisterEncryptionKey(ctx context.Context, pub *ecdh.PublicKey) error {
	resp, err := c.do(ctx, c.o.Timeout, http.MethodPut, edgeapi.PathEncryptionKey, nil, nil,
		edgeapi.EncryptionKeyRequest{EncryptionKey: tlsseal.EncodePublic(pub)})
	if err != nil {
		return fmt.Errorf("register the encryption key: %w", err)
	}
	resp.Body.Close()
	return nil
}
