package vmlaunch

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/pkg/api"
)

var (
	templateIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)
	paramNamePattern  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,62}$`)
	referencePattern  = regexp.MustCompile(`^\$\{([A-Za-z][A-Za-z0-9_]{0,62})\}$`)
	resourceName      = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?(/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
)

// isDNSLabel reports whether s is a DNS-1123 label, as Kubernetes names
// namespaces, VMs and networks.
func isDNSLabel(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }

// isDNSSubdomain reports whether s is a DNS-1123 subdomain, as Kubernetes
// names Secrets, PVCs and storage classes.
func isDNSSubdomain(s string) bool { return len(validation.IsDNS1123Subdomain(s)) == 0 }

// maxStringParam bounds a string parameter's value (user data excepted:
// it goes into a Secret, bounded by MaxUserData).
const maxStringParam = 253

// MaxUserData bounds cloud-init user data, in bytes.
const MaxUserData = 64 << 10

// ParseTemplate reads a template document (YAML or JSON), refusing unknown
// fields and documents over api.MaxTemplateSize, and validates it.
func ParseTemplate(data []byte) (*api.VMTemplate, error) {
	if len(data) > api.MaxTemplateSize {
		return nil, fmt.Errorf("the template is %d bytes, over the %d-byte limit", len(data), api.MaxTemplateSize)
	}
	var t api.VMTemplate
	if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return nil, fmt.Errorf("parsing the template: %w", err)
	}
	if err := ValidateTemplate(&t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ValidateTemplate checks a template and fills in each parameter's type
// from its default when it has none. Every error names the template and,
// where one is at fault, the parameter or field.
func ValidateTemplate(t *api.VMTemplate) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !templateIDPattern.MatchString(t.ID) {
		fail("id %q: want lower-case letters, digits, '_' and '-', at most 63 characters", t.ID)
	}
	if strings.TrimSpace(t.Title) == "" {
		fail("title: required")
	}
	if len(t.Parameters) > api.MaxTemplateParameters {
		fail("%d parameters, over the limit of %d", len(t.Parameters), api.MaxTemplateParameters)
	}
	seen := map[string]bool{}
	long := longTextParams(t)
	for i := range t.Parameters {
		p := &t.Parameters[i]
		if err := validateParameter(p, long[p.Name]); err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[p.Name] {
			fail("parameter %s: defined twice", p.Name)
		}
		seen[p.Name] = true
	}
	if len(errs) == 0 {
		errs = append(errs, validateBindings(t)...)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("template %q is invalid:\n%w", t.ID, err)
	}
	return nil
}

// validateParameter checks one parameter; long is set when it binds a
// field whose length is bounded elsewhere (longTextParams).
func validateParameter(p *api.Parameter, long bool) error {
	if !paramNamePattern.MatchString(p.Name) {
		return fmt.Errorf("parameter %q: names start with a letter and hold letters, digits and '_'", p.Name)
	}
	if p.Type == "" {
		if p.Default == nil {
			return fmt.Errorf("parameter %s: give a type or a default to infer it from", p.Name)
		}
		p.Type = inferType(p.Default.Value)
	}
	switch p.Type {
	case api.TypeInteger, api.TypeString, api.TypeQuantity, api.TypeBoolean:
	default:
		return fmt.Errorf("parameter %s: type %q is not integer, string, quantity or boolean", p.Name, p.Type)
	}
	if p.Required && p.Default != nil {
		return fmt.Errorf("parameter %s: a required parameter has no default", p.Name)
	}
	for what, v := range map[string]any{"min": p.Min, "max": p.Max} {
		if v == nil {
			continue
		}
		if p.Type != api.TypeInteger && p.Type != api.TypeQuantity {
			return fmt.Errorf("parameter %s: %s applies to integers and quantities only", p.Name, what)
		}
		if _, err := parseValue(p.Type, v); err != nil {
			return fmt.Errorf("parameter %s: %s: %w", p.Name, what, err)
		}
	}
	if p.Min != nil && p.Max != nil {
		lo, _ := parseValue(p.Type, p.Min)
		hi, _ := parseValue(p.Type, p.Max)
		if lo.compare(hi) > 0 {
			return fmt.Errorf("parameter %s: min is above max", p.Name)
		}
	}
	for _, e := range p.Enum {
		if _, err := parseValue(p.Type, e); err != nil {
			return fmt.Errorf("parameter %s: enum value %v: %w", p.Name, e, err)
		}
	}
	if p.Default != nil {
		v, err := parseValue(p.Type, p.Default.Value)
		if err != nil {
			return fmt.Errorf("parameter %s: default: %w", p.Name, err)
		}
		if err := checkBounds(p, v, long); err != nil {
			return fmt.Errorf("parameter %s: default: %w", p.Name, err)
		}
	}
	return nil
}

// inferType reads a parameter's type from its default: numbers are
// integers, booleans booleans, strings with a unit quantities ("2Gi").
func inferType(v any) api.ParameterType {
	switch x := v.(type) {
	case bool:
		return api.TypeBoolean
	case float64, int, int64, json.Number:
		return api.TypeInteger
	case string:
		if q, err := resource.ParseQuantity(x); err == nil && strings.TrimLeft(x, "0123456789.") != "" && !q.IsZero() {
			return api.TypeQuantity
		}
	}
	return api.TypeString
}

// Value is a typed parameter or field value.
type Value struct {
	Type     api.ParameterType
	Int      int64
	Str      string
	Quantity resource.Quantity
	Bool     bool
}

func (v Value) String() string {
	switch v.Type {
	case api.TypeInteger:
		return strconv.FormatInt(v.Int, 10)
	case api.TypeQuantity:
		return v.Quantity.String()
	case api.TypeBoolean:
		return strconv.FormatBool(v.Bool)
	}
	return v.Str
}

// compare orders two integers or two quantities.
func (v Value) compare(o Value) int {
	if v.Type == api.TypeQuantity {
		return v.Quantity.Cmp(o.Quantity)
	}
	switch {
	case v.Int < o.Int:
		return -1
	case v.Int > o.Int:
		return 1
	}
	return 0
}

func (v Value) equal(o Value) bool {
	if v.Type == api.TypeInteger || v.Type == api.TypeQuantity {
		return v.compare(o) == 0
	}
	return v.String() == o.String()
}

// parseValue reads a value of type typ from a document value (number,
// bool, string) or from a --set string.
func parseValue(typ api.ParameterType, raw any) (Value, error) {
	v := Value{Type: typ}
	s := fmt.Sprint(raw)
	switch typ {
	case api.TypeInteger:
		switch x := raw.(type) {
		case float64:
			if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
				return v, fmt.Errorf("%v is not an integer", raw)
			}
			v.Int = int64(x)
			return v, nil
		case int:
			v.Int = int64(x)
			return v, nil
		case int64:
			v.Int = x
			return v, nil
		}
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return v, fmt.Errorf("%q is not an integer", s)
		}
		v.Int = n
	case api.TypeQuantity:
		q, err := resource.ParseQuantity(strings.TrimSpace(s))
		if err != nil {
			return v, fmt.Errorf("%q is not a quantity such as 2Gi or 500M", s)
		}
		if q.Sign() < 0 {
			return v, fmt.Errorf("%q is negative", s)
		}
		v.Quantity = q
	case api.TypeBoolean:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return v, fmt.Errorf("%q is not true or false", s)
		}
		v.Bool = b
	case api.TypeString:
		if _, ok := raw.(string); !ok && raw != nil {
			return v, fmt.Errorf("%v is not a string", raw)
		}
		v.Str = s
	}
	return v, nil
}

// checkBounds applies a parameter's min, max and enum to v, and bounds a
// string's length unless long is set (longTextParams).
func checkBounds(p *api.Parameter, v Value, long bool) error {
	if p.Min != nil {
		if lo, _ := parseValue(p.Type, p.Min); v.compare(lo) < 0 {
			return fmt.Errorf("%s is below the minimum %s", v, lo)
		}
	}
	if p.Max != nil {
		if hi, _ := parseValue(p.Type, p.Max); v.compare(hi) > 0 {
			return fmt.Errorf("%s is above the maximum %s", v, hi)
		}
	}
	if len(p.Enum) > 0 {
		var allowed []string
		for _, e := range p.Enum {
			ev, _ := parseValue(p.Type, e)
			if ev.equal(v) {
				return nil
			}
			allowed = append(allowed, ev.String())
		}
		return fmt.Errorf("%s is not one of %s", v, strings.Join(allowed, ", "))
	}
	if p.Type == api.TypeString && len(v.Str) > maxStringParam && !long {
		return fmt.Errorf("%d characters, over the limit of %d", len(v.Str), maxStringParam)
	}
	return nil
}

// ResolveParameters applies --set values (NAME=VALUE) over the template's
// defaults. Every error names the parameter: unknown, malformed, out of
// bounds, or required and unset.
func ResolveParameters(t *api.VMTemplate, sets []string) (map[string]Value, error) {
	params := map[string]*api.Parameter{}
	for i := range t.Parameters {
		params[t.Parameters[i].Name] = &t.Parameters[i]
	}
	given := map[string]string{}
	long := longTextParams(t)
	var errs []error
	for _, kv := range sets {
		name, val, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("--set %q: want NAME=VALUE", kv))
		case params[name] == nil:
			errs = append(errs, fmt.Errorf("parameter %s: template %s has no such parameter (it has: %s)", name, t.ID, strings.Join(slices.Sorted(maps.Keys(params)), ", ")))
		default:
			given[name] = val
		}
	}
	values := map[string]Value{}
	for _, p := range t.Parameters {
		raw, ok := given[p.Name]
		var v Value
		var err error
		switch {
		case ok:
			v, err = parseValue(p.Type, raw)
		case p.Default != nil:
			v, err = parseValue(p.Type, p.Default.Value)
		case p.Required:
			errs = append(errs, fmt.Errorf("parameter %s: required; set it with --set %s=VALUE", p.Name, p.Name))
			continue
		default:
			continue // optional without a default: its binding stays unset
		}
		if err == nil {
			err = checkBounds(&p, v, long[p.Name])
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("parameter %s: %w", p.Name, err))
			continue
		}
		values[p.Name] = v
	}
	return values, errors.Join(errs...)
}

// bindings returns the template's bindings: its vm section, or the
// conventional names.
func bindings(t *api.VMTemplate) (b api.VMBindings, explicit bool) {
	if t.VM != nil {
		return *t.VM, true
	}
	return api.DefaultBindings, false
}

// validateBindings checks that each bound field is a valid literal or a
// reference to a parameter of the field's type.
func validateBindings(t *api.VMTemplate) []error {
	b, explicit := bindings(t)
	types := map[string]api.ParameterType{}
	for _, p := range t.Parameters {
		types[p.Name] = p.Type
	}
	var errs []error
	eachBinding(b, func(field string, typ api.ParameterType, text string) {
		if m := referencePattern.FindStringSubmatch(text); m != nil {
			pt, ok := types[m[1]]
			switch {
			case !ok && explicit:
				errs = append(errs, fmt.Errorf("vm.%s: refers to parameter %s, which the template does not define", field, m[1]))
			case ok && pt != typ:
				errs = append(errs, fmt.Errorf("parameter %s: binds vm.%s, which takes a %s, but is a %s", m[1], field, typ, pt))
			}
			return
		}
		if strings.Contains(text, "${") {
			errs = append(errs, fmt.Errorf("vm.%s: %q: a reference must be the whole value, ${NAME}", field, text))
			return
		}
		if _, err := parseValue(typ, text); err != nil {
			errs = append(errs, fmt.Errorf("vm.%s: %w", field, err))
		}
	})
	for _, vb := range vmBindings {
		if text := vb.text(&b); vb.values != nil && text != "" && !strings.Contains(text, "${") && !slices.Contains(vb.values, text) {
			errs = append(errs, fmt.Errorf("vm.%s: %q: want one of %s", vb.field, text, strings.Join(vb.values, ", ")))
		}
	}
	for _, dl := range vmDeviceLists {
		for _, d := range dl.list(&b) {
			if explicit && !isDNSLabel(d.Name) {
				errs = append(errs, fmt.Errorf("vm device name %q is not a valid name", d.Name))
			}
		}
	}
	return errs
}

// bound resolves one binding text against the parameter values: the
// parameter's value for a reference (ok false when the parameter is unset
// or absent), else the literal.
func bound(text string, typ api.ParameterType, values map[string]Value) (Value, bool, error) {
	if text == "" {
		return Value{}, false, nil
	}
	if m := referencePattern.FindStringSubmatch(text); m != nil {
		v, ok := values[m[1]]
		return v, ok, nil
	}
	v, err := parseValue(typ, text)
	return v, err == nil, err
}
