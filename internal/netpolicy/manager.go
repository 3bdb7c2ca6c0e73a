package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

const ipForwardPath = "/proc/sys/net/ipv4/ip_forward"

// Manager wires sandboxes to the network under their egress policies. It
// is safe for concurrent use. NewManager touches nothing on the host; the
// table is installed at the first Attach.
type Manager struct {
	cfg  *resolved
	log  *slog.Logger
	refs *tableRefs
	// hostNS is the namespace the Manager was made in, where host links,
	// routes and the table live.
	hostNS netns.NsHandle

	mu      sync.Mutex // guards everything below
	closed  bool
	ready   bool // table installed
	flipped bool // this Manager (or a crashed predecessor) set ip_forward=1
	nl      *netlink.Handle
	nft     *nftables.Conn
	byID    map[string]*attachment
	used    map[uint32]bool
	next    uint32 // allocation cursor: addresses are reused as late as possible
}

// attachment is one wired sandbox.
type attachment struct {
	id      string
	index   uint32
	addr    netip.Addr
	link    string // host end
	chain   *nftables.Chain
	pending bool // Attach in progress
}

// NewManager checks cfg and returns a Manager. It makes no change to the
// host.
func NewManager(cfg Config, logger *slog.Logger) (*Manager, error) {
	r, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("netpolicy: own network namespace: %w", err)
	}
	return &Manager{
		cfg:    r,
		log:    logger.With("component", "netpolicy"),
		refs:   newRefs(r.Table),
		hostNS: h,
		byID:   map[string]*attachment{},
		used:   map[uint32]bool{},
		next:   2, // 0 is the network, 1 the gateway
	}, nil
}

// Subnet returns the subnet sandbox addresses come from.
func (m *Manager) Subnet() netip.Prefix { return m.cfg.Subnet }

// Address returns the sandbox's address, if it is attached.
func (m *Manager) Address(sandboxID string) (netip.Addr, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.byID[sandboxID]
	if !ok || a.pending {
		return netip.Addr{}, false
	}
	return a.addr, true
}

// Validate checks p against this node's presets without changing anything.
func (m *Manager) Validate(p node.NetworkPolicy) error {
	_, err := compilePolicy(p, m.cfg.presets)
	return err
}

// Apply is what the node agent calls for a policy set at create or
// replaced at run time: it updates an attached sandbox, attaches one whose
// policy now allows something, and does nothing (after validating) for an
// unattached sandbox whose policy allows nothing.
func (m *Manager) Apply(ctx context.Context, sandboxID, netnsPath string, p node.NetworkPolicy) error {
	m.mu.Lock()
	_, attached := m.byID[sandboxID]
	m.mu.Unlock()
	if attached {
		return m.Update(ctx, sandboxID, p)
	}
	if !NeedsEgress(p) {
		return m.Validate(p)
	}
	return m.Attach(ctx, sandboxID, netnsPath, p)
}

// Attach gives the sandbox whose network namespace is at netnsPath (such
// as /proc/PID/ns/net) a link to the host under policy p. It fails with
// ErrAlreadyExists if the sandbox is attached, ErrInvalidArgument for a
// bad policy or namespace, ErrResourceExhausted when the subnet is full.
// A stale sandbox link left in the namespace by an earlier server process
// is replaced.
func (m *Manager) Attach(ctx context.Context, sandboxID, netnsPath string, p node.NetworkPolicy) error {
	if sandboxID == "" {
		return invalidf("empty sandbox id")
	}
	if netnsPath == "" {
		return invalidf("sandbox %s: empty network namespace path", sandboxID)
	}
	pol, err := compilePolicy(p, m.cfg.presets)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sandboxID, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	a, err := m.reserve(sandboxID)
	if err != nil {
		return err
	}
	if err := m.plumb(ctx, a, netnsPath); err != nil {
		m.release(a)
		return err
	}
	m.mu.Lock()
	err = m.installChain(a, pol)
	if err == nil {
		a.pending = false
	}
	m.mu.Unlock()
	if err != nil {
		m.unplumb(a)
		m.release(a)
		return err
	}
	m.log.Debug("sandbox attached", "sandbox", sandboxID, "addr", a.addr, "link", a.link,
		"allow", len(pol.Allow), "deny", len(pol.Deny))
	return nil
}

// Update replaces the sandbox's policy in one nftables transaction: the
// next packet it sends is judged by p. ErrNotFound if it is not attached.
func (m *Manager) Update(ctx context.Context, sandboxID string, p node.NetworkPolicy) error {
	pol, err := compilePolicy(p, m.cfg.presets)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sandboxID, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a, err := m.lookupLocked(sandboxID)
	if err != nil {
		return err
	}
	m.nft.FlushChain(a.chain)
	queueSandboxRules(m.nft, m.refs, a.chain, a.addr, pol)
	if err := m.nft.Flush(); err != nil {
		return fmt.Errorf("netpolicy: update sandbox %s: %w", sandboxID, err)
	}
	m.log.Debug("sandbox policy updated", "sandbox", sandboxID, "allow", len(pol.Allow), "deny", len(pol.Deny))
	return nil
}

// Detach removes the sandbox's link and rules. Detaching a sandbox that is
// not attached is not an error (most sandboxes never are).
func (m *Manager) Detach(ctx context.Context, sandboxID string) error {
	m.mu.Lock()
	a, ok := m.byID[sandboxID]
	if !ok || m.closed {
		m.mu.Unlock()
		return nil
	}
	if a.pending {
		m.mu.Unlock()
		return fmt.Errorf("netpolicy: sandbox %s is being attached: %w", sandboxID, errdefs.ErrFailedPrecondition)
	}
	a.pending = true // keeps Update and a second Detach away
	nftErr := m.nft.SetDeleteElements(m.refs.sandboxes, []nftables.SetElement{sandboxElement(a.link, a.chain.Name)})
	if nftErr == nil {
		m.nft.FlushChain(a.chain)
		m.nft.DelChain(a.chain)
		nftErr = m.nft.Flush()
	}
	m.mu.Unlock()

	// The link goes even if the rules could not: without it the sandbox
	// has no way out, and its chain is then unreachable.
	linkErr := m.unplumb(a)
	m.release(a)
	if nftErr != nil {
		return fmt.Errorf("netpolicy: detach sandbox %s: rules: %w", sandboxID, nftErr)
	}
	if linkErr != nil {
		return fmt.Errorf("netpolicy: detach sandbox %s: %w", sandboxID, linkErr)
	}
	m.log.Debug("sandbox detached", "sandbox", sandboxID)
	return nil
}

// Close removes every sandbox link, the table and the host changes this
// Manager made (ip_forward). The Manager cannot be used afterwards.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	var errs []error
	for _, a := range m.byID {
		if err := m.unplumb(a); err != nil {
			errs = append(errs, err)
		}
	}
	m.byID = map[string]*attachment{}
	m.used = map[uint32]bool{}
	if m.ready {
		// Routing off before the filter goes, never the other way round;
		// and only by the last Manager that needs it on.
		if m.flipped && len(markerTables(m.nft, m.cfg.Table)) == 0 {
			if err := os.WriteFile(ipForwardPath, []byte("0\n"), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("netpolicy: restore ip_forward: %w", err))
			}
		}
		m.nft.DelTable(m.refs.table)
		if err := m.nft.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("netpolicy: delete table %s: %w", m.cfg.Table, err))
		}
	}
	if m.nft != nil {
		_ = m.nft.CloseLasting()
	}
	if m.nl != nil {
		m.nl.Close()
	}
	_ = m.hostNS.Close()
	return errors.Join(errs...)
}

func (m *Manager) lookupLocked(id string) (*attachment, error) {
	if m.closed {
		return nil, fmt.Errorf("netpolicy: manager closed: %w", errdefs.ErrUnavailable)
	}
	a, ok := m.byID[id]
	if !ok {
		return nil, fmt.Errorf("netpolicy: sandbox %s has no network attached: %w", id, errdefs.ErrNotFound)
	}
	if a.pending {
		return nil, fmt.Errorf("netpolicy: sandbox %s is being attached or detached: %w", id, errdefs.ErrFailedPrecondition)
	}
	return a, nil
}

// reserve installs the table if needed and allocates an address.
func (m *Manager) reserve(id string) (*attachment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("netpolicy: manager closed: %w", errdefs.ErrUnavailable)
	}
	if _, ok := m.byID[id]; ok {
		return nil, fmt.Errorf("netpolicy: sandbox %s already has a network: %w", id, errdefs.ErrAlreadyExists)
	}
	if err := m.setupLocked(); err != nil {
		return nil, err
	}
	last := m.cfg.size - 2 // size-1 is the broadcast address
	for range last - 1 {
		idx := m.next
		if m.next++; m.next > last {
			m.next = 2
		}
		if m.used[idx] {
			continue
		}
		m.used[idx] = true
		a := &attachment{id: id, index: idx, addr: m.cfg.addrAt(idx), link: m.cfg.linkName(idx), pending: true,
			chain: &nftables.Chain{Name: m.cfg.chainName(idx), Table: m.refs.table}}
		m.byID[id] = a
		return a, nil
	}
	return nil, fmt.Errorf("netpolicy: no free address in %s for sandbox %s: %w", m.cfg.Subnet, id, errdefs.ErrResourceExhausted)
}

func (m *Manager) release(a *attachment) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID[a.id] == a {
		delete(m.byID, a.id)
	}
	delete(m.used, a.index)
}

// installChain adds the sandbox's chain and its map entry in one
// transaction.
func (m *Manager) installChain(a *attachment, pol compiled) error {
	if m.closed {
		return fmt.Errorf("netpolicy: manager closed: %w", errdefs.ErrUnavailable)
	}
	m.nft.AddChain(a.chain)
	queueSandboxRules(m.nft, m.refs, a.chain, a.addr, pol)
	if err := m.nft.SetAddElements(m.refs.sandboxes, []nftables.SetElement{sandboxElement(a.link, a.chain.Name)}); err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: %w", a.id, err)
	}
	if err := m.nft.Flush(); err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: install rules: %w", a.id, err)
	}
	return nil
}

// setupLocked installs the table once: protected set, guard, base chains,
// masquerade; then switches ip_forward on if it was off.
func (m *Manager) setupLocked() error {
	if m.ready {
		return nil
	}
	if m.nl == nil {
		h, err := netlink.NewHandleAt(m.hostNS, unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("netpolicy: netlink: %w", err)
		}
		m.nl = h
	}
	if m.nft == nil {
		c, err := nftables.New(nftables.AsLasting(), nftables.WithNetNSFd(int(m.hostNS)))
		if err != nil {
			return fmt.Errorf("netpolicy: nftables: %w", err)
		}
		m.nft = c
	}
	protect := append([]netip.Prefix{m.cfg.Subnet}, alwaysProtected...)
	protect = append(protect, m.cfg.Protect...)
	addrs, err := m.nl.AddrList(nil, unix.AF_INET)
	if err != nil {
		return fmt.Errorf("netpolicy: list host addresses: %w", err)
	}
	for _, ad := range addrs {
		if ip, ok := netip.AddrFromSlice(ad.IP.To4()); ok {
			protect = append(protect, netip.PrefixFrom(ip, 32))
		}
	}

	cur, err := os.ReadFile(ipForwardPath)
	if err != nil {
		return fmt.Errorf("netpolicy: %w", err)
	}
	forwardOff := strings.TrimSpace(string(cur)) == "0"
	// ip_forward on with a marker table around (another Manager's, or a
	// predecessor's of ours that died before Close) means the host's own
	// setting was off: we share the duty to switch it off again.
	flip := forwardOff || len(markerTables(m.nft, "")) > 0

	if err := queueTable(m.nft, m.cfg, m.refs, protect, flip); err != nil {
		return err
	}
	if err := m.nft.Flush(); err != nil {
		return fmt.Errorf("netpolicy: install table %s: %w", m.cfg.Table, err)
	}
	if forwardOff {
		// After the filter is in place, so nothing is routed unfiltered.
		if err := os.WriteFile(ipForwardPath, []byte("1\n"), 0o644); err != nil {
			m.nft.DelTable(m.refs.table)
			_ = m.nft.Flush()
			return fmt.Errorf("netpolicy: enable ip_forward: %w", err)
		}
	}
	m.flipped = flip
	m.ready = true
	m.log.Info("network policy table installed", "table", m.cfg.Table, "subnet", m.cfg.Subnet,
		"ip_forward_enabled_by_dsec", flip, "protected", len(protect))
	return nil
}
