package intake

import (
	"crypto/subtle"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
)

// WebhookHandler receives registry notifications. Each request must carry
// "Authorization: Bearer TOKEN" (distribution's notification config can
// send it, Harbor's "auth header" and zot's sink credentials too) or, for
// registries that cannot set headers (Quay), a "token" query parameter in
// the webhook URL, which then must be kept as secret as the token; bodies
// are bounded by
// MaxWebhookBody. It answers 401 without the token, 400 for a malformed
// body (nothing is handed on), and 202 once the events are handed to sink.
type WebhookHandler struct {
	// Metrics, when set, counts requests refused and events received.
	Metrics Counter
	token   []byte
	sink    func([]Event)
	logger  *slog.Logger
}

// Counter counts what the webhook handler sees; the hub's Prometheus
// metrics implement it.
type Counter interface {
	// Received counts n valid events from source.
	Received(source string, n int)
	// Refused counts one request refused, with the result "unauthorized"
	// or "malformed"; source is "webhook".
	Refused(source, result string)
}

// NewWebhookHandler returns a handler that checks token and passes valid
// events to sink. An empty token is refused: the endpoint is never open.
func NewWebhookHandler(token string, sink func([]Event), logger *slog.Logger) (*WebhookHandler, error) {
	if token == "" {
		return nil, errors.New("the webhook needs a token")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &WebhookHandler{token: []byte(token), sink: sink, logger: logger}, nil
}

func (h *WebhookHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok && r.Header.Get("Authorization") == "" {
		// Quay cannot send headers: its webhook URL carries the token.
		got, ok = r.URL.Query().Get("token"), r.URL.Query().Has("token")
	}
	if !ok || subtle.ConstantTimeCompare([]byte(got), h.token) != 1 {
		h.logger.Info("webhook refused: bad or missing token", "remote", r.RemoteAddr)
		h.refused("unauthorized")
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxWebhookBody))
	if err != nil {
		http.Error(w, "body too large or unreadable", http.StatusBadRequest)
		return
	}
	events, err := ParseWebhook(r.Header, body)
	if err != nil {
		h.logger.Info("webhook refused", "remote", r.RemoteAddr, "error", err)
		h.refused("malformed")
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if len(events) > 0 {
		if h.Metrics != nil {
			h.Metrics.Received(events[0].Source, len(events))
		}
		h.sink(events)
	}
	w.WriteHeader(http.StatusAccepted)
}

func (h *WebhookHandler) refused(result string) {
	if h.Metrics != nil {
		h.Metrics.Refused("webhook", result)
	}
}
