package vmlaunch

import (
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// The provider catalog's own example, as JSON with no types and no vm
// section: types come from the defaults, bindings from the names.
const simpleVM = `{"id":"simple_vm","title":"Simple VM Template","description":"CPU, memory, and boot volume size are configurable","parameters":[{"name":"vm_cpu_cores","default":{"value":2}},{"name":"vm_memory","default":{"value":"2Gi"}},{"name":"vm_disk_size","default":{"value":"20Gi"}}]}`

func TestParseTheProviderCatalogExample(t *testing.T) {
	tmpl, err := ParseTemplate([]byte(simpleVM))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]api.ParameterType{"vm_cpu_cores": api.TypeInteger, "vm_memory": api.TypeQuantity, "vm_disk_size": api.TypeQuantity}
	for _, p := range tmpl.Parameters {
		if want[p.Name] != p.Type {
			t.Errorf("parameter %s inferred as %s, want %s", p.Name, p.Type, want[p.Name])
		}
	}
	values, err := ResolveParameters(tmpl, []string{"vm_cpu_cores=4"})
	if err != nil {
		t.Fatal(err)
	}
	if values["vm_cpu_cores"].Int != 4 || values["vm_memory"].String() != "2Gi" {
		t.Errorf("values %v", values)
	}
}

func TestTemplateValidationNamesTheCulprit(t *testing.T) {
	for name, tc := range map[string]struct{ doc, want string }{
		"bad id":                 {`{"id":"Simple VM","title":"x"}`, `id "Simple VM"`},
		"no title":               {`{"id":"a"}`, "title"},
		"unknown field":          {`{"id":"a","title":"x","spec":{"domain":{}}}`, `unknown field "spec"`},
		"untyped, no default":    {`{"id":"a","title":"x","parameters":[{"name":"p"}]}`, "parameter p"},
		"bad type":               {`{"id":"a","title":"x","parameters":[{"name":"p","type":"float"}]}`, `parameter p: type "float"`},
		"default vs type":        {`{"id":"a","title":"x","parameters":[{"name":"p","type":"integer","default":{"value":"two"}}]}`, "parameter p: default"},
		"default out of bounds":  {`{"id":"a","title":"x","parameters":[{"name":"p","type":"integer","min":1,"max":8,"default":{"value":16}}]}`, "parameter p: default: 16 is above the maximum 8"},
		"min above max":          {`{"id":"a","title":"x","parameters":[{"name":"p","type":"quantity","min":"4Gi","max":"1Gi"}]}`, "parameter p: min is above max"},
		"duplicate":              {`{"id":"a","title":"x","parameters":[{"name":"p","type":"string"},{"name":"p","type":"string"}]}`, "parameter p: defined twice"},
		"binding to missing":     {`{"id":"a","title":"x","vm":{"memory":"${mem}"}}`, "vm.memory: refers to parameter mem"},
		"binding wrong type":     {`{"id":"a","title":"x","parameters":[{"name":"mem","type":"integer"}],"vm":{"memory":"${mem}"}}`, "parameter mem: binds vm.memory, which takes a quantity"},
		"partial reference":      {`{"id":"a","title":"x","vm":{"instancetype":"u1.${size}"}}`, "must be the whole value"},
		"bad literal":            {`{"id":"a","title":"x","vm":{"cpuCores":"many"}}`, "vm.cpuCores"},
		"host device to missing": {`{"id":"a","title":"x","vm":{"hostDevices":[{"name":"nic1","deviceName":"${nic}"}]}}`, "vm.hostDevices[0].deviceName: refers to parameter nic"},
		"bad device name":        {`{"id":"a","title":"x","vm":{"gpus":[{"name":"GPU_1","deviceName":"nvidia.com/x"}]}}`, `vm device name "GPU_1"`},
		"required with default":  {`{"id":"a","title":"x","parameters":[{"name":"p","type":"string","required":true,"default":{"value":"x"}}]}`, "parameter p: a required parameter has no default"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseTemplate([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := ParseTemplate([]byte(strings.Repeat(" ", api.MaxTemplateSize+1))); err == nil {
		t.Error("an oversized template was accepted")
	}
}

func TestResolveParametersErrorsNameTheParameter(t *testing.T) {
	tmpl, err := ParseTemplate([]byte(`
id: sized
title: Sized VM
parameters:
  - {name: vm_cpu_cores, type: integer, min: 1, max: 16, default: {value: 2}}
  - {name: vm_memory, type: quantity, min: 1Gi, max: 64Gi, default: {value: 4Gi}}
  - {name: flavor, type: string, enum: [small, large], default: {value: small}}
  - {name: gpu, type: boolean, default: {value: false}}
  - {name: owner, type: string, required: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		sets []string
		want string
	}{
		"unknown":       {[]string{"owner=a", "vm_disk=1Gi"}, "parameter vm_disk: template sized has no such parameter"},
		"not NAME=VAL":  {[]string{"owner=a", "vm_memory"}, `--set "vm_memory"`},
		"not integer":   {[]string{"owner=a", "vm_cpu_cores=two"}, `parameter vm_cpu_cores: "two" is not an integer`},
		"too many":      {[]string{"owner=a", "vm_cpu_cores=32"}, "parameter vm_cpu_cores: 32 is above the maximum 16"},
		"too little":    {[]string{"owner=a", "vm_memory=512Mi"}, "parameter vm_memory: 512Mi is below the minimum 1Gi"},
		"bad quantity":  {[]string{"owner=a", "vm_memory=lots"}, "parameter vm_memory"},
		"not in enum":   {[]string{"owner=a", "flavor=huge"}, "parameter flavor: huge is not one of small, large"},
		"not a boolean": {[]string{"owner=a", "gpu=maybe"}, "parameter gpu"},
		"required":      {nil, "parameter owner: required"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ResolveParameters(tmpl, tc.sets)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	v, err := ResolveParameters(tmpl, []string{"owner=ops", "vm_memory=8Gi", "flavor=large", "gpu=true"})
	if err != nil {
		t.Fatal(err)
	}
	if v["vm_memory"].String() != "8Gi" || v["flavor"].Str != "large" || !v["gpu"].Bool || v["vm_cpu_cores"].Int != 2 {
		t.Errorf("values %v", v)
	}
}

// TestUserDataParametersAreNotBoundedAsNames: a string parameter holds at
// most maxStringParam characters, unless it binds the user data (bounded by
// MaxUserData when rendered), whatever the parameter is called.
func TestUserDataParametersAreNotBoundedAsNames(t *testing.T) {
	long := "#cloud-config\n" + strings.Repeat("# a comment line\n", 40)
	for name, tc := range map[string]struct {
		doc, param string
		ok         bool
	}{
		"conventional name": {`{"id":"a","title":"x","parameters":[{"name":"vm_user_data","type":"string"}]}`, "vm_user_data", true},
		"explicit binding":  {`{"id":"a","title":"x","parameters":[{"name":"ud","type":"string"}],"vm":{"userData":"${ud}"}}`, "ud", true},
		"other string":      {`{"id":"a","title":"x","parameters":[{"name":"ud","type":"string"}],"vm":{"network":"${ud}"}}`, "ud", false},
	} {
		t.Run(name, func(t *testing.T) {
			tmpl, err := ParseTemplate([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			_, err = ResolveParameters(tmpl, []string{tc.param + "=" + long})
			if ok := err == nil; ok != tc.ok {
				t.Errorf("a %d-character value: error %v, want accepted %v", len(long), err, tc.ok)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), "over the limit of 253")) {
				t.Errorf("error %v, want the length limit named", err)
			}
		})
	}
}
