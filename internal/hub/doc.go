// Package hub keeps tenant images replicated onto one hub cluster: the
// Applier turns registry events into BaseImages, and the Reconciler drives
// each BaseImage to a digest-pinned CDI DataVolume and a DataSource serving
// it, then collects old imports.
//
// The reconciler is split by job: reconciler.go holds the type, its setup
// and the dispatch of one Reconcile, which writes the status in one place;
// import.go revalidates and imports a digest; serve.go points the
// DataSource at a finished import, with the guest's facts and KubeVirt's
// preference from preference.go's table (built in, or a provider's
// ConfigMap); gc.go deletes imports beyond the
// retention and applies the deletion policy; events.go turns the status
// transitions worth a person's attention (rejections, retries, giving up)
// into Kubernetes Events on the BaseImage, once the status is stored. Around it: tenancy (which
// tenants this hub serves, in which namespace), tenants' registry
// credentials, ownership checks before anything is changed, Prometheus
// metrics, and the syncer's loops as manager runnables (Workers, PollLoop,
// WebhookServer) fed by the intake package.
package hub
