package node

import "unsafe"

func uintptrOf(p *uint64) uintptr { return uintptr(unsafe.Pointer(p)) }
