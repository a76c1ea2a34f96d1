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
	srv.createThread()
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
	srv.stop()
	if logs := srv.stderr(); strings.Contains(logs, "other users of this machine") {
		t.Errorf("warned about private files:\n%s", logs)
	}
}

// An existing database others may read is served as it is, with a
// warning at start naming the files and the folder and the chmod to run.
func TestBinaryWarnsOfReadableDatabase(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "gw.db")
	first := startServer(t, db, "0s")
	first.createThread()
	first.stop()
	if err := os.Chmod(db, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, db, "0s")
	if list := srv.threads(); len(list) != 1 {
		t.Errorf("%d threads, want the 1 of the first start", len(list))
	}
	const fileWarning = "other users of this machine may read the database, which holds every conversation and the password and token hashes: make it yours alone"
	const dirWarning = "other users of this machine may list the database's folder: make it yours alone (or move the database into a folder of its own)"
	if srv.logged(fileWarning) != 1 || srv.logged(dirWarning) != 1 {
		t.Fatalf("want one warning for the file and one for the folder; stderr:\n%s", srv.stderr())
	}
	logs := srv.stderr()
	for _, want := range []string{"chmod 600 " + db + " " + db + "-wal " + db + "-shm", "chmod 700 " + dir} {
		if !strings.Contains(logs, want) {
			t.Errorf("the warnings do not say %q:\n%s", want, logs)
		}
	}
	if m := modeOf(t, db); m != 0o644 {
		t.Errorf("the existing file's mode was changed to %v", m)
	}
}
