// Package vmlaunch turns a provider's VM template and a tenant's parameters
// into a KubeVirt VirtualMachine that boots from a synced base image, and
// runs the VM's life on a hub for imagectl: create, start, stop, restart,
// migrate, delete, attach and detach volumes.
//
// A template (api.VMTemplate) names typed parameters and binds them, or
// literals, to a fixed list of VM fields; bindings.go holds that list as
// one table which both validation (template.go) and rendering (render.go)
// read. Render builds the VM in parts — compute, root disk, network,
// devices, cloud-init — and says whether it can live-migrate and why not.
// The root disk clones the image's CDI DataSource, which image-syncer
// keeps, and boots with the firmware and disk bus its guest facts call
// for unless the template pins them; vmlaunch never reconciles images.
package vmlaunch
