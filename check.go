package main

// gateway check: audits the protocol's invariants in a database a gateway
// may be serving at the same time.

import (
	"context"
	"fmt"
	"io"

	"github.com/honestcancel/gateway/app"
)

func check(args []string, stdout, stderr io.Writer) int {
	fs, db := dbFlagSet("check", "SQLite database file or PostgreSQL URL to audit", stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx := context.Background()
	st, code := openExisting(ctx, "gateway check", *db, stderr, 2)
	if code >= 0 {
		return code
	}
	defer st.Close()
	audit, err := st.Audit(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "gateway check:", err)
		return 2
	}
	for _, v := range audit.Violations {
		fmt.Fprintln(stdout, v)
	}
	read := fmt.Sprintf("%d threads, %d runs, %d operations, %d events, %d buffered deltas",
		audit.Threads, audit.Runs, audit.Operations, audit.Events, audit.Deltas)
	if len(audit.Violations) > 0 {
		fmt.Fprintf(stdout, "%d violations in %s (%s)\n", len(audit.Violations), app.RedactedURL(*db), read)
	} else {
		fmt.Fprintf(stdout, "ok: all eleven invariants hold in %s (%s)\n", app.RedactedURL(*db), read)
	}
	if len(audit.Unchecked) > 0 {
		fmt.Fprintln(stdout, "not verifiable from this database alone:")
		for _, u := range audit.Unchecked {
			fmt.Fprintln(stdout, "  invariants "+u)
		}
	}
	if len(audit.Violations) > 0 {
		return 1
	}
	return 0
}
