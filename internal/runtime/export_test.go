package runtime

import "time"

// SpawnerPid is the pid of the runtime's spawner, 0 while none runs.
func SpawnerPid(r *NamespaceRuntime) int { return r.spawner.pid() }

// SetSpawnerPath makes the runtime start its spawner from path (one that
// cannot run tests the fallback to fork and exec). Call it before the
// first create.
func SetSpawnerPath(r *NamespaceRuntime, path string) { r.spawner.path = path }

// SetSpawnTimeout changes how long a request to the spawner may take and
// returns a function that restores it.
func SetSpawnTimeout(d time.Duration) func() {
	old := spawnTimeout
	spawnTimeout = d
	return func() { spawnTimeout = old }
}

// SetSpawnerDieFlag makes the runtime's spawners die between a clone and
// its reply once, when the file path exists: they remove it then. Call it
// before the first create.
func SetSpawnerDieFlag(r *NamespaceRuntime, path string) {
	r.spawner.env = append(r.spawner.env, "_DSEC_SPAWNER_TEST_DIE="+path)
}
