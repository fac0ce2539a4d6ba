package cdi
import (
	_ "sigs.k8s.io/controller-runtime/pkg/manager"
	_ "sigs.k8s.io/controller-runtime/pkg/client"
	_ "sigs.k8s.io/controller-runtime/pkg/metrics"
	_ "github.com/prometheus/client_golang/prometheus"
)
