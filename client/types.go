package client

import (
	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/runtime"
)

// Wire types, aliased so SDK users need not (and, outside this module,
// cannot) import the internal packages.
type (
	Sandbox       = node.Sandbox
	SandboxSpec   = node.SandboxSpec
	SandboxStats  = node.SandboxStats
	NetworkPolicy = node.NetworkPolicy
	NetworkRule   = node.NetworkRule
	ExecRequest   = node.ExecRequest
	ExecInfo      = node.ExecInfo
	ExecResult    = runtime.ExecResult
	FileInfo      = node.FileInfo
	NodeInfo      = node.NodeInfo
	Capacity      = node.Capacity

	ImageInfo      = api.ImageInfo
	ImportProgress = api.ImportProgress
	GCResult       = api.GCResult
	ImageStats     = api.ImageStats
	Tenant         = api.Tenant
	Quota          = api.Quota
	Token          = api.Token
)

// Sandbox states and QoS classes, re-exported.
const (
	StateCreating = node.StateCreating
	StateRunning  = node.StateRunning
	StatePaused   = node.StatePaused
	StateDead     = node.StateDead
	StateDeleted  = node.StateDeleted

	QoSLatency  = node.QoSLatency
	QoSStandard = node.QoSStandard
	QoSBatch    = node.QoSBatch
)
