package loadgen

import (
	"encoding/json"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

func TestSplitFrame(t *testing.T) {
	cases := []struct {
		frame string
		want  []string
	}{
		{`{"a":1}`, []string{`{"a":1}`}},
		{"{\"a\":1}\n{\"b\":2}", []string{`{"a":1}`, `{"b":2}`}},
		{"{\"a\":1}\n{\"b\":2}\n", []string{`{"a":1}`, `{"b":2}`}},
		{"\n\n{\"a\":\"x\\ny\"}\r\n\n", []string{`{"a":"x\ny"}`}}, // an escaped newline is not a separator
		{"", nil},
	}
	for _, c := range cases {
		var got []string
		n := splitFrame([]byte(c.frame), func(obj []byte) { got = append(got, string(obj)) })
		if n != len(c.want) || strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("splitFrame(%q) = %d %q, want %q", c.frame, n, got, c.want)
		}
	}
}

func TestPercentileNearestRank(t *testing.T) {
	var v []int32
	for i := int32(1); i <= 100; i++ {
		v = append(v, i)
	}
	for p, want := range map[float64]int32{50: 50, 99: 99, 100: 100, 0.1: 1, 1: 1} {
		if got := percentile(v, p); got != want {
			t.Errorf("p%v of 1..100 = %d, want %d", p, got, want)
		}
	}
	if got := percentile([]int32{7}, 99); got != 7 {
		t.Errorf("p99 of one sample = %d", got)
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %d", got)
	}
	// 200 samples: p99 is the 198th.
	v = v[:0]
	for i := int32(1); i <= 200; i++ {
		v = append(v, i)
	}
	if got := percentile(v, 99); got != 198 {
		t.Errorf("p99 of 1..200 = %d, want 198", got)
	}
}

func TestSummarizeSortsAndConvertsToMillis(t *testing.T) {
	d := summarize([]int32{3000, 1000, 2000, 250000})
	if d.N != 4 || d.P50 != 2 || d.P99 != 250 || d.Max != 250 {
		t.Errorf("summarize = %+v", d)
	}
	if z := summarize(nil); z.N != 0 || !math.IsNaN(z.P99) {
		t.Errorf("summarize(nil) = %+v", z)
	}
}

func TestSamplesBoundAndClamp(t *testing.T) {
	var s samples
	s.add(-5)
	s.add(math.MaxInt64)
	if s.v[0] != 0 || s.v[1] != math.MaxInt32 {
		t.Errorf("clamped samples = %v", s.v)
	}
	a, b := samples{v: []int32{1, 2}}, samples{v: []int32{3}}
	if got := merged(&a, &b); len(got) != 3 || got[2] != 3 {
		t.Errorf("merged = %v", got)
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command name may hold spaces and parentheses.
	line := "4242 (my (odd) server) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 8 0 123 456 789\n"
	got, err := parseStatCPU([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(200 * 10_000); got != want {
		t.Errorf("cpu = %d µs, want %d", got, want)
	}
	if _, err := parseStatCPU([]byte("4242 (x) S 1 2")); err == nil {
		t.Error("a short stat line parsed")
	}
}

func TestParseStatusKiB(t *testing.T) {
	status := "Name:\tgateway\nVmPeak:\t  900 kB\nVmRSS:\t   77412 kB\nThreads:\t7\n"
	got, err := parseStatusKiB([]byte(status), "VmRSS:")
	if err != nil || got != 77412 {
		t.Errorf("VmRSS = %d, %v", got, err)
	}
	if _, err := parseStatusKiB([]byte("Name:\tx\n"), "VmRSS:"); err == nil {
		t.Error("missing VmRSS parsed")
	}
}

func TestServingLine(t *testing.T) {
	for line, want := range map[string]string{
		`time=2026-01-01T00:00:00Z level=INFO msg="gateway serving" addr=http://127.0.0.1:41234 db=/tmp/x.db model=demo auth=header`: "http://127.0.0.1:41234",
		`time=2026-01-01T00:00:00Z level=INFO msg="floor serving" addr=http://127.0.0.1:5`:                                           "http://127.0.0.1:5",
		`time=2026-01-01T00:00:00Z level=INFO msg="gateway serving" addr=http://0.0.0.0:80`:                                          "",
	} {
		m := servingLine.FindStringSubmatch(line)
		got := ""
		if m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("servingLine on %q = %q, want %q", line, got, want)
		}
	}
}

func TestFloorPayload(t *testing.T) {
	for _, size := range []int{50, 202, 1000} {
		p := floorPayload("t3", 42, 1700000000123, size)
		if size > 150 && len(p) != size {
			t.Errorf("payload of size %d has %d bytes", size, len(p))
		}
		var m wireMsg
		if err := json.Unmarshal(p, &m); err != nil {
			t.Fatalf("payload is not JSON: %v: %s", err, p)
		}
		if m.Type != chat.EventMessageDelta || m.ThreadID != "t3" || m.Seq != 42 || m.TS != 1700000000123 {
			t.Errorf("payload decoded as %+v", m)
		}
	}
}

func TestSpreadOf(t *testing.T) {
	var mu sync.Mutex
	var ring [spreadRing]struct{ seq, at int64 }
	if got := spreadOf(&mu, &ring, 5, 100); got != 0 {
		t.Errorf("first receipt spread = %d", got)
	}
	if got := spreadOf(&mu, &ring, 5, 130); got != 30 {
		t.Errorf("second receipt spread = %d", got)
	}
	// a later seq on the same slot starts over
	if got := spreadOf(&mu, &ring, 5+spreadRing, 900); got != 0 {
		t.Errorf("reused slot spread = %d", got)
	}
}

func TestErrorLog(t *testing.T) {
	e := newErrorLog()
	for i := range 5 {
		e.add("seq_gap", strings.Repeat("x", i+1))
	}
	e.add("close_1013", "")
	if e.total() != 6 {
		t.Errorf("total = %d", e.total())
	}
	l := e.list()
	if len(l) != 2 || l[0].Kind != "close_1013" || l[1].Count != 5 || len(l[1].Examples) != examplesPerKind {
		t.Errorf("list = %+v", l)
	}
}

func TestFormatNumber(t *testing.T) {
	for v, want := range map[float64]string{1234567: "1,234,567", 46548.4: "46,548", 305: "305", 40.66: "40.7", 1.325: "1.32", -2500: "-2,500"} {
		if got := formatNumber(val(v)); got != want {
			t.Errorf("formatNumber(%v) = %q, want %q", v, got, want)
		}
	}
	if got := formatNumber(val(math.NaN())); got != "—" {
		t.Errorf("NaN formats as %q", got)
	}
}

func TestWriteTable(t *testing.T) {
	r := &Report{
		Date: "2026-01-01T00:00:00Z", Machine: Machine{CPUs: 2, Model: "Test CPU", GoVersion: "go1.26"},
		Scenarios: []ScenarioReport{{
			Name: "idle", Shape: "1000 tabs", Seconds: 9,
			Metrics: []Metric{
				compared("RSS per idle tab", "KiB", 40.7, 30.9, "≤ 40 KiB"),
				compared("no floor run", "ms", 3, math.NaN(), ""),
				metric("gateway only", "1/s", 46548, ""),
			},
			GatewayErrors: []ErrorCount{{Kind: "seq_gap", Count: 2, Examples: []string{"tab a: seq 3 after 1"}}},
			FloorErrors:   []ErrorCount{},
			Check:         &Check{OK: true},
		}},
		ProtocolErrors: 2, ChecksOK: true, DurationSeconds: 12,
	}
	var b strings.Builder
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"2 CPUs (Test CPU)", "== idle: 1000 tabs (9.0s)", "RSS per idle tab (KiB)", "40.7", "30.9", "1.32×", "≤ 40 KiB",
		"46,548", "seq_gap×2 (e.g. tab a: seq 3 after 1)", "floor none", "gateway check: ok", "FAILED: 2 protocol errors",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if m := r.Scenarios[0].Metrics[1]; m.Ratio != nil || m.Floor != nil {
		t.Errorf("a figure without a floor has a ratio: %+v", m)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Errorf("report does not encode: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Scenarios: AllScenarios, Auth: "header", Pace: 1, Window: 1, StorageWindow: 1, CancelWindow: 1,
		IdleThreads: 1, IdleTabs: 1, FanoutThreads: 1, FanoutTabs: 1, CancelRuns: 1, CancelTabs: 1, StorageRuns: 1,
		ScaleRuns: 1, ScaleTabs: 1, ScalePace: 1, ScaleWindow: 1, ScaleCancelEvery: 1,
		LongExchanges: 1, ClusterRuns: 1, ClusterTabs: 2, ClusterWindow: 1, ClusterCancelTo: "other"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	bad := ok
	bad.LongExchanges = 0
	if err := bad.Validate(); err == nil {
		t.Error("long with no exchanges accepted")
	}
	bad = ok
	bad.LongPace = -1
	if err := bad.Validate(); err == nil {
		t.Error("long with a negative pace accepted")
	}
	bad.Scenarios = []string{"idle"} // long's settings matter to long only
	if err := bad.Validate(); err != nil {
		t.Errorf("idle refused for long's pace: %v", err)
	}
	bad = ok
	bad.Scenarios = []string{"idle", "nope"}
	if err := bad.Validate(); err == nil {
		t.Error("unknown scenario accepted")
	}
	bad = ok
	bad.Auth = "password"
	if err := bad.Validate(); err == nil {
		t.Error("auth password accepted")
	}
}

func TestParsePromAndWindow(t *testing.T) {
	before := `# HELP gateway_store_transaction_seconds Time.
# TYPE gateway_store_transaction_seconds histogram
gateway_store_transaction_seconds_bucket{kind="write",le="0.001"} 10
gateway_store_transaction_seconds_bucket{kind="write",le="0.01"} 20
gateway_store_transaction_seconds_bucket{kind="write",le="+Inf"} 20
gateway_store_transaction_seconds_count{kind="write"} 20
gateway_store_transaction_seconds_bucket{kind="grouped",le="0.001"} 0
gateway_store_transaction_seconds_bucket{kind="grouped",le="+Inf"} 0
gateway_deltas_streamed_total 100
go_info{version="go 1.26"} 1
`
	after := strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(before,
		`le="0.001"} 10`, `le="0.001"} 100`), `le="0.01"} 20`, `le="0.01"} 119`), `le="+Inf"} 20`, `le="+Inf"} 120`)
	after = strings.Replace(after, `_count{kind="write"} 20`, `_count{kind="write"} 120`, 1)
	after = strings.Replace(after, "gateway_deltas_streamed_total 100", "gateway_deltas_streamed_total 1100", 1)
	b, err := parseProm(strings.NewReader(before))
	if err != nil {
		t.Fatal(err)
	}
	a, err := parseProm(strings.NewReader(after))
	if err != nil {
		t.Fatal(err)
	}
	if b[`go_info{version="go 1.26"}`] != 1 || b["gateway_deltas_streamed_total"] != 100 {
		t.Fatalf("parsed %v", b)
	}
	w := &promWindow{before: b, after: a, seconds: 2}
	if got := w.rate("gateway_deltas_streamed_total"); got != 500 {
		t.Errorf("rate = %v", got)
	}
	if got := w.delta("missing_total"); !math.IsNaN(got) {
		t.Errorf("missing series delta = %v", got)
	}
	// 100 new observations: 90 ≤ 1 ms, 9 more ≤ 10 ms, 1 above.
	if got := w.quantileBound("gateway_store_transaction_seconds", `kind="write"`, 0.5); got != 0.001 {
		t.Errorf("p50 bound = %v", got)
	}
	if got := w.quantileBound("gateway_store_transaction_seconds", `kind="write"`, 0.99); got != 0.01 {
		t.Errorf("p99 bound = %v", got)
	}
	if got := w.quantileBound("gateway_store_transaction_seconds", `kind="write"`, 0.999); !math.IsInf(got, 1) {
		t.Errorf("p99.9 bound = %v", got)
	}
	if got := w.quantileBound("gateway_store_transaction_seconds", `kind="grouped"`, 0.99); !math.IsNaN(got) {
		t.Errorf("bound without observations = %v", got)
	}
	// Interpolated as histogram_quantile: rank 50 of 90 in [0, 1 ms],
	// rank 95 is the 5th of 9 in (1, 10 ms].
	for q, want := range map[float64]float64{0.5: 0.001 * 50 / 90, 0.95: 0.001 + 0.009*5/9, 0.99: 0.01} {
		if got := w.quantile("gateway_store_transaction_seconds", `kind="write"`, q); math.Abs(got-want) > 1e-12 {
			t.Errorf("interpolated p%v = %v, want %v", 100*q, got, want)
		}
	}
	if got := w.quantile("gateway_store_transaction_seconds", `kind="write"`, 0.999); !math.IsInf(got, 1) {
		t.Errorf("interpolated p99.9 = %v", got)
	}
	if got := w.quantile("gateway_store_transaction_seconds", `kind="grouped"`, 0.99); !math.IsNaN(got) {
		t.Errorf("interpolated without observations = %v", got)
	}
}

func TestConfigValidateCluster(t *testing.T) {
	ok := Config{Scenarios: []string{"cluster"}, Auth: "header", Pace: 1, Window: 1, StorageWindow: 1, CancelWindow: 1,
		IdleThreads: 1, IdleTabs: 1, FanoutThreads: 1, FanoutTabs: 1, CancelRuns: 1, CancelTabs: 1, StorageRuns: 1,
		ClusterRuns: 1, ClusterTabs: 2, ClusterWindow: 1, ClusterCancelTo: "other",
		Postgres: "postgres://bench@127.0.0.1:5432/test?sslmode=disable", NATS: "nats://127.0.0.1:4222"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	if why := ok.clusterSkip(); why != "" {
		t.Errorf("cluster skipped with both URLs: %s", why)
	}
	for name, mutate := range map[string]func(*Config){
		"one tab":          func(c *Config) { c.ClusterTabs = 1 },
		"no runs":          func(c *Config) { c.ClusterRuns = 0 },
		"cancel to nobody": func(c *Config) { c.ClusterCancelTo = "random" },
		"remote postgres":  func(c *Config) { c.Postgres = "postgres://bench@db.example.com:5432/test" },
		"remote nats":      func(c *Config) { c.NATS = "nats://10.0.0.7:4222" },
		"nats as postgres": func(c *Config) { c.Postgres = "nats://127.0.0.1:4222" },
	} {
		bad := ok
		mutate(&bad)
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Without either URL the scenario is skipped, not refused, and the
	// line says what to set.
	for _, c := range []Config{{Postgres: ok.Postgres}, {NATS: ok.NATS}, {}} {
		skip := ok
		skip.Postgres, skip.NATS = c.Postgres, c.NATS
		if err := skip.Validate(); err != nil {
			t.Errorf("config without URLs refused: %v", err)
		}
		why := skip.clusterSkip()
		if why == "" {
			t.Errorf("cluster not skipped with postgres=%q nats=%q", c.Postgres, c.NATS)
		}
		if c.Postgres == "" && !strings.Contains(why, "GATEWAY_TEST_POSTGRES_URL") || c.NATS == "" && !strings.Contains(why, "GATEWAY_TEST_NATS_URL") {
			t.Errorf("skip line does not say what to set: %q", why)
		}
	}
	// Other scenarios do not care about the cluster's settings.
	other := ok
	other.Scenarios, other.ClusterTabs, other.Postgres = []string{"cancel"}, 0, "mysql://x"
	if err := other.Validate(); err != nil {
		t.Errorf("cluster settings checked without cluster: %v", err)
	}
}

func TestSchemaDSN(t *testing.T) {
	got, err := schemaDSN("postgres://bench:pw@127.0.0.1:5432/test?sslmode=disable", "bench_cluster_ab12")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"postgres://bench:pw@127.0.0.1:5432/test?", "sslmode=disable", "search_path=bench_cluster_ab12"} {
		if !strings.Contains(got, want) {
			t.Errorf("schemaDSN = %q, lacks %q", got, want)
		}
	}
	if r := redactDB(got); strings.Contains(r, "pw") {
		t.Errorf("redacted DSN shows the password: %q", r)
	}
}

func TestRebind(t *testing.T) {
	q := `SELECT a FROM t WHERE ts >= ? AND ts < ?`
	if got := rebind("/tmp/x.db", q); got != q {
		t.Errorf("SQLite query rebound: %q", got)
	}
	if got := rebind("postgres://127.0.0.1/x", q); got != `SELECT a FROM t WHERE ts >= $1 AND ts < $2` {
		t.Errorf("PostgreSQL query = %q", got)
	}
}

func TestOwnerInstance(t *testing.T) {
	for owner, want := range map[string]int{"gwA.p_x1": 0, "gwB.p_7": 1, "": -1, "gwAB.p_1": -1, "gwC.p_1": -1, "gwB": -1} {
		if got := ownerInstance(owner, clusterIDs); got != want {
			t.Errorf("ownerInstance(%q) = %d, want %d", owner, got, want)
		}
	}
}

func TestClusterTabsSpreadOverInstances(t *testing.T) {
	e := newGWEnv("http://127.0.0.1:1", "header", "cluster")
	e.bases = []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}
	starts := [2]int{}
	for idx := range 4 {
		th := &gwThread{env: e, idx: idx}
		for k := range 3 {
			th.tabs = append(th.tabs, newGWTab(th, k))
		}
		starts[th.tabs[0].inst]++
		// every thread has a tab on each instance, so a cancel can always
		// go to the other one
		for inst := range 2 {
			on, off := tabsOn(th, inst, false), tabsOn(th, inst, true)
			if len(on) == 0 || len(off) == 0 || len(on)+len(off) != 3 {
				t.Errorf("thread %d, instance %d: on %v, off %v", idx, inst, on, off)
			}
			for _, k := range on {
				if th.tabs[k].inst != inst {
					t.Errorf("tab %d of thread %d is on %d, listed on %d", k, idx, th.tabs[k].inst, inst)
				}
			}
		}
	}
	if starts[0] != 2 || starts[1] != 2 {
		t.Errorf("runs start on instances %v, want half on each", starts)
	}
	// one instance: every tab on it
	if got := tabInstance(5, 2, 1); got != 0 {
		t.Errorf("single instance tab on %d", got)
	}
}

func TestWriteTableSkipped(t *testing.T) {
	r := &Report{Scenarios: []ScenarioReport{{Name: "cluster", Skipped: "set GATEWAY_TEST_POSTGRES_URL"}}, ChecksOK: true}
	var b strings.Builder
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "== cluster: skipped: set GATEWAY_TEST_POSTGRES_URL") || strings.Contains(b.String(), "gateway check") {
		t.Errorf("skipped scenario printed as:\n%s", b.String())
	}
}

func TestStatComm(t *testing.T) {
	if got := statComm([]byte("77 (nats-server) S 1 2 3")); got != "nats-server" {
		t.Errorf("comm = %q", got)
	}
	if got := commCPUDelta(map[int]int64{1: 100, 2: 50}, map[int]int64{1: 160, 3: 40}); got != 100 {
		t.Errorf("delta = %d, want 60 + 40 (a new process counts whole)", got)
	}
}
