// Package hub tests imagepipe's Kubernetes API on real local hubs.
package hub
