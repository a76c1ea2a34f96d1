package main

// gateway backup: a consistent copy of a SQLite database while a gateway
// may be serving it (VACUUM INTO reads one snapshot).

import (
	"context"
	"fmt"
	"io"

	"github.com/honestcancel/gateway/store"
)

func backup(args []string, stdout, stderr io.Writer) int {
	fs, db := dbFlagSet("backup", "SQLite database file to copy", stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "gateway backup: name the file to write: gateway backup -db PATH OUT")
		return 2
	}
	if store.IsPostgres(*db) {
		fmt.Fprintln(stderr, "gateway backup copies SQLite files; back up a PostgreSQL database with pg_dump (it is consistent while the gateway serves)")
		return 2
	}
	ctx := context.Background()
	st, code := openExisting(ctx, "gateway backup", *db, stderr, 1)
	if code >= 0 {
		return code
	}
	defer st.Close()
	if err := st.Backup(ctx, fs.Arg(0)); err != nil {
		fmt.Fprintln(stderr, "gateway backup:", err)
		return 1
	}
	fmt.Fprintf(stdout, "backed up %s to %s; check it with: gateway check -db %s\n", *db, fs.Arg(0), fs.Arg(0))
	return 0
}
