// Package proto holds the envd protocol definitions (process, filesystem)
// written from E2B's public spec, and the Go code generated from them.
package proto

// The generated code is committed so the build needs no generator. To
// regenerate, install protoc (Debian: protobuf-compiler), protoc-gen-go and
// protoc-gen-connect-go, then run go generate in this directory.
//go:generate protoc -I . -I /usr/include --go_out=. --go_opt=paths=source_relative --connect-go_out=. --connect-go_opt=paths=source_relative process/process.proto filesystem/filesystem.proto
