package main

import (
	"flag"
	"io"
	"log/slog"
	"strconv"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
)

// setUpLogging makes the syncer's logger from --log-format and --log-level,
// writing to w, and routes every other logging API in the process through
// its handler, so that every line has the same format and obeys the same
// level: controller-runtime (logr), klog, which client-go, leader election
// and the event broadcaster write to (its lines carry logger=klog), and the
// standard library's log package (net/http's server errors). klog's
// verbosity follows the level: info shows V(0), debug V(1) to V(4).
func (o *options) setUpLogging(w io.Writer) (*slog.Logger, error) {
	level, err := o.daemon.Level()
	if err != nil {
		return nil, err
	}
	h, err := o.daemon.Handler(w)
	if err != nil {
		return nil, err
	}
	ctrl.SetLogger(logr.FromSlogHandler(h))
	klog.SetLoggerWithOptions(logr.FromSlogHandler(h).WithName("klog"), klog.ContextualLogger(true))
	// logr's V(n) is slog level -n, so klog.V(n) passes the handler's level
	// exactly when n <= -level; klog drops the rest before formatting them.
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("v", strconv.Itoa(max(0, -int(level))))
	log := slog.New(h)
	slog.SetDefault(log)
	return log, nil
}
