package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Phases of an image on a hub besides the BaseImage's own.
const (
	phaseNotSynced   = "NotSynced"
	phaseUnreachable = "Unreachable"
)

// exitNotReady is status's exit code when the image is not Ready on every
// hub yet, and nothing failed.
const exitNotReady = 2

type statusOptions struct {
	*globalOptions
	kubeconfig, namespace string
	hubs                  []string
	wait                  bool
	timeout               time.Duration
	out                   outputFlags
}

func newStatusCmd(g *globalOptions) *cobra.Command {
	o := &statusOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "status [TENANT/IMAGE[:TAG]]",
		Short: "Show each hub's copy of synced images: phase, digest, since when, and why not Ready",
		Long: `Show, for each hub, the images image-syncer synced into the tenant's
namespace there, or one image: its phase, the digest the hub serves, since
when, and the reason code when it is not Ready. The hubs are the
kubeconfig's contexts (--hubs picks some); each context's namespace is the
tenant's namespace on that hub, unless -n names one for all.

With an image, the exit code tells a script where it stands: 0 when the
image is Ready on every hub asked, 2 when it is not yet on some (pending,
importing, not synced), 3 when a hub rejected it or its import failed, 1
when a hub could not be asked. --wait waits until the image is Ready on
every hub, or rejected or failed on one, or --timeout passes (exit 2).`,
		Example: `  imagectl status
  imagectl status acme/rhel:9.4 --wait --timeout 30m
  imagectl status acme/rhel:9.4 --hubs hub-a,hub-b -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref := ""
			if len(args) == 1 {
				ref = args[0]
			}
			return runStatus(cmd, o, ref)
		},
	}
	cmd.Flags().StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig naming the hubs (default: $KUBECONFIG, then ~/.kube/config)")
	cmd.Flags().StringSliceVar(&o.hubs, "hubs", nil, "kubeconfig contexts of the hubs to ask (default: every context)")
	cmd.Flags().StringVarP(&o.namespace, "namespace", "n", "", "namespace on every hub (default: each context's namespace)")
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until the image is Ready on every hub (needs an image)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 30*time.Minute, "how long --wait waits")
	addOutputFlag(cmd, &o.out, outputTable, outputJSON, outputYAML)
	return cmd
}

func runStatus(cmd *cobra.Command, o *statusOptions, ref string) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	if ref != "" {
		if _, _, _, err := vmlaunch.ParseImageRef(ref); err != nil {
			return &usageError{err}
		}
	}
	if o.wait && ref == "" {
		return &usageError{errors.New("--wait needs an image: imagectl status TENANT/IMAGE[:TAG] --wait")}
	}
	if !o.wait && cmd.Flags().Changed("timeout") {
		return &usageError{errors.New("--timeout bounds --wait; add --wait")}
	}
	hubs, err := o.hubList()
	if err != nil {
		return err
	}
	rows := o.ask(cmd.Context(), hubs, ref)
	if o.wait {
		if rows, err = o.waitReady(cmd.Context(), hubs, ref, rows); err != nil {
			return err
		}
	}
	if err := o.out.show(cmd.OutOrStdout(), view{data: rows, table: func(w io.Writer, _ bool) error { return statusTable(w, rows) }}); err != nil {
		return err
	}
	if ref == "" {
		if statusCode(rows) == exitError {
			return &reportedError{code: exitError}
		}
		return nil
	}
	if code := statusCode(rows); code != exitOK {
		return &reportedError{code: code}
	}
	return nil
}

// waitReady asks again every 2 s while rows say the image is not Ready on
// every hub yet, until --timeout passes, and returns the last answer. The
// timeout bounds the waiting, not a request under way: a hub answering
// late is not taken for unreachable.
func (o *statusOptions) waitReady(ctx context.Context, hubs []string, ref string, rows []api.ImageOnHub) ([]api.ImageOnHub, error) {
	deadline := time.After(o.timeout)
	for statusCode(rows) == exitNotReady {
		select {
		case <-ctx.Done():
			return nil, ctx.Err() // interrupted
		case <-deadline:
			return rows, nil
		case <-time.After(2 * time.Second):
		}
		rows = o.ask(ctx, hubs, ref)
	}
	return rows, nil
}

// hubList is the contexts to ask: --hubs, else every context, sorted.
func (o *statusOptions) hubList() ([]string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if o.kubeconfig != "" {
		rules.ExplicitPath = o.kubeconfig
	}
	cfg, err := rules.Load()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	for _, h := range o.hubs {
		if _, ok := cfg.Contexts[h]; !ok {
			return nil, &usageError{fmt.Errorf("the kubeconfig has no context %q (it has %s)", h, strings.Join(slices.Sorted(maps.Keys(cfg.Contexts)), ", "))}
		}
	}
	if len(o.hubs) > 0 {
		return o.hubs, nil
	}
	if len(cfg.Contexts) == 0 {
		return nil, errors.New("the kubeconfig names no hub: it has no context")
	}
	return slices.Sorted(maps.Keys(cfg.Contexts)), nil
}

// ask reads the image (every image when ref is "") on each hub, the hubs
// at once.
func (o *statusOptions) ask(ctx context.Context, hubs []string, ref string) []api.ImageOnHub {
	results := make([][]api.ImageOnHub, len(hubs))
	var wg sync.WaitGroup
	for i, h := range hubs {
		wg.Go(func() { results[i] = o.askHub(ctx, h, ref) })
	}
	wg.Wait()
	return slices.Concat(results...)
}

func (o *statusOptions) askHub(ctx context.Context, hub, ref string) []api.ImageOnHub {
	kf := kubeFlags{kubeconfig: o.kubeconfig, context: hub, namespace: o.namespace, requestTimeout: 30 * time.Second}
	unreachable := func(ns string, err error) []api.ImageOnHub {
		return []api.ImageOnHub{{Hub: hub, Namespace: ns, Image: ref, Phase: phaseUnreachable, Message: err.Error()}}
	}
	kc, ns, err := kf.client()
	if err != nil {
		return unreachable(o.namespace, err)
	}
	if ref == "" {
		var list v1alpha1.BaseImageList
		if err := kc.List(ctx, ns, "", &list); err != nil {
			return unreachable(ns, err)
		}
		var rows []api.ImageOnHub
		for i := range list.Items {
			rows = append(rows, imageOnHub(hub, &list.Items[i]))
		}
		return rows
	}
	bi, err := vmlaunch.SyncedImage(ctx, kc, ns, ref)
	if errors.Is(err, vmlaunch.ErrNotSynced) {
		_, repo, tag, _ := vmlaunch.ParseImageRef(ref)
		return []api.ImageOnHub{{Hub: hub, Namespace: ns, Image: repo + ":" + tag, Phase: phaseNotSynced}}
	}
	if err != nil {
		return unreachable(ns, err)
	}
	return []api.ImageOnHub{imageOnHub(hub, bi)}
}

// imageOnHub is what bi says of its image.
func imageOnHub(hub string, bi *v1alpha1.BaseImage) api.ImageOnHub {
	repo := bi.Spec.Repository
	if i := strings.Index(repo, "/"); i >= 0 && strings.ContainsAny(repo[:i], ".:") {
		repo = repo[i+1:] // drop the registry host
	}
	row := api.ImageOnHub{Hub: hub, Namespace: bi.Namespace, Image: repo + ":" + bi.Spec.Tag, Phase: string(bi.Status.Phase), Digest: bi.Status.ImportedDigest}
	if row.Phase == "" {
		row.Phase = string(v1alpha1.PhasePending)
	}
	if row.Digest == "" {
		row.Digest = bi.Status.ObservedDigest
	}
	// The condition that tells the phase's story.
	conds := bi.Status.Conditions
	var c *metav1.Condition
	switch bi.Status.Phase {
	case v1alpha1.PhaseReady:
		c = meta.FindStatusCondition(conds, v1alpha1.ConditionReady)
	case v1alpha1.PhaseRejected:
		c = meta.FindStatusCondition(conds, v1alpha1.ConditionRejected)
	default:
		if c = meta.FindStatusCondition(conds, v1alpha1.ConditionReady); c == nil || c.Status == metav1.ConditionTrue {
			c = meta.FindStatusCondition(conds, v1alpha1.ConditionProgressing)
		}
	}
	if c != nil {
		row.Since = c.LastTransitionTime.UTC().Format(time.RFC3339)
		if bi.Status.Phase != v1alpha1.PhaseReady {
			row.Reason, row.Message = c.Reason, c.Message
		}
	}
	return row
}

// statusCode is the exit code rows call for (see the command's help).
func statusCode(rows []api.ImageOnHub) int {
	code := exitOK
	for _, r := range rows {
		switch r.Phase {
		case phaseUnreachable:
			return exitError
		case string(v1alpha1.PhaseRejected), string(v1alpha1.PhaseFailed):
			code = exitRejected
		case string(v1alpha1.PhaseReady):
		default:
			if code == exitOK {
				code = exitNotReady
			}
		}
	}
	return code
}

func statusTable(w io.Writer, rows []api.ImageOnHub) error {
	return table(func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "HUB\tIMAGE\tPHASE\tDIGEST\tSINCE\tREASON")
		for _, r := range rows {
			digest := r.Digest
			if len(digest) > len("sha256:")+12 {
				digest = digest[:len("sha256:")+12]
			}
			since := "-"
			if t, err := time.Parse(time.RFC3339, r.Since); err == nil {
				since = time.Since(t).Truncate(time.Second).String() + " ago"
			}
			reason := r.Reason
			if r.Message != "" && reason != "" {
				reason += ": "
			}
			reason += r.Message
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Hub, r.Image, r.Phase, orDash(digest), since, orDash(reason))
		}
	})(w)
}
