// Package registry tests `imagectl import` against the real CNCF
// distribution registry, with skopeo as an independent client and qemu-img
// as the oracle, including broken connections and a registry that dies.
package registry
