// Command sqlitelock holds a SQLite database's write lock, as another
// process would (a backup tool, an sqlite3 shell), for the browser tests
// (e2e/outage.test.mjs): while it holds it, the gateway's writes wait, so
// the deltas it fans out are in its memory only. Once it holds the lock it
// prints "locked", then a line "thread ID LAST_SEQ" per thread: the last
// seq written of each, which cannot move while the lock is held (a delta
// with a larger seq is in the gateway's memory only). It lets go when its
// standard input closes.
//
//	go run ./internal/sqlitelock DB
package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"os"

	_ "github.com/mattn/go-sqlite3"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: sqlitelock DB (holds DB's write lock until stdin closes)")
		os.Exit(2)
	}
	// The gateway commits many small transactions: the lock is taken
	// between two of them (SQLite's busy handler retries for up to 30 s).
	db, err := sql.Open("sqlite3", "file:"+(&url.URL{Path: os.Args[1]}).EscapedPath()+"?_busy_timeout=30000&_txlock=immediate")
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqlitelock:", err)
		os.Exit(1)
	}
	db.SetMaxOpenConns(1)
	tx, err := db.BeginTx(context.Background(), nil) // BEGIN IMMEDIATE
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqlitelock: take the write lock:", err)
		os.Exit(1)
	}
	rows, err := tx.Query(`SELECT thread_id, last_seq FROM threads`)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqlitelock: read the threads:", err)
		os.Exit(1)
	}
	var lines []string
	for rows.Next() {
		var id string
		var last int64
		if err := rows.Scan(&id, &last); err != nil {
			fmt.Fprintln(os.Stderr, "sqlitelock: read the threads:", err)
			os.Exit(1)
		}
		lines = append(lines, fmt.Sprintf("thread %s %d", id, last))
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "sqlitelock: read the threads:", err)
		os.Exit(1)
	}
	rows.Close()
	fmt.Println("locked")
	for _, l := range lines {
		fmt.Println(l)
	}
	fmt.Println("end")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = tx.Rollback()
	_ = db.Close()
}
