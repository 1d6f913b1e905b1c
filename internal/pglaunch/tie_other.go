//go:build !linux

package pglaunch

import "syscall"

// tie does nothing: only Linux has a parent-death signal.
func tie(*syscall.SysProcAttr, syscall.Signal) {}
