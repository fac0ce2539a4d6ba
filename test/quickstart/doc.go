// Package quickstart runs the quick start of the README as written: the sh
// blocks of its "Quick start" section, in order, as one bash script in the
// repository's root, against a real registry and a hub with image-syncer
// and CDI's real controller, with the variables the README names
// (REGISTRY, KUBECONFIG) pointing at them. A command of the README that
// fails fails the test.
package quickstart
