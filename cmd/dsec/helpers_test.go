package main

import (
	"errors"

	"github.com/spf13/pflag"
)

type pflagFlag = pflag.Flag

var errTest = errors.New("test failure")
