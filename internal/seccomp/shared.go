package seccomp

import "sync"

var sharedFilters sync.Map // Options -> Filter

// SharedDefaultFilter is DefaultFilter built once per Options and shared:
// the program is the same for every sandbox with the same options, and a
// copy per sandbox cost the server ~3.6 kB of heap each. Callers must not
// modify the returned filter.
func SharedDefaultFilter(opts Options) (Filter, error) {
	if f, ok := sharedFilters.Load(opts); ok {
		return f.(Filter), nil
	}
	f, err := DefaultFilter(opts)
	if err != nil {
		return nil, err
	}
	actual, _ := sharedFilters.LoadOrStore(opts, f)
	return actual.(Filter), nil
}
