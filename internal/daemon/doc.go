// Package daemon is the runtime image-syncer and image-gate share, so that
// both behave alike where they do the same thing.
//
// Flags registers their common flags once, each with one meaning: the
// registry and their own credential to it, the webhook, the poll
// intervals, the metrics and health addresses, logging and the shutdown
// timeout. A listener address that is empty or "0" turns that listener
// off. From the flags come the registry client and the logger.
//
// Server serves one HTTP endpoint until its context ends, with bounded
// request timeouts and a graceful shutdown. PollLoop lists the registry
// for what webhooks missed: a fast pass every interval, a full one every
// resync, fast passes waiting a bounded number of times while the daemon
// is still working through earlier events.
//
// It links no controller stack: image-gate runs without one, and
// image-syncer wraps Server and PollLoop as manager runnables (internal/hub).
package daemon
