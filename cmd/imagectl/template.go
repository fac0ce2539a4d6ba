package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/catalog"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// catalogFlags name the template catalog.
type catalogFlags struct {
	registryFlags
	catalog string
}

func addCatalogFlags(cmd *cobra.Command, f *catalogFlags) {
	addRegistryFlags(cmd, &f.registryFlags)
	cmd.Flags().StringVar(&f.catalog, "catalog", os.Getenv("IMAGEPIPE_CATALOG"),
		"template catalog REGISTRY[/REPO] (repository default "+api.DefaultTemplateRepository+"; default $IMAGEPIPE_CATALOG)")
}

// open returns the registry client and the catalog repository.
func (f *catalogFlags) open(g *globalOptions) (*catalog.Catalog, error) {
	if f.catalog == "" {
		return nil, &usageError{errors.New("name the template catalog with --catalog REGISTRY[/REPO] or $IMAGEPIPE_CATALOG")}
	}
	s := f.catalog
	if !strings.Contains(s, "/") {
		s += "/" + api.DefaultTemplateRepository
	}
	c, err := f.client(g)
	if err != nil {
		return nil, err
	}
	ref, err := imageref.Parse(s, imageref.FormRepository)
	if err != nil {
		return nil, fmt.Errorf("--catalog: %w", err)
	}
	repo, err := f.names().Repository(ref)
	if err != nil {
		return nil, fmt.Errorf("--catalog: %w", err)
	}
	return catalog.Open(c, repo), nil
}

func newTemplateCmd(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Publish, list, show and delete VM templates in the registry's template catalog",
		Long: `Providers publish VM templates to a catalog repository in the central registry,
as OCI artifacts of type ` + api.TemplateArtifactType + `, one tag per template ID.
Tenants list them and create VMs from them with imagectl vm create.

Under -o name the template commands print each template's catalog entry,
REGISTRY/REPO:ID.`,
	}
	groupCommand(cmd)
	cmd.AddCommand(newTemplatePublishCmd(g), newTemplateListCmd(g), newTemplateShowCmd(g), newTemplateDeleteCmd(g))
	return cmd
}

// templateOptions are the options of every template subcommand.
type templateOptions struct {
	*globalOptions
	catalogFlags
	out outputFlags
}

func newTemplatePublishCmd(g *globalOptions) *cobra.Command {
	o := &templateOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "publish FILE|DIR... --catalog REGISTRY[/REPO]",
		Short: "Validate templates and publish them; unchanged ones are not pushed again",
		Long: `Reads template files (YAML or JSON; a directory is searched for *.yaml, *.yml
and *.json files, as kept in Git), validates every one, and publishes them only
if all are valid. A template whose catalog entry already holds the same
document is left as it is.`,
		Example: `  imagectl template publish templates/ --catalog registry.example.com
  imagectl template publish simple_vm.yaml --catalog registry.example.com/provider-templates`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runTemplatePublish(cmd, o, args) },
	}
	addCatalogFlags(cmd, &o.catalogFlags)
	addOutputFlag(cmd, &o.out, listFormats...)
	return cmd
}

// templateFiles expands directories into their template files, sorted.
func templateFiles(args []string) ([]string, error) {
	var files []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, a)
			continue
		}
		err = filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			switch strings.ToLower(filepath.Ext(p)) {
			case ".yaml", ".yml", ".json":
				if !d.IsDir() {
					files = append(files, p)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, errors.New("no template files (*.yaml, *.yml, *.json) found")
	}
	return files, nil
}

// templateDoc is a validated template file and the JSON document
// published for it.
type templateDoc struct {
	file string
	t    *api.VMTemplate
	json []byte
}

// readTemplates reads and validates every file, refusing two with the
// same template ID; the errors of all files come together.
func readTemplates(files []string) ([]templateDoc, error) {
	var docs []templateDoc
	var errs []error
	byID := map[string]string{}
	for _, f := range files {
		data, err := readBounded(f, api.MaxTemplateSize)
		if err == nil {
			var t *api.VMTemplate
			if t, err = vmlaunch.ParseTemplate(data); err == nil {
				if other, dup := byID[t.ID]; dup {
					err = fmt.Errorf("template id %q is also defined in %s", t.ID, other)
				} else {
					byID[t.ID] = f
					var js []byte
					js, err = json.Marshal(t)
					docs = append(docs, templateDoc{f, t, js})
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
		}
	}
	return docs, errors.Join(errs...)
}

func runTemplatePublish(cmd *cobra.Command, o *templateOptions, args []string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	files, err := templateFiles(args)
	if err != nil {
		return err
	}
	docs, err := readTemplates(files)
	if err != nil {
		return fmt.Errorf("nothing published:\n%w", err)
	}
	cat, err := o.open(o.globalOptions)
	if err != nil {
		return err
	}
	results := []api.PublishResult{}
	for _, d := range docs {
		dgst, unchanged, err := cat.Publish(cmd.Context(), d.t.ID, d.json)
		if err != nil {
			return err
		}
		results = append(results, api.PublishResult{ID: d.t.ID, File: d.file, Digest: dgst, Unchanged: unchanged, Reference: cat.Ref(d.t.ID)})
	}
	names := make([]string, len(results))
	for i, r := range results {
		names[i] = r.Reference
	}
	return o.out.show(cmd.OutOrStdout(), view{data: results, names: names, table: func(w io.Writer, wide bool) error {
		return table(func(tw *tabwriter.Writer) {
			fmt.Fprintln(tw, "ID\tFILE\tDIGEST\tSTATUS")
			for _, r := range results {
				status := "published"
				if r.Unchanged {
					status = "unchanged"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, r.File, digestColumn(r.Digest, wide), status)
			}
		})(w)
	}})
}

// digestColumn shows a digest in full in a wide table, else shortened.
func digestColumn(d string, wide bool) string {
	if wide {
		return d
	}
	return shortDigest(d)
}

// readBounded reads a file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%d bytes, over the limit of %d", st.Size(), limit)
	}
	return os.ReadFile(path)
}

func newTemplateListCmd(g *globalOptions) *cobra.Command {
	o := &templateOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "list --catalog REGISTRY[/REPO]",
		Short: "List the templates of a catalog",
		Long: `Lists the templates of a catalog: ID, title, number of parameters and digest.
-o wide adds the description and the full digest; -o name prints each
template's catalog entry, REGISTRY/REPO:ID.`,
		Args:              cobra.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return runTemplateList(cmd, o) },
	}
	addCatalogFlags(cmd, &o.catalogFlags)
	addOutputFlag(cmd, &o.out, listFormats...)
	return cmd
}

func runTemplateList(cmd *cobra.Command, o *templateOptions) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	cat, err := o.open(o.globalOptions)
	if err != nil {
		return err
	}
	entries, err := cat.List(cmd.Context())
	if err != nil {
		return err
	}
	out := []api.TemplateSummary{}
	for _, e := range entries {
		t, err := vmlaunch.ParseTemplate(e.Doc)
		if err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "imagectl: skipping catalog entry %s: %v\n", e.ID, err)
			continue
		}
		out = append(out, api.TemplateSummary{ID: t.ID, Title: t.Title, Description: t.Description, Parameters: len(t.Parameters), Digest: e.Digest, Reference: cat.Ref(t.ID)})
	}
	names := make([]string, len(out))
	for i, s := range out {
		names[i] = s.Reference
	}
	return o.out.show(cmd.OutOrStdout(), view{data: out, names: names, table: func(w io.Writer, wide bool) error {
		return table(func(tw *tabwriter.Writer) {
			fmt.Fprint(tw, "ID\tTITLE\tPARAMETERS\tDIGEST")
			if wide {
				fmt.Fprint(tw, "\tDESCRIPTION")
			}
			fmt.Fprintln(tw)
			for _, s := range out {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s", s.ID, s.Title, s.Parameters, digestColumn(s.Digest, wide))
				if wide {
					fmt.Fprintf(tw, "\t%s", orDash(oneLine(s.Description)))
				}
				fmt.Fprintln(tw)
			}
		})(w)
	}})
}

// oneLine joins the lines of s with spaces, for a table cell.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func newTemplateShowCmd(g *globalOptions) *cobra.Command {
	o := &templateOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:               "show ID --catalog REGISTRY[/REPO]",
		Short:             "Show one template: its parameters, their types, defaults and bounds",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeTemplateArg(o),
		RunE:              func(cmd *cobra.Command, args []string) error { return runTemplateShow(cmd, o, args[0]) },
	}
	addCatalogFlags(cmd, &o.catalogFlags)
	addOutputFlag(cmd, &o.out, outputYAML, outputJSON, outputName)
	return cmd
}

func runTemplateShow(cmd *cobra.Command, o *templateOptions, id string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	cat, err := o.open(o.globalOptions)
	if err != nil {
		return err
	}
	t, err := fetchTemplate(cmd, cat, id)
	if err != nil {
		return err
	}
	return o.out.show(cmd.OutOrStdout(), view{data: t, names: []string{cat.Ref(t.ID)}})
}

func newTemplateDeleteCmd(g *globalOptions) *cobra.Command {
	o := &templateOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "delete ID --catalog REGISTRY[/REPO]",
		Short: "Delete a template from the catalog",
		Long: `Deletes the template ID from the catalog: its manifest, and with it its tag,
so that template list no longer names it. VMs created from it are not
affected. An ID the catalog does not hold, or a tag that is not a template,
is refused; so is a template whose manifest another tag also names, since the
registry would remove that tag too.

The registry must allow deletes (distribution: storage.delete.enabled).`,
		Example:           `  imagectl template delete web_vm --catalog registry.example.com`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeTemplateArg(o),
		RunE:              func(cmd *cobra.Command, args []string) error { return runTemplateDelete(cmd, o, args[0]) },
	}
	addCatalogFlags(cmd, &o.catalogFlags)
	addOutputFlag(cmd, &o.out, resultFormats...)
	return cmd
}

func runTemplateDelete(cmd *cobra.Command, o *templateOptions, id string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	cat, err := o.open(o.globalOptions)
	if err != nil {
		return err
	}
	dgst, err := cat.Delete(cmd.Context(), id)
	var shared *registry.SharedImageError
	switch {
	case errors.Is(err, catalog.ErrNotFound):
		return noTemplateError(cat, id, err)
	case errors.As(err, &shared):
		return fmt.Errorf("template %s was not deleted: its manifest %s is also tagged %s, which the registry would remove with it; delete those tags first", id, shared.Digest, strings.Join(shared.Others, ", "))
	case err != nil:
		return err
	}
	res := api.TemplateDeleteResult{ID: id, Reference: cat.Ref(id), Digest: dgst}
	return o.out.show(cmd.OutOrStdout(), view{data: res, names: []string{res.Reference}, table: func(w io.Writer, _ bool) error {
		_, err := fmt.Fprintf(w, "template %s deleted from %s (%s)\n", id, cat, shortDigest(dgst))
		return err
	}})
}

// noTemplateError says that the catalog has no template id; err, the
// registry's, stays underneath for the reason code (not-found).
func noTemplateError(cat *catalog.Catalog, id string, err error) error {
	return &messageError{fmt.Sprintf("the catalog %s has no template %q; imagectl template list shows those it has", cat, id), err}
}

// messageError is err said in other words.
type messageError struct {
	msg string
	err error
}

func (e *messageError) Error() string { return e.msg }
func (e *messageError) Unwrap() error { return e.err }

// completeTemplateArg completes a template ID as the first argument.
func completeTemplateArg(o *templateOptions) cobra.CompletionFunc {
	ids := completeTemplateIDs(o.globalOptions, &o.catalogFlags)
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return ids(cmd, args, toComplete)
	}
}

// completeTemplateIDs completes a template ID from the catalog that
// --catalog (or $IMAGEPIPE_CATALOG) names, with one tag listing.
func completeTemplateIDs(g *globalOptions, f *catalogFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if f.passwordStdin || f.username != "" {
			// The shell's standard input is not the user's password, and
			// completion must not stop at a password prompt.
			cobra.CompErrorln("not completing template IDs with --username")
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		cat, err := f.open(g)
		if err == nil {
			var ids []string
			if ids, err = cat.IDs(ctx); err == nil {
				return withPrefix(ids, toComplete), cobra.ShellCompDirectiveNoFileComp
			}
		}
		cobra.CompErrorln(err.Error())
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
}

// fetchTemplate reads and validates one template from the catalog.
func fetchTemplate(cmd *cobra.Command, cat *catalog.Catalog, id string) (*api.VMTemplate, error) {
	e, err := cat.Fetch(cmd.Context(), id)
	if err != nil {
		if errors.Is(err, catalog.ErrNotFound) {
			return nil, noTemplateError(cat, id, err)
		}
		return nil, err
	}
	t, err := vmlaunch.ParseTemplate(e.Doc)
	if err != nil {
		return nil, fmt.Errorf("catalog entry %s: %w", id, err)
	}
	return t, nil
}
