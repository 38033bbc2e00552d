package app

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"breakwater/server/invites"
	"breakwater/storage"
	"breakwater/storage/postgres"
)

// SecretFile is the name of the file beside the database that holds the
// server secret when BREAKWATER_SECRET is not set.
const SecretFile = "breakwater.secret"

// serverSecret is the secret that keys the stored hashes of invite codes:
// BREAKWATER_SECRET when set (at least invites.MinSecretLen bytes), else
// the contents of SecretFile beside the database, made on first start
// with 32 random bytes (hex) and mode 0600.
//
// It is kept out of the database on purpose: a secret stored in the same
// file as the hashes would protect nothing against a stolen copy of it.
// Losing it makes outstanding invite codes unusable, nothing else; back it
// up with the database (docs/OPERATIONS.md: Backups and restore).
func serverSecret(dbPath string, getenv func(string) string, log *slog.Logger) ([]byte, error) {
	if s := getenv("BREAKWATER_SECRET"); s != "" {
		if len(s) < invites.MinSecretLen {
			return nil, fmt.Errorf("BREAKWATER_SECRET: %w", invites.ErrShortSecret)
		}
		return []byte(s), nil
	}
	path := filepath.Join(filepath.Dir(dbPath), SecretFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		s := strings.TrimSpace(string(data))
		if len(s) < invites.MinSecretLen {
			return nil, fmt.Errorf("server secret %s: %w", path, invites.ErrShortSecret)
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Warn("the server secret file is readable by others: chmod 600 it", "path", path, "mode", fi.Mode().Perm().String())
		}
		return []byte(s), nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("server secret: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("server secret: %w", err)
	}
	secret := hex.EncodeToString(raw[:])
	if err := writeNew(path, []byte(secret+"\n")); err != nil {
		return nil, fmt.Errorf("server secret %s: %w", path, err)
	}
	log.Info("server secret made: back it up with the database", "path", path)
	return []byte(secret), nil
}

// writeNew creates path with mode 0600 and data, durably (the file and
// its folder synced), and never over an existing file: two processes
// starting at once cannot each write a secret of their own.
func writeNew(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

// errNoSharedSecret refuses to start an instance on PostgreSQL without
// BREAKWATER_SECRET.
var errNoSharedSecret = errors.New("BREAKWATER_SECRET is not set: with storage.backend = \"postgres\" every instance (and every command) " +
	"must have the same server secret in the environment (openssl rand -hex 32)")

// openInviteKey loads the server secret and moves invites stored before
// the key to their keyed hash (once; see storage.DB.RekeyInvites).
func (a *App) openInviteKey(c Config) error {
	if c.Storage.Backend == storage.BackendPostgres && a.opts.Getenv("BREAKWATER_SECRET") == "" {
		// A file beside one instance would key its invites apart from
		// the others': a code made on one would not verify on another.
		return errNoSharedSecret
	}
	secret, err := serverSecret(c.Storage.Path, a.opts.Getenv, a.log)
	if err != nil {
		return err
	}
	key, err := invites.NewKey(secret)
	if err != nil {
		return err
	}
	a.inviteKey = key
	n, err := a.db.RekeyInvites(key.Mark(), key.Rekey)
	switch {
	case errors.Is(err, storage.ErrInviteKeyChanged), errors.Is(err, postgres.ErrInviteKeyChanged):
		// Not fatal: keys, quotas and the budget do not depend on it.
		a.log.Error("invite codes made before were keyed with another server secret and will not verify: "+
			"restore that BREAKWATER_SECRET or "+SecretFile+", or delete and remake the invites", "err", err)
	case err != nil:
		return err
	case n > 0:
		a.log.Info("invite codes re-keyed with the server secret", "invites", n)
	}
	return nil
}
