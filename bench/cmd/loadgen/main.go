// Command loadgen benchmarks the gateway against the bare-library floor on
// this machine and prints every figure with its ratio to the floor. It
// builds both servers from the module it runs in, starts them on
// 127.0.0.1, drives them over real WebSocket connections, stops them, and
// audits the gateway's databases with `gateway check`.
//
//	go run ./bench/cmd/loadgen                     # the standard set (make bench)
//	go run ./bench/cmd/loadgen -scenarios fanout -fanout-tabs 80 -window 20s
//	go run ./bench/cmd/loadgen -json out.json      # also write the report as JSON
//	GATEWAY_TEST_POSTGRES_URL=postgres://… GATEWAY_TEST_NATS_URL=nats://127.0.0.1:4222 \
//	  go run ./bench/cmd/loadgen -scenarios cluster   # two instances, cross-instance cancels
//
// Figures never fail the run: it exits 1 only on protocol errors (an
// unexpected error frame or close, a seq gap, a missing or late event) or a
// failed check, and 2 on bad flags or a failed build. BENCHMARKS.md says
// what each figure measures.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/honestcancel/gateway/bench/loadgen"
)

func main() { os.Exit(run()) }

func run() int {
	var c loadgen.Config
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	scenarios := fs.String(
		"scenarios", strings.Join(loadgen.AllScenarios, ","),
		"scenarios to run, comma-separated: "+strings.Join(loadgen.AllScenarios, ", "),
	)
	jsonOut := fs.String(
		"json", "",
		"also write the report as JSON to this `file` (- for stdout; the table then goes to stderr)",
	)
	fs.StringVar(
		&c.Repo, "repo", "",
		"module root to build the gateway and the floor from (default: the module of the working directory)",
	)
	fs.StringVar(
		&c.Auth, "auth", "header",
		"gateway auth mode: header (one user per thread, named by X-Forwarded-User from 127.0.0.1) "+
			"or none (one user for everything; its per-user cancel reserve then limits the cancel scenario)",
	)
	fs.DurationVar(
		&c.Pace, "pace", 30*time.Millisecond,
		"demo model: time per streamed word in idle, fanout and cancel",
	)
	fs.DurationVar(&c.Warmup, "warmup", 2*time.Second, "load before each measured window")
	fs.DurationVar(&c.Window, "window", 10*time.Second, "fanout: measured window (gateway and floor each)")
	fs.IntVar(&c.IdleThreads, "idle-threads", 100, "idle: threads the tabs watch")
	fs.IntVar(&c.IdleTabs, "idle-tabs", 1000, "idle: tabs connected and subscribed")
	fs.IntVar(&c.FanoutThreads, "fanout-threads", 32, "fanout: threads (floor: topics), each with one run streaming")
	fs.IntVar(&c.FanoutTabs, "fanout-tabs", 50, "fanout: tabs per thread (floor: subscribers per topic)")
	fs.Float64Var(
		&c.ReconnectFraction, "reconnect-fraction", 0.05,
		"fanout: share of tabs that drop once in the window and resubscribe with after_seq",
	)
	fs.IntVar(&c.CancelRuns, "cancel-runs", 200, "cancel: concurrent streaming runs (one thread each)")
	fs.IntVar(&c.CancelTabs, "cancel-tabs", 3, "cancel: tabs per run")
	fs.DurationVar(
		&c.CancelWindow, "cancel-window", 6*time.Second,
		"cancel: measured window, after the warm-up; every thread cancels and restarts its run until it ends",
	)
	fs.DurationVar(
		&c.CancelMaxDelay, "cancel-max-delay", 0,
		"cancel: latest cancel moment after a run's first delta (default 60 × pace)",
	)
	fs.IntVar(&c.StorageRuns, "storage-runs", 64, "storage: concurrent runs streaming back to back")
	fs.DurationVar(&c.StoragePace, "storage-pace", time.Millisecond, "storage: demo model time per word")
	fs.DurationVar(&c.StorageWindow, "storage-window", 8*time.Second, "storage: measured window")
	fs.IntVar(&c.ScaleRuns, "scale-runs", 500, "scale: concurrent streaming runs (one thread each)")
	fs.IntVar(&c.ScaleTabs, "scale-tabs", 3, "scale: tabs per run")
	fs.DurationVar(&c.ScalePace, "scale-pace", 20*time.Millisecond, "scale: demo model time per word")
	fs.DurationVar(&c.ScaleWindow, "scale-window", 60*time.Second,
		"scale: measured window, after the warm-up (60 s measures 160-190 cancels of each kind; a p99 of fewer is the run's "+
			"largest one or two)")
	fs.IntVar(
		&c.ScaleCancelEvery, "scale-cancel-every", 10,
		"scale: every Nth thread cancels its runs at random moments (from a random tab) instead of letting them finish",
	)
	fs.IntVar(
		&c.ScaleCapacity, "scale-capacity", 0,
		"scale: the gateway's capacity, passed as -workers (runs executing at once; more wait queued); 0: "+
			"the gateway's default (no -workers)",
	)
	fs.IntVar(
		&c.LongExchanges, "long-exchanges", 300,
		"long: exchanges (run.start, wait for run.completed) one after another on one thread",
	)
	fs.DurationVar(&c.LongPace, "long-pace", 0, "long: demo model time per word (0: the instant model)")
	fs.StringVar(
		&c.Postgres, "postgres", os.Getenv("GATEWAY_TEST_POSTGRES_URL"),
		"cluster: PostgreSQL `URL` on 127.0.0.1 (a database the generator may create a schema in; dropped after); "+
			"empty skips cluster",
	)
	fs.StringVar(
		&c.NATS, "nats", os.Getenv("GATEWAY_TEST_NATS_URL"),
		"cluster: NATS `URL` on 127.0.0.1; empty skips cluster",
	)
	fs.IntVar(
		&c.ClusterRuns, "cluster-runs", 100,
		"cluster: concurrent streaming runs (one thread each) over the two instances",
	)
	fs.IntVar(
		&c.ClusterTabs, "cluster-tabs", 3,
		"cluster: tabs per run, alternating over the two instances (at least 2)",
	)
	fs.DurationVar(&c.ClusterWindow, "cluster-window", 6*time.Second, "cluster: measured window, after the warm-up")
	fs.StringVar(
		&c.ClusterCancelTo, "cluster-cancel-to", "other",
		"cluster: send each cancel to the instance that does not hold the run's lease (other) "+
			"or to the one that does (owner, for comparison)",
	)
	fs.StringVar(
		&c.Synchronous, "sqlite-synchronous", "",
		"start every gateway on SQLite with -sqlite-synchronous normal or full (not cluster); empty: "+
			"the gateway's default",
	)
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of every random choice (cancel moments, tabs, reconnects)")
	fs.StringVar(
		&c.PerfDir, "perf", "",
		"if set, record the servers with perf record -g and take Go CPU profiles during each measured window "+
			"(fanout, cancel, storage, scale; cluster: Go profiles of both instances) into this `folder`; "+
			"adds overhead: profile in a separate run",
	)
	timeout := fs.Duration(
		"timeout", 10*time.Minute,
		"stop everything after this long (a safety net; the standard set takes under 3 minutes)",
	)
	cpuProfile := fs.String("cpuprofile", "", "write the generator's own CPU profile to this `file`")
	fs.BoolVar(&c.Keep, "keep", false, "keep the temporary folder with the binaries and databases")
	fs.Usage = func() {
		fmt.Fprintf(
			fs.Output(),
			"usage: loadgen [flags]\n\nBenchmarks the gateway against the bare coder/websocket floor "+
				"(see BENCHMARKS.md).\n\n",
		)
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	c.Scenarios = strings.Split(*scenarios, ",")
	c.Log = os.Stderr
	if c.Repo == "" {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		mod := strings.TrimSpace(string(out))
		if err != nil || mod == "" || mod == os.DevNull {
			fmt.Fprintln(os.Stderr, "loadgen: run it inside the gateway module or pass -repo")
			return 2
		}
		c.Repo = filepath.Dir(mod)
	}
	if err := c.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 2
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep, err := loadgen.Run(ctx, c)
	if rep == nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 2
	}
	table := os.Stdout
	if *jsonOut == "-" {
		table = os.Stderr
	}
	if werr := loadgen.WriteTable(table, rep); werr != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", werr)
	}
	if *jsonOut != "" {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil && *jsonOut == "-" {
			_, jerr = os.Stdout.Write(append(b, '\n'))
		} else if jerr == nil {
			jerr = os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
		}
		if jerr != nil {
			fmt.Fprintln(os.Stderr, "loadgen: json:", jerr)
			return 2
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 1
	}
	if rep.ProtocolErrors > 0 || !rep.ChecksOK {
		return 1
	}
	return 0
}
