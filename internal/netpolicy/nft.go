package netpolicy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// Names inside the table.
const (
	chainForward     = "forward"
	chainInput       = "input"
	chainPostrouting = "postrouting"
	chainGuard       = "guard"
	setProtected     = "protected"
	mapSandboxes     = "sandboxes"

	// forwardMarker is the comment on the forward rule that exists only
	// when this package switched ip_forward on: it survives a crash in the
	// kernel, so the next Manager knows to switch it off again.
	forwardMarker = "dsec:restore-ip_forward=0"
)

// alwaysProtected are destinations no sandbox reaches, besides the
// subnet, the host's addresses and Config.Protect.
var alwaysProtected = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"), // link-local, cloud metadata
	netip.MustParsePrefix("224.0.0.0/4"),    // multicast
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved and limited broadcast
}

// Linux route types as nft's fib expression returns them.
const (
	rtnLocal     = 2
	rtnBroadcast = 3
	rtnMulticast = 5
)

type tableRefs struct {
	table     *nftables.Table
	guard     *nftables.Chain
	forward   *nftables.Chain
	input     *nftables.Chain
	sandboxes *nftables.Set
	protected *nftables.Set
}

func newRefs(name string) *tableRefs {
	t := &nftables.Table{Name: name, Family: nftables.TableFamilyINet}
	return &tableRefs{
		table:   t,
		guard:   &nftables.Chain{Name: chainGuard, Table: t},
		forward: &nftables.Chain{Name: chainForward, Table: t},
		input:   &nftables.Chain{Name: chainInput, Table: t},
		// Host byte order is what nft(8) needs to print ifname keys.
		sandboxes: &nftables.Set{Table: t, Name: mapSandboxes, IsMap: true, KeyType: nftables.TypeIFName,
			DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian},
		protected: &nftables.Set{Table: t, Name: setProtected, Interval: true, KeyType: nftables.TypeIPAddr},
	}
}

// queueTable queues, on c, the atomic replacement of the whole table:
// every sandbox chain that existed is gone afterwards, and sandbox links
// not re-attached hit the fail-closed reject.
func queueTable(c *nftables.Conn, r *resolved, refs *tableRefs, protect []netip.Prefix, dropOtherForwarding bool) error {
	t := refs.table
	// Add-then-delete makes the delete succeed whether or not the table
	// existed; all of it is one transaction.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)

	if err := c.AddSet(refs.protected, intervalElements(protect)); err != nil {
		return fmt.Errorf("netpolicy: protected set: %w", err)
	}
	if err := c.AddSet(refs.sandboxes, nil); err != nil {
		return fmt.Errorf("netpolicy: sandbox map: %w", err)
	}

	// guard: exceptions return to the sandbox's chain (its policy decides),
	// protected destinations are rejected, anything else returns.
	c.AddChain(refs.guard)
	for _, m := range r.exceptions {
		c.AddRule(&nftables.Rule{Table: t, Chain: refs.guard, Exprs: append(matchExprs(m), &expr.Verdict{Kind: expr.VerdictReturn})})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: refs.guard, Exprs: append(daddrLoad(),
		&expr.Lookup{SourceRegister: 1, SetName: refs.protected.Name, SetID: refs.protected.ID},
		rejectAdmin())})
	for _, typ := range []uint32{rtnLocal, rtnBroadcast, rtnMulticast} {
		c.AddRule(&nftables.Rule{Table: t, Chain: refs.guard, Exprs: []expr.Any{
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(typ)},
			rejectAdmin(),
		}})
	}

	accept := nftables.ChainPolicyAccept
	c.AddChain(&nftables.Chain{Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddChain(&nftables.Chain{Name: chainInput, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})

	pfx := []byte(r.LinkPrefix) // compared without the NUL: a prefix match
	// forward: only replies go into a sandbox; nothing opens a connection
	// to one (another sandbox included).
	c.AddRule(&nftables.Rule{Table: t, Chain: refs.forward, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: pfx},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: refs.forward, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: pfx},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	for _, ch := range []*nftables.Chain{refs.forward, refs.input} {
		// From a sandbox: to its chain, or rejected if it has none.
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: pfx},
			&expr.Lookup{SourceRegister: 1, SetName: refs.sandboxes.Name, SetID: refs.sandboxes.ID, DestRegister: 0, IsDestRegSet: true},
		}})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: pfx},
			rejectAdmin(),
		}})
	}
	if dropOtherForwarding {
		// The host did not route before dsec switched ip_forward on; keep
		// it that way for everything but sandbox traffic — of every dsec
		// Manager on the host, which all tag their links with LinkGroup.
		c.AddRule(&nftables.Rule{Table: t, Chain: refs.forward,
			UserData: userdata.AppendString(nil, userdata.TypeComment, forwardMarker),
			Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
				&expr.Meta{Key: expr.MetaKeyIIFGROUP, Register: 1},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(LinkGroup)},
				&expr.Meta{Key: expr.MetaKeyOIFGROUP, Register: 1},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(LinkGroup)},
				&expr.Verdict{Kind: expr.VerdictDrop},
			}})
	}

	if !r.DisableMasquerade {
		post := c.AddChain(&nftables.Chain{Name: chainPostrouting, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
		c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: append(append([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}},
			prefixExprs(r.Subnet, 12)...),
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: pfx},
			&expr.Masq{})})
	}
	return nil
}

// queueSandbox queues the sandbox chain's rules (the chain itself must
// exist or be queued, and be empty or flushed).
func queueSandboxRules(c *nftables.Conn, refs *tableRefs, chain *nftables.Chain, addr netip.Addr, pol compiled) {
	t := refs.table
	add := func(e ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: e}) }
	add(&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Verdict{Kind: expr.VerdictDrop})
	a := addr.As4()
	add(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: a[:]},
		&expr.Verdict{Kind: expr.VerdictDrop})
	add(&expr.Verdict{Kind: expr.VerdictJump, Chain: chainGuard})
	for _, m := range pol.Deny {
		add(append(matchExprs(m), rejectAdmin())...)
	}
	for _, m := range pol.Allow {
		add(append(matchExprs(m), &expr.Verdict{Kind: expr.VerdictAccept})...)
	}
	add(rejectAdmin())
}

func sandboxElement(link, chain string) nftables.SetElement {
	return nftables.SetElement{Key: ifnameKey(link), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func ifnameKey(name string) []byte {
	k := make([]byte, unix.IFNAMSIZ)
	copy(k, name)
	return k
}

func rejectAdmin() expr.Any {
	return &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}
}

func daddrLoad() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}}
}

// prefixExprs matches the IPv4 address at network-header offset off
// (12 source, 16 destination) against p; nothing for /0.
func prefixExprs(p netip.Prefix, off uint32) []expr.Any {
	if p.Bits() == 0 {
		return nil
	}
	e := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}}
	if p.Bits() < 32 {
		mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
		e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)})
	}
	a := p.Addr().As4()
	return append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]})
}

// matchExprs is the match part of a rule for m (no verdict).
func matchExprs(m match) []expr.Any {
	e := prefixExprs(m.Prefix, 16)
	if m.Proto != protoAny {
		e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{m.Proto}})
	}
	if m.PortLo != 0 {
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
		if m.PortLo == m.PortHi {
			e = append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(m.PortLo)})
		} else {
			e = append(e, &expr.Range{Op: expr.CmpOpEq, Register: 1,
				FromData: binaryutil.BigEndian.PutUint16(m.PortLo), ToData: binaryutil.BigEndian.PutUint16(m.PortHi)})
		}
	}
	return e
}

// intervalElements encodes prefixes as an nftables interval set the way
// nft(8) does: merged, sorted [start, end+1) pairs, a leading end marker
// at 0.0.0.0 when the first range starts later, and no end element for a
// range reaching 255.255.255.255.
func intervalElements(ps []netip.Prefix) []nftables.SetElement {
	type rng struct{ lo, hi uint64 } // hi exclusive
	var rs []rng
	for _, p := range ps {
		p = p.Masked()
		a := p.Addr().As4()
		lo := uint64(binary.BigEndian.Uint32(a[:]))
		rs = append(rs, rng{lo, lo + 1<<(32-p.Bits())})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	var merged []rng
	for _, r := range rs {
		if n := len(merged); n > 0 && r.lo <= merged[n-1].hi {
			merged[n-1].hi = max(merged[n-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	key := func(v uint64) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
	var els []nftables.SetElement
	if len(merged) > 0 && merged[0].lo != 0 {
		els = append(els, nftables.SetElement{Key: key(0), IntervalEnd: true})
	}
	for _, r := range merged {
		els = append(els, nftables.SetElement{Key: key(r.lo)})
		if r.hi <= 0xffffffff {
			els = append(els, nftables.SetElement{Key: key(r.hi), IntervalEnd: true})
		}
	}
	return els
}

// markerTables lists the inet tables, other than skip, whose forward
// chain carries the marker: those of live dsec Managers that switched
// ip_forward on, or of one that died. While one exists, the host's own
// setting was off and ip_forward must stay on. Unreadable tables or chains
// count as unmarked.
func markerTables(c *nftables.Conn, skip string) []string {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil
	}
	var out []string
	for _, t := range tables {
		if t.Name == skip {
			continue
		}
		rules, err := c.GetRules(t, &nftables.Chain{Name: chainForward, Table: t})
		if err != nil {
			continue
		}
		for _, r := range rules {
			if s, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && s == forwardMarker {
				out = append(out, t.Name)
				break
			}
		}
	}
	return out
}
