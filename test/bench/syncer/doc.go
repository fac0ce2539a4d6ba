// Package syncer is the image-syncer part of `make bench`: it measures webhook-to-DataVolume
// latency on two hubs and the cost of a no-change resync of 5,000 images, against real hubs
// (etcd + kube-apiserver), the real distribution registry and the image-syncer binary.
//
// Its test runs only with IMAGEPIPE_BENCH=1, so that `go test ./...` stays fast;
// test/bench/syncer.sh runs it and prints the Markdown section bench.sh appends to its report.
package syncer
