package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of BaseImage, PrivateNetwork
// and LoadBalancer.
var GroupVersion = schema.GroupVersion{Group: "imagepipe.io", Version: "v1alpha1"}

// AddToScheme registers the types of this package in a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &BaseImage{}, &BaseImageList{}, &PrivateNetwork{}, &PrivateNetworkList{}, &LoadBalancer{}, &LoadBalancerList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
