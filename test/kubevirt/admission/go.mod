// This module only keeps the admission server's sources out of imagepipe's
// own module: they import kubevirt.io/kubevirt, whose go.mod replaces its
// staging modules with folders of its own repository, so they build only
// inside a copy of that tree (test/kubevirt/build-admission.sh).
module imagepipe.invalid/kubevirt-admission

go 1.26.0
