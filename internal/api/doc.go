// Package api is dsec's control plane: the Service (auth, tenants, quotas,
// placement, audit, lifecycle timers) and its HTTP/JSON face. Other faces
// (the E2B-compatible API in api/e2b) wrap the same Service.
package api
