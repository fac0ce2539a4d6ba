// Package images tests the container images that `make images` and `make
// release-config` build and push (hack/imagebuild), as a provider uses
// them: it runs the make targets against the real CNCF distribution
// registry, reads the result back with independent clients (skopeo and
// crane), runs the binaries from the extracted amd64 root filesystem, also
// chrooted as the image's user, checks the arm64 binaries' ELF headers, the
// CA bundle, the SBOM referrers and that a second build gives the same
// digests, and renders config/default with kubectl kustomize to check the
// Deployment runs the pushed image by digest, as the image's user, with the
// image's entrypoint.
package images
