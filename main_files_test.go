package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func modeOf(t *testing.T, path string) fs.FileMode {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return info.Mode().Perm()
}

// What the binary creates for a SQLite database is its owner's alone,
// whatever the umask lets through (a test runs with its own, usually
// 022): the folder 0700; the database, its -wal and -shm, the .lock and a
// backup 0600. No warning is logged for them.
func TestBinaryDatabaseFilesArePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	db := filepath.Join(dir, "gw.db")
	srv := startServer(t, db, "0s")
	srv.CreateThread()
	backup := filepath.Join(t.TempDir(), "backups", "copy.db")
	if code, out, errOut := runCLI(t, nil, "backup", "-db", db, backup); code != 0 {
		t.Fatalf("backup: exit %d %q %q", code, out, errOut)
	}
	if m := modeOf(t, dir); m != 0o700 {
		t.Errorf("database folder mode %v, want 0700", m)
	}
	if m := modeOf(t, filepath.Dir(backup)); m != 0o700 {
		t.Errorf("backup folder mode %v, want 0700", m)
	}
	for _, f := range []string{db, db + "-wal", db + "-shm", db + ".lock", backup} {
		if m := modeOf(t, f); m != 0o600 {
			t.Errorf("%s mode %v, want 0600", filepath.Base(f), m)
		}
	}
	srv.Stop()
	if logs := srv.Stderr(); strings.Contains(logs, "other users of this machine") {
		t.Errorf("warned about private files:\n%s", logs)
	}
}
