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

// Encryption key files in the identity directory (0600): the X25519 key
// that certificates' keys are sealed to; the one an unfinished enrollment
// generated, so that a retry is an exact retry; the one a renewal makes
// and registers before it becomes current; the one that replaced, kept
// for seals made before the control API took the new one.
const (
	EncKeyFile    = "encryption-key.pem"
	pendingEncKey = "pending-encryption-key.pem"
	nextEncKey    = "next-encryption-key.pem"
	prevEncKey    = "previous-encryption-key.pem"
)

// EncryptionKeys reads every encryption key the edge holds, the current
// one first: a seal names the one it is for (tlsseal.KeyID), which may be
// one a renewal or an enrollment is switching to, or the one before. A
// file missing is skipped; a damaged one is an error.
func EncryptionKeys(dir string) ([]*ecdh.PrivateKey, error) {
	var out []*ecdh.PrivateKey
	for _, name := range []string{EncKeyFile, nextEncKey, pendingEncKey, prevEncKey} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("encryption key %s: %w", name, err)
		}
		k, err := tlsseal.DecodePrivate(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, k)
	}
	return out, nil
}

// RotateEncryptionKey gives the edge a new encryption key: it makes one
// (or takes the one an interrupted rotation made), registers it with the
// control API, then makes it current, the one it replaces kept as the
// previous one. Until it is registered the control API seals to the
// current one; from then on to the new one, which EncryptionKeys already
// reads. An edge with no encryption key yet has nothing to rotate.
func (c *Client) RotateEncryptionKey(ctx context.Context) error {
	dir := c.o.Dir
	cur, err := os.ReadFile(filepath.Join(dir, EncKeyFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("rotate the encryption key: %w", err)
	}
	next, err := keyFileAt(dir, nextEncKey)
	if err != nil {
		return fmt.Errorf("rotate the encryption key: %w", err)
	}
	if err := c.RegisterEncryptionKey(ctx, next.PublicKey()); err != nil {
		return err
	}
	nextPEM, err := os.ReadFile(filepath.Join(dir, nextEncKey))
	if err != nil {
		return fmt.Errorf("rotate the encryption key: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, prevEncKey), cur, 0o600); err != nil {
		return fmt.Errorf("rotate the encryption key: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, EncKeyFile), nextPEM, 0o600); err != nil {
		return fmt.Errorf("rotate the encryption key: %w", err)
	}
	if err := os.Remove(filepath.Join(dir, nextEncKey)); err != nil {
		return fmt.Errorf("rotate the encryption key: %w", err)
	}
	return atomicfile.SyncDir(dir)
}

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
func pendingEncryptionKey(dir string) (*ecdh.PrivateKey, error) { return keyFileAt(dir, pendingEncKey) }

// keyFileAt reads the key file name in dir, or makes it when it is
// missing or damaged.
func keyFileAt(dir, name string) (*ecdh.PrivateKey, error) {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err == nil {
		if k, err := tlsseal.DecodePrivate(data); err == nil {
			return k, nil
		}
	}
	return newKeyFile(filepath.Join(dir, name))
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
