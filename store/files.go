package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Who may read a SQLite database's files.
//
// The database holds every conversation and the hashes of every password
// and API token, so its files are the process owner's alone: Open creates
// the folder (and any missing parent) with DirMode and the database file
// and its .lock with FileMode, and Backup its copy with FileMode. SQLite
// creates the -wal and -shm files itself, with the database file's
// permissions (its unix VFS copies them, for that reason), so creating the
// database file first, private, makes them private too. The process umask
// can only narrow these modes, and is left alone: it is the process's, not
// the store's.
//
// Files and folders that already exist are not changed (an administrator
// may have reasons, such as a group that runs backups); Exposed reports
// them, and the server warns at start with the command that closes them.

const (
	// FileMode is the mode of the files the store creates.
	FileMode fs.FileMode = 0o600
	// DirMode is the mode of the folders it creates.
	DirMode fs.FileMode = 0o700
)

// createPrivate creates path's folder and an empty database file, both
// private, where they do not exist yet (an empty file is a new database
// to SQLite).
func createPrivate(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), DirMode); err != nil {
		return fmt.Errorf("create database folder: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, FileMode)
	switch {
	case err == nil:
		return f.Close()
	case errors.Is(err, fs.ErrExist):
		return nil
	default:
		return fmt.Errorf("create database file: %w", err)
	}
}

// Exposure is what of a SQLite database other users of the machine can
// reach.
type Exposure struct {
	// Files are the database's files (the database, -wal, -shm, .lock)
	// that grant its group or others any permission.
	Files []string
	// Dir is the database's folder when it grants its group or others any
	// permission (they can at least see the files' names and sizes), or "".
	Dir string
}

// Exposed reports which of the SQLite database path's files and folder
// other users of the machine may read or change; files that do not exist
// are skipped. For a PostgreSQL dsn it reports nothing.
func Exposed(dsn string) (Exposure, error) {
	var e Exposure
	if IsPostgres(dsn) {
		return e, nil
	}
	for _, name := range []string{dsn, dsn + "-wal", dsn + "-shm", dsn + ".lock"} {
		info, err := os.Stat(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return e, err
		}
		if info.Mode().Perm()&0o077 != 0 {
			e.Files = append(e.Files, name)
		}
	}
	dir := filepath.Dir(dsn)
	info, err := os.Stat(dir)
	if err != nil {
		return e, err
	}
	if info.Mode().Perm()&0o077 != 0 {
		e.Dir = dir
	}
	return e, nil
}
