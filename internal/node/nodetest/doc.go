// Package nodetest provides Fake, an in-memory node.Agent for testing the
// control plane and its faces without a kernel. It keeps the Agent's
// contract (errdefs classes, state transitions, admission refusing with the
// short resource named) and stores sandbox files on disk under a directory
// the test owns, so large transfers stream instead of living in memory.
//
// Execs run a few built-in programs instead of binaries:
//
//	echo ARGS...    prints ARGS joined by spaces and a newline
//	cat             copies stdin to stdout until EOF
//	err TEXT...     prints TEXT to stderr
//	exit N          exits with code N
//	sleep           runs until signalled (exit 128+signal) or its timeout
//
// Any other program exits 127 with "command not found" on stderr.
package nodetest
