package app_test

// The database's files on disk: an existing database others may read is
// served with a warning. (What the binary creates, backup included, is
// tested in the root package, which runs the backup command.)

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/internal/apptest"
)

func modeOf(t *testing.T, path string) fs.FileMode {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return info.Mode().Perm()
}

// An existing database others may read is served as it is, with a
// warning at start naming the files and the folder and the chmod to run.
func TestBinaryWarnsOfReadableDatabase(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "gw.db")
	first := apptest.Start(t, apptest.CommandConfig(db, 0))
	first.CreateThread()
	first.Stop()
	if err := os.Chmod(db, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := apptest.Start(t, apptest.CommandConfig(db, 0))
	if list := srv.Threads(); len(list) != 1 {
		t.Errorf("%d threads, want the 1 of the first start", len(list))
	}
	const fileWarning = "other users of this machine may read the database, which holds every conversation and the password and token hashes: make it yours alone"
	const dirWarning = "other users of this machine may list the database's folder: make it yours alone (or move the database into a folder of its own)"
	if srv.Logged(fileWarning) != 1 || srv.Logged(dirWarning) != 1 {
		t.Fatalf("want one warning for the file and one for the folder; stderr:\n%s", srv.Stderr())
	}
	logs := srv.Stderr()
	for _, want := range []string{"chmod 600 " + db + " " + db + "-wal " + db + "-shm", "chmod 700 " + dir} {
		if !strings.Contains(logs, want) {
			t.Errorf("the warnings do not say %q:\n%s", want, logs)
		}
	}
	if m := modeOf(t, db); m != 0o644 {
		t.Errorf("the existing file's mode was changed to %v", m)
	}
}
