package gate

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Cost is what one verification spent.
type Cost struct {
	// CPU is the user and system time of its process.
	CPU time.Duration `json:"cpu"`
	// Decompressed counts the layer bytes it decompressed; Spooled the
	// bytes of data it wrote to its spool.
	Decompressed int64 `json:"decompressed"`
	Spooled      int64 `json:"spooled"`
	// PeakMemory is its process's peak resident memory in bytes.
	PeakMemory int64 `json:"peakMemory,omitempty"`
}

func (c Cost) add(o Cost) Cost {
	return Cost{CPU: c.CPU + o.CPU, Decompressed: c.Decompressed + o.Decompressed, Spooled: c.Spooled + o.Spooled, PeakMemory: max(c.PeakMemory, o.PeakMemory)}
}

func (c Cost) sub(o Cost) Cost {
	return c.add(Cost{CPU: -o.CPU, Decompressed: -o.Decompressed, Spooled: -o.Spooled})
}

// Budget bounds what one tenant's verifications may spend in a Window:
// past any of its bounds, that tenant's next verification waits until
// what it spent over the last Window is back under them. A verification
// that has started runs to its own limits, so a tenant spends at most its
// budget plus what its verifications at once (PerTenant) may spend each.
// A zero bound is no bound.
type Budget struct {
	Window time.Duration
	Cost
}

// Defaults of a tenant's Budget: in an hour, a core's hour, 4 TiB
// decompressed and 1 TiB spooled.
const (
	DefaultBudgetWindow       = time.Hour
	DefaultBudgetCPU          = time.Hour
	DefaultBudgetDecompressed = 4 << 40
	DefaultBudgetSpooled      = 1 << 40
)

// DefaultBudget is the Budget a Service applies when it is given none.
var DefaultBudget = Budget{Window: DefaultBudgetWindow, Cost: Cost{CPU: DefaultBudgetCPU, Decompressed: DefaultBudgetDecompressed, Spooled: DefaultBudgetSpooled}}

// ledger records what each tenant spent, to hold its work once it is
// over its Budget.
type ledger struct {
	mu     sync.Mutex
	budget Budget
	spent  map[string][]spending // by tenant, oldest first
	now    func() time.Time
}

type spending struct {
	at time.Time
	Cost
}

// charge records that tenant spent c now.
func (l *ledger) charge(tenant string, c Cost) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.spent == nil {
		l.spent = map[string][]spending{}
	}
	l.spent[tenant] = append(l.spent[tenant], spending{l.now(), c})
}

// wait is how long tenant's next verification must wait: zero when what
// it spent in the last window is under every bound, else until enough of
// it has aged out of the window.
func (l *ledger) wait(tenant string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	rec := l.spent[tenant]
	for len(rec) > 0 && now.Sub(rec[0].at) >= l.budget.Window {
		rec = rec[1:]
	}
	if len(rec) == 0 {
		delete(l.spent, tenant)
		return 0
	}
	l.spent[tenant] = rec
	var total Cost
	for _, s := range rec {
		total = total.add(s.Cost)
	}
	if l.under(total) {
		return 0
	}
	// Over budget: the wait is until the oldest spendings, enough of
	// them to bring the rest under every bound, have left the window.
	for _, s := range rec {
		total = total.sub(s.Cost)
		if l.under(total) {
			return s.at.Add(l.budget.Window).Sub(now)
		}
	}
	return rec[len(rec)-1].at.Add(l.budget.Window).Sub(now)
}

func (l *ledger) under(c Cost) bool {
	b := l.budget
	return (b.CPU <= 0 || c.CPU < b.CPU) && (b.Decompressed <= 0 || c.Decompressed < b.Decompressed) && (b.Spooled <= 0 || c.Spooled < b.Spooled)
}

// niceAfter gives the scheduling priority (nice) of a verification by
// the CPU time it has used: one that has run long yields the cores to
// those that just started, so that a small image's verdict does not wait
// for a large one's. The kernel's fair scheduler gives a nice 19 thread
// 1/68 of a nice 0 thread's share.
func niceAfter(cpu time.Duration) int {
	switch {
	case cpu < 2*time.Second:
		return 0
	case cpu < 20*time.Second:
		return 10
	default:
		return 19
	}
}

// renice sets the nice value of every thread of process pid (Linux keeps
// one per thread; new threads take their creator's).
func renice(pid, nice int) error {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		_ = unix.Setpriority(unix.PRIO_PROCESS, tid, nice) // a thread that ended meanwhile
	}
	return nil
}

// clockTick is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// every Linux platform Go supports).
const clockTick = 10 * time.Millisecond

// cpuTime is process pid's user and system time so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: fields are counted after its ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("no command name in /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// limitCPU has the kernel kill process pid once it has used limit of
// CPU time (RLIMIT_CPU, hard and soft alike: SIGKILL at the limit).
func limitCPU(pid int, limit time.Duration) error {
	secs := uint64((limit + time.Second - 1) / time.Second)
	return unix.Prlimit(pid, unix.RLIMIT_CPU, &unix.Rlimit{Cur: secs, Max: secs}, nil)
}
