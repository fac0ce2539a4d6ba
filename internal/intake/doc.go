// Package intake learns of changes in the central registry: it parses the
// webhook notifications of the CNCF distribution registry, Harbor, Quay and
// zot into Events, serves the authenticated HTTP endpoint they arrive at,
// polls the registry for what webhooks missed, and coalesces the events per
// image in a retrying work Queue.
//
// It knows nothing of Kubernetes controllers: the hub package turns the
// queued events into BaseImages.
package intake
