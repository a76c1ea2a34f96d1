// Command gateway serves a browser chat UI and an API for LLM agents where
// cancel is an honest protocol. `gateway` (or `gateway serve`) runs the
// server; `gateway check -db PATH` audits a database's invariants;
// `gateway health` asks a running server whether it is ready.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(args, stderr)
	case "check":
		return check(args, stdout, stderr)
	case "backup":
		return backup(args, stdout, stderr)
	case "user":
		return userCmd(args, stdin, stdout, stderr)
	case "token":
		return tokenCmd(args, stdout, stderr)
	case "health":
		return health(args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version())
		return 0
	case "help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "gateway: unknown command %q\n\n%s\n", cmd, usage)
		return 2
	}
}

const usage = `Usage:
  gateway [serve] [flags]   run the server (flags: gateway serve -h)
  gateway check -db PATH    audit the protocol's invariants on a database
  gateway backup -db PATH OUT
                            write a consistent copy of a database, also while it serves
  gateway user add|passwd|del|list ...
                            manage the accounts of -auth password (gateway user help)
  gateway token create|revoke|list ...
                            manage API tokens for programs (gateway token help)
  gateway health [-addr HOST:PORT | -url URL] [-timeout 5s]
                            exit 0 when the running server's /readyz answers ready, else 1
                            with the reason (for container and orchestrator health checks)
  gateway version           print the build's version, commit and Go version`

// buildVersion is set by `make build` (-ldflags -X main.buildVersion=…)
// from git describe; otherwise the toolchain's build information is used.
var buildVersion string

// version describes the build from what the Go toolchain recorded in it.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "gateway " + buildVersion + " (no build information)"
	}
	v, rev, at, dirty := info.Main.Version, "", "", ""
	if buildVersion != "" {
		v = buildVersion
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = " (modified)"
			}
		}
	}
	out := "gateway " + v
	if rev != "" {
		out += " commit " + rev[:min(12, len(rev))] + dirty
	}
	if at != "" {
		out += " " + at
	}
	return out + " " + info.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
}
