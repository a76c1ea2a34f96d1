package loadgen

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat: the kernel
// reports them in USER_HZ, which is 100 on every Linux ABI.
const userHZ = 100

// cpuMicros returns the user + system CPU time a process used so far (all
// its threads), in microseconds, with 10 ms resolution.
func cpuMicros(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(data)
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/<pid>/stat line. The command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func parseStatCPU(data []byte) (int64, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat: no command name")
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields", len(f)+2)
	}
	utime, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("proc stat utime: %w", err)
	}
	stime, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("proc stat stime: %w", err)
	}
	return (utime + stime) * (1_000_000 / userHZ), nil
}

// rssKiB returns a process's resident set size (VmRSS) in KiB.
func rssKiB(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusKiB(data, "VmRSS:")
}

func parseStatusKiB(data []byte, key string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, key) {
			continue
		}
		f := strings.Fields(line[len(key):])
		if len(f) == 0 {
			break
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, fmt.Errorf("proc status: no %s", key)
}

// machineCPU returns the busy and total jiffies of all CPUs (/proc/stat).
func machineCPU() (busy, total int64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line")
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, 0, err
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, nil
}

// Machine describes where the figures were taken.
type Machine struct {
	CPUs      int    `json:"cpus"`
	Model     string `json:"cpu_model"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"go_version"`
	LoadAvg   string `json:"loadavg_at_start"`
}

func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.Model = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.Join(strings.Fields(string(data))[:3], " ")
	}
	return m
}

// cpuMeter measures the servers' CPU time (one process, or the sum of
// several) and the machine's busy share over one window.
type cpuMeter struct {
	pids                []int
	cpu0, self0         int64
	busy0, total0       int64
	cpu1, self1         int64
	busy1, total1       int64
	startErr, finishErr error
	io0, io1            int64 // write_bytes of the pids
	ioErr               error
}

// sumCPU is the CPU time of every pid so far; the first error, if any.
func sumCPU(pids []int) (int64, error) {
	var sum int64
	var first error
	for _, pid := range pids {
		v, err := cpuMicros(pid)
		if err != nil && first == nil {
			first = err
		}
		sum += v
	}
	return sum, first
}

func (m *cpuMeter) start(pids ...int) {
	m.pids = pids
	m.io0, m.ioErr = sumWriteBytes(pids)
	m.cpu0, m.startErr = sumCPU(pids)
	m.self0, _ = cpuMicros(os.Getpid())
	m.busy0, m.total0, _ = machineCPU()
}

func (m *cpuMeter) finish() {
	m.cpu1, m.finishErr = sumCPU(m.pids)
	var err error
	if m.io1, err = sumWriteBytes(m.pids); m.ioErr == nil {
		m.ioErr = err
	}
	m.self1, _ = cpuMicros(os.Getpid())
	m.busy1, m.total1, _ = machineCPU()
}

// commCPU returns the CPU time so far (µs) of every process on the machine
// whose command name (/proc/PID/stat, field 2) is one of names, by pid.
// Processes that end between the listing and the read are skipped.
func commCPU(names ...string) map[int]int64 {
	out := map[int]int64{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if err != nil {
			continue
		}
		if !slices.Contains(names, statComm(data)) {
			continue
		}
		if v, err := parseStatCPU(data); err == nil {
			out[pid] = v
		}
	}
	return out
}

// statComm is the command name of a /proc/PID/stat line: between the
// first '(' and the last ')'.
func statComm(data []byte) string {
	i, j := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if i < 0 || j < i {
		return ""
	}
	return string(data[i+1 : j])
}

// commCPUDelta is the CPU the processes of after used since before (µs);
// a process that started in between counts whole.
func commCPUDelta(before, after map[int]int64) int64 {
	var d int64
	for pid, v := range after {
		d += max(0, v-before[pid])
	}
	return d
}

func (m *cpuMeter) err() error {
	if m.startErr != nil {
		return m.startErr
	}
	return m.finishErr
}

// serverMicros is the process's CPU time in the window.
func (m *cpuMeter) serverMicros() int64 { return m.cpu1 - m.cpu0 }

// selfMicros is the generator's own CPU time in the window.
func (m *cpuMeter) selfMicros() int64 { return m.self1 - m.self0 }

// machineBusy is the share of all CPUs busy in the window, 0..1.
func (m *cpuMeter) machineBusy() float64 {
	if m.total1 <= m.total0 {
		return 0
	}
	return float64(m.busy1-m.busy0) / float64(m.total1-m.total0)
}

// writtenBytes is what the pids sent to the storage layer over the window
// (/proc/PID/io write_bytes: counted when a page is dirtied or written
// directly, so SQLite's WAL and checkpoint writes show as they happen), and
// whether it could be read.
func (m *cpuMeter) writtenBytes() (int64, bool) {
	return m.io1 - m.io0, m.ioErr == nil
}

// sumWriteBytes is the write_bytes of every pid so far.
func sumWriteBytes(pids []int) (int64, error) {
	var sum int64
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
		if err != nil {
			return 0, err
		}
		found := false
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("/proc/%d/io: %w", pid, err)
				}
				sum, found = sum+n, true
			}
		}
		if !found {
			return 0, fmt.Errorf("/proc/%d/io has no write_bytes", pid)
		}
	}
	return sum, nil
}
