// Package oracle holds imagectl to qemu-img, the reference implementation:
// for every image qemu-img can make, inspect must agree with qemu-img info
// and map, and each output format must pass qemu-img check and compare
// identical to its source.
package oracle
