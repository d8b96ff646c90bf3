package metrics

import (
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
)

// The host's CPU and memory, from /proc, so a scrape shows them beside the
// sandboxes and operations in flight that use them.
var (
	hostCPUsDesc = prometheus.NewDesc("agentenv_host_cpus",
		"CPUs of the host.", nil, nil)
	hostCPUDesc = prometheus.NewDesc("agentenv_host_cpu_seconds_total",
		"CPU time of the whole host: busy (user, system, interrupts, steal) or idle (idle, iowait).", []string{"mode"}, nil)
	hostMemDesc = prometheus.NewDesc("agentenv_host_memory_bytes",
		"Memory of the host.", nil, nil)
	hostMemAvailDesc = prometheus.NewDesc("agentenv_host_memory_available_bytes",
		"Memory of the host available without swapping (MemAvailable).", nil, nil)
	hostLoadDesc = prometheus.NewDesc("agentenv_host_load1",
		"The host's one-minute load average.", nil, nil)
)

type hostCollector struct {
	fs   procfs.FS
	err  error
	once sync.Once // logs an unreadable /proc once, not at every scrape
}

func newHostCollector() *hostCollector {
	fs, err := procfs.NewDefaultFS()
	return &hostCollector{fs: fs, err: err}
}

func (c *hostCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{hostCPUsDesc, hostCPUDesc, hostMemDesc, hostMemAvailDesc, hostLoadDesc} {
		ch <- d
	}
}

func (c *hostCollector) Collect(ch chan<- prometheus.Metric) {
	if c.err != nil {
		c.once.Do(func() { slog.Warn("host metrics unavailable", "err", c.err) })
		return
	}
	if st, err := c.fs.Stat(); err == nil {
		busy, idle := cpuTimes(st.CPUTotal)
		ch <- prometheus.MustNewConstMetric(hostCPUsDesc, prometheus.GaugeValue, float64(len(st.CPU)))
		ch <- prometheus.MustNewConstMetric(hostCPUDesc, prometheus.CounterValue, busy, "busy")
		ch <- prometheus.MustNewConstMetric(hostCPUDesc, prometheus.CounterValue, idle, "idle")
	}
	if mi, err := c.fs.Meminfo(); err == nil && mi.MemTotalBytes != nil {
		ch <- prometheus.MustNewConstMetric(hostMemDesc, prometheus.GaugeValue, float64(*mi.MemTotalBytes))
		if mi.MemAvailableBytes != nil {
			ch <- prometheus.MustNewConstMetric(hostMemAvailDesc, prometheus.GaugeValue, float64(*mi.MemAvailableBytes))
		}
	}
	if la, err := c.fs.LoadAvg(); err == nil {
		ch <- prometheus.MustNewConstMetric(hostLoadDesc, prometheus.GaugeValue, la.Load1)
	}
}

// cpuTimes splits the host's CPU seconds into busy (user, system,
// interrupts, steal) and idle (idle, iowait). Guest time is already in
// user.
func cpuTimes(t procfs.CPUStat) (busy, idle float64) {
	return t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ + t.Steal, t.Idle + t.Iowait
}
