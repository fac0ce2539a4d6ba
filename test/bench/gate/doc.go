// Package gate is the image-gate part of `make bench` (test/bench/gate.sh):
// what the gate adds to an import of the 4 GiB ext4 bench image, how often
// imagepipe reads the tenant's layer, and the gate's peak memory with four
// verifications at once; what a layer costs when many manifests and an
// index name it; and how long a small image waits for its verdict while
// other tenants' long verifications run.
package gate
