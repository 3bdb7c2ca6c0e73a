package e2b

import (
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/node"
)

func TestRESTAuth(t *testing.T) {
	e := newEnv(t)
	good := e.key("alice")
	for _, tc := range []struct {
		name, key string
		want      int
	}{
		{"no key", "", http.StatusUnauthorized},
		{"malformed key", "e2b_zz", http.StatusUnauthorized},
		{"unknown key", "e2b_" + strings.Repeat("ab", 32), http.StatusUnauthorized},
		{"good key", good, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := e.do("GET", "/v2/sandboxes", tc.key, nil, nil); got != tc.want {
				t.Fatalf("status %d, want %d", got, tc.want)
			}
		})
	}
}

func TestCreateGetListKill(t *testing.T) {
	e := newEnv(t)
	alice, bob := e.key("alice"), e.key("bob")
	sb := e.create(alice, map[string]any{
		"timeout": 60, "metadata": map[string]string{"run": "r1"}, "envVars": map[string]string{"A": "1"},
	})
	if sb.SandboxID == "" || sb.EnvdVersion != EnvdVersion || !strings.HasPrefix(sb.EnvdAccessToken, "ea_") || sb.TemplateID != "base" || sb.ClientID != "node1" {
		t.Fatalf("create reply: %+v", sb)
	}
	var d sandboxDetail
	if code := e.do("GET", "/sandboxes/"+sb.SandboxID, alice, nil, &d); code != http.StatusOK {
		t.Fatalf("get: %d", code)
	}
	if d.State != node.StateRunning || d.Metadata["run"] != "r1" || len(d.Metadata) != 1 || d.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("detail: %+v", d)
	}
	if left := time.Until(d.EndAt); left < 50*time.Second || left > 61*time.Second {
		t.Fatalf("endAt %v is %v away, want about 60s", d.EndAt, left)
	}
	spec, err := e.node.GetSandbox(t.Context(), sb.SandboxID)
	if err != nil || !reflect.DeepEqual(spec.Spec.Env, []string{"A=1"}) || spec.Spec.MaxLifetime != time.Minute {
		t.Fatalf("node spec: %+v %v", spec, err)
	}
	// Another tenant sees nothing of it.
	if code := e.do("GET", "/sandboxes/"+sb.SandboxID, bob, nil, nil); code != http.StatusNotFound {
		t.Fatalf("bob get: %d", code)
	}
	if code := e.do("DELETE", "/sandboxes/"+sb.SandboxID, bob, nil, nil); code != http.StatusNotFound {
		t.Fatalf("bob kill: %d", code)
	}
	var list []sandboxDetail
	e.do("GET", "/v2/sandboxes?metadata="+url.QueryEscape("run=r1"), alice, nil, &list)
	if len(list) != 1 || list[0].SandboxID != sb.SandboxID || list[0].EnvdAccessToken != "" {
		t.Fatalf("list by metadata: %+v", list)
	}
	// The SDK encodes each key and value, then the pairs, then the query.
	sdkMetadata := func(k, v string) string {
		enc := func(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "+", "%20") }
		return "?metadata=" + url.QueryEscape(url.Values{enc(k): {enc(v)}}.Encode())
	}
	odd := e.create(alice, map[string]any{"metadata": map[string]string{"a b&c": "x=y %z"}})
	e.do("GET", "/v2/sandboxes"+sdkMetadata("a b&c", "x=y %z"), alice, nil, &list)
	if len(list) != 1 || list[0].SandboxID != odd.SandboxID {
		t.Fatalf("list by metadata with special characters: %+v", list)
	}
	e.do("GET", "/v2/sandboxes?metadata="+url.QueryEscape("run=other"), alice, nil, &list)
	if len(list) != 0 {
		t.Fatalf("list by other metadata: %+v", list)
	}
	e.do("GET", "/v2/sandboxes", bob, nil, &list)
	if len(list) != 0 {
		t.Fatalf("bob lists: %+v", list)
	}
	if code := e.do("DELETE", "/sandboxes/"+odd.SandboxID, alice, nil, nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}
	if code := e.do("DELETE", "/sandboxes/"+sb.SandboxID, alice, nil, nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}
	if code := e.do("DELETE", "/sandboxes/"+sb.SandboxID, alice, nil, nil); code != http.StatusNotFound {
		t.Fatalf("kill again: %d (the SDK's kill() returns false on 404)", code)
	}
	if e.node.Has(sb.SandboxID) {
		t.Fatal("the sandbox is still on the node")
	}
}

func TestCreateBadInput(t *testing.T) {
	e := newEnv(t)
	key := e.key("alice")
	for _, tc := range []struct {
		name string
		body any
		want int
	}{
		{"not json", "{", http.StatusBadRequest},
		{"no template", map[string]any{}, http.StatusBadRequest},
		{"unknown template", map[string]any{"templateID": "nope"}, http.StatusNotFound},
		{"bad template name", map[string]any{"templateID": "UPPER case"}, http.StatusBadRequest},
		{"negative timeout", map[string]any{"templateID": "base", "timeout": -1}, http.StatusBadRequest},
		{"autoPause", map[string]any{"templateID": "base", "autoPause": true}, http.StatusNotImplemented},
		{"mcp", map[string]any{"templateID": "base", "mcp": map[string]any{"x": 1}}, http.StatusNotImplemented},
		{"volumes", map[string]any{"templateID": "base", "volumeMounts": []any{map[string]string{"name": "v", "path": "/v"}}}, http.StatusNotImplemented},
		{"reserved metadata", map[string]any{"templateID": "base", "metadata": map[string]string{labelAccessToken: "x"}}, http.StatusBadRequest},
		{"bad env name", map[string]any{"templateID": "base", "envVars": map[string]string{"A=B": "x"}}, http.StatusBadRequest},
		{"domain in allowOut", map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"example.com"}}}, http.StatusBadRequest},
		{"ipv6 in denyOut", map[string]any{"templateID": "base", "allow_internet_access": true, "network": map[string]any{"denyOut": []string{"::1"}}}, http.StatusBadRequest},
		{"allow inside deny", map[string]any{"templateID": "base", "allow_internet_access": true, "network": map[string]any{"denyOut": []string{"10.0.0.0/8"}, "allowOut": []string{"10.1.2.3"}}}, http.StatusBadRequest},
		{"request transforms", map[string]any{"templateID": "base", "network": map[string]any{"rules": map[string]any{"example.com": []any{map[string]any{}}}}}, http.StatusNotImplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := e.do("POST", "/sandboxes", key, tc.body, nil); got != tc.want {
				t.Fatalf("status %d, want %d", got, tc.want)
			}
		})
	}
	// Nothing was created by the refused requests.
	if n := e.node.Len(); n != 0 {
		t.Fatalf("%d sandboxes on the node", n)
	}
}

func TestNetworkPolicy(t *testing.T) {
	yes, no := true, false
	all := []node.NetworkRule{{CIDR: allTraffic}}
	for _, tc := range []struct {
		name     string
		internet *bool
		net      *networkConfig
		want     node.NetworkPolicy
	}{
		{"unset: dsec default deny", nil, nil, node.NetworkPolicy{}},
		{"internet off", &no, nil, node.NetworkPolicy{}},
		{"internet on", &yes, nil, node.NetworkPolicy{Allow: all}},
		{"allow list only", nil, &networkConfig{AllowOut: []string{"1.2.3.4", "10.0.0.0/8"}},
			node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "1.2.3.4/32"}, {CIDR: "10.0.0.0/8"}}}},
		{"deny all but", &yes, &networkConfig{DenyOut: []string{allTraffic}, AllowOut: []string{"8.8.8.8"}},
			node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "8.8.8.8/32"}}}},
		{"internet minus a range", &yes, &networkConfig{DenyOut: []string{"10.0.0.0/8"}},
			node.NetworkPolicy{Allow: all, Deny: []node.NetworkRule{{CIDR: "10.0.0.0/8"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := networkPolicy(tc.internet, tc.net)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestTimeoutPauseConnect(t *testing.T) {
	e := newEnv(t)
	key := e.key("alice")
	sb := e.create(key, nil)
	path := "/sandboxes/" + sb.SandboxID
	var d sandboxDetail
	e.do("GET", path, key, nil, &d)
	if left := time.Until(d.EndAt); left > defaultTimeout+time.Second || left < defaultTimeout-5*time.Second {
		t.Fatalf("default timeout: endAt %v away, want %v", left, defaultTimeout)
	}
	for _, tc := range []struct {
		body string
		want int
	}{
		{`{}`, http.StatusBadRequest},
		{`{"timeout":0}`, http.StatusBadRequest},
		{`{"timeout":-5}`, http.StatusBadRequest},
		{`{"timeout":"x"}`, http.StatusBadRequest},
		{`{"timeout":600}`, http.StatusNoContent},
	} {
		if got := e.do("POST", path+"/timeout", key, tc.body, nil); got != tc.want {
			t.Fatalf("timeout %s: %d, want %d", tc.body, got, tc.want)
		}
	}
	e.do("GET", path, key, nil, &d)
	if left := time.Until(d.EndAt); left < 590*time.Second || left > 601*time.Second {
		t.Fatalf("after setTimeout(600): endAt %v away", left)
	}
	if code := e.do("POST", path+"/pause", key, nil, nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	if code := e.do("POST", path+"/pause", key, nil, nil); code != http.StatusConflict {
		t.Fatalf("pause again: %d (the SDK's pause() returns false on 409)", code)
	}
	// connect resumes a paused sandbox and does not shorten its lifetime.
	var r sandboxReply
	if code := e.do("POST", "/v2"+path+"/connect", key, `{"timeout":10}`, &r); code != http.StatusCreated {
		t.Fatalf("connect: %d", code)
	}
	if r.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("connect returned another access token")
	}
	e.do("GET", path, key, nil, &d)
	if d.State != node.StateRunning || time.Until(d.EndAt) < 500*time.Second {
		t.Fatalf("after connect: %+v", d)
	}
	if code := e.do("POST", "/sandboxes/nope/connect", key, `{"timeout":10}`, nil); code != http.StatusNotFound {
		t.Fatalf("connect to a missing sandbox: %d", code)
	}
}

func TestListPagination(t *testing.T) {
	e := newEnv(t)
	key := e.key("alice")
	want := map[string]bool{}
	for range 5 {
		want[e.create(key, nil).SandboxID] = true
	}
	seen := map[string]bool{}
	next := ""
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("pagination does not end")
		}
		q := "?limit=2"
		if next != "" {
			q += "&nextToken=" + url.QueryEscape(next)
		}
		req, _ := http.NewRequest("GET", e.srv.URL+"/v2/sandboxes"+q, nil)
		req.Header.Set("X-API-KEY", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var list []sandboxDetail
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(list) > 2 {
			t.Fatalf("page of %d", len(list))
		}
		for _, s := range list {
			if seen[s.SandboxID] {
				t.Fatalf("%s listed twice", s.SandboxID)
			}
			seen[s.SandboxID] = true
		}
		next = resp.Header.Get("X-Next-Token")
		if next == "" {
			break
		}
	}
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("listed %v, want %v", seen, want)
	}
	for _, q := range []string{"?limit=0", "?limit=x", "?state=dead", "?nextToken=" + url.QueryEscape("!!"), "?metadata=" + url.QueryEscape("a=1&a=2"), "?metadata=" + url.QueryEscape("a=%25zz")} {
		if code := e.do("GET", "/v2/sandboxes"+q, key, nil, nil); code != http.StatusBadRequest {
			t.Fatalf("list %s: %d, want 400", q, code)
		}
	}
}

func TestUnknownRoute(t *testing.T) {
	e := newEnv(t)
	if code := e.do("GET", "/templates", e.key("alice"), nil, nil); code != http.StatusNotFound {
		t.Fatalf("unknown route: %d", code)
	}
}
